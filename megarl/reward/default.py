"""``default_compute_score``: the built-in scorer chosen by a row's ``data_source``."""

from __future__ import annotations

from typing import Any

from megarl.reward import demo_task, demo_tool_task, gsm8k, math_boxed

GSM8K_SOURCES = ("openai/gsm8k", "gsm8k")
MATH_SOURCES = (
    "lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500", "math",
    "math_dapo", "numina_aops_forum", "numina_synthetic_math", "numina_amc_aime",
    "numina_synthetic_amc", "numina_cn_k12", "numina_olympiads",
)


def known_data_sources() -> tuple[str, ...]:
    return (demo_task.DATA_SOURCE,) + GSM8K_SOURCES + MATH_SOURCES + (demo_tool_task.DATA_SOURCE,)


def default_compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None
) -> float:
    """Score one decoded response with the rule scorer for ``data_source``.

    Raises ValueError naming the data source and the known ones when none matches (point
    ``reward.custom_reward_function.path`` at your own scorer for other data).
    """
    del extra_info
    if ground_truth is None:  # str(None) == "None" would be scored as the expected answer
        raise ValueError(
            f"ground_truth is None for data_source={data_source!r}: the row has no reward_model.ground_truth; "
            "fill it in the data (preflight lists such rows)"
        )
    if data_source == demo_task.DATA_SOURCE:
        return demo_task.compute_score(solution_str, str(ground_truth))
    if data_source == demo_tool_task.DATA_SOURCE:
        return demo_tool_task.compute_score(solution_str, str(ground_truth))
    if data_source in GSM8K_SOURCES:
        return gsm8k.compute_score(solution_str, str(ground_truth))
    if data_source in MATH_SOURCES or str(data_source).startswith("aime"):
        return math_boxed.compute_score(solution_str, str(ground_truth))
    raise ValueError(
        f"no built-in reward function for data_source={data_source!r} (known: {list(known_data_sources())}); "
        "set reward.custom_reward_function.path / name to score it"
    )
