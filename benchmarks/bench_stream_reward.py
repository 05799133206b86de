"""Streamed reward (``reward.launch_reward_fn_async`` in ``rollout.mode=async``) vs scoring after the rollout.

One megarl ``RolloutWorker`` engine (``bench_async_rollout``'s random Qwen2 shape, float32 on CPU), single-turn
samples with skewed lengths (``--long-frac`` of them ``--long`` tokens, the rest ``--short``; ``ignore_eos``),
a scorer that takes ``--score-s`` seconds per sample (a stand-in for a slow verifier or sandbox; run in the
reward manager's scoring process, as in training). Alternating, median of ``--repeats``:

* ``after``: ``AsyncEngine.run`` of every sample, then the reward manager scores the batch (the trainer's
  reward phase without the key);
* ``streamed``: each sample's coroutine wrapped in ``StreamingReward.scored`` (what the rollout worker does
  with the key): a sample is scored as soon as it finishes, while the long ones still generate.

Prints both wall times (generation + scoring) and ``after / streamed`` (> 1: streaming is faster).

    python benchmarks/bench_stream_reward.py        # CPU defaults, ~2 min on 2 busy cores
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

SCORER = """import time
def compute_score(data_source, solution_str, ground_truth, extra_info):
    time.sleep({seconds})
    return float(len(solution_str))
"""


class IdsText:
    """Decodes token ids to their numbers (the random model has no tokenizer; the text only feeds the scorer)."""

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


def main() -> None:
    from bench_async_rollout import build_model, lengths, make_worker, params
    from megarl.agent.base import AgentLoopOutput
    from megarl.reward.managers import RewardSpec, make_reward_manager
    from megarl.reward.streaming import StreamingReward

    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--short", type=int, default=16)
    parser.add_argument("--long", type=int, default=128)
    parser.add_argument("--long-frac", type=float, default=0.125)
    parser.add_argument("--score-s", type=float, default=0.05)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    args.turns, args.obs = 1, 0  # make_worker sizes the engine from these

    with tempfile.TemporaryDirectory() as tmp:
        worker = make_worker(build_model(tmp + "/model", 512), args)
        scorer = Path(tmp) / "scorer.py"
        scorer.write_text(SCORER.format(seconds=args.score_s))
        spec = RewardSpec("naive", 60.0, "data_source", {"path": str(scorer), "name": "compute_score"}, None,
                          processes=1, phase_timeout_s=120.0, skip_unscored=False)
        manager = make_reward_manager(spec, IdsText())
        stream = StreamingReward(spec, IdsText(), args.long)
        manager.start()
        stream.manager.start()
        engine = worker.async_engine
        prompts = [[(i * 7 + j) % 500 + 2 for j in range(args.prompt)] for i in range(args.samples)]
        sample = {"data_source": "bench", "reward_model": {"ground_truth": "x"}, "extra_info": {}}

        async def one(prompt, n):
            out = await engine.generate(prompt, params(n))
            return AgentLoopOutput(prompt, out.token_ids, [1] * len(out.token_ids), out.log_probs, num_turns=2)

        def after() -> list[float]:
            outs = engine.run([one(p, n) for p, n in zip(prompts, lengths(args))])
            rows = [manager.row("bench", IdsText().decode(o.response_ids), sample["reward_model"], {}) for o in outs]
            return [o.value for o in manager.pool.run(rows)]

        def streamed() -> list[float]:
            stream.start_batch()
            results = engine.run([stream.scored(one(p, n), sample) for p, n in zip(prompts, lengths(args))])
            return [outcome.value for _, _, outcome in results]

        engine.run([one(p, 4) for p in prompts[:4]])  # warm-up
        times: dict[str, list[float]] = {"after": [], "streamed": []}
        for _ in range(args.repeats):
            for name, fn in (("after", after), ("streamed", streamed)):
                start = time.perf_counter()
                scores = fn()
                times[name].append(time.perf_counter() - start)
                assert len(scores) == args.samples and all(s is not None for s in scores)
        manager.close()
        stream.close()
        worker.shutdown()
    result = {name: statistics.median(t) for name, t in times.items()}
    result["after_over_streamed"] = result["after"] / result["streamed"]
    print(json.dumps({"args": vars(args), "runs": times, **result}, indent=1))
    print(f"after {result['after']:.2f} s, streamed {result['streamed']:.2f} s, after / streamed {result['after_over_streamed']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "runs": times, **result}, indent=1))


if __name__ == "__main__":
    main()
