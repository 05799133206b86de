"""rollout.mode / multi-turn / agent-loop config rules."""

from __future__ import annotations

from omegaconf import OmegaConf

from config_testing import issue_for, no_issues

R = "actor_rollout_ref.rollout"


def test_multi_turn_needs_async_and_runs_at_any_rollout_tp(make, tmp_path):
    tools = tmp_path / "tools.yaml"
    tools.write_text("tools: []\n")
    base = {f"{R}.tensor_model_parallel_size": 1, f"{R}.multi_turn.tool_config_path": str(tools)}
    no_issues(make({**base, f"{R}.multi_turn.enable": True}))
    issue_for(make({**base, f"{R}.multi_turn.enable": True, f"{R}.mode": "sync"}), f"{R}.multi_turn.enable",
              "rollout.mode=async", f"set {R}.mode=async")
    tp2 = {**base, f"{R}.tensor_model_parallel_size": 2, "trainer.n_gpus_per_node": 2}
    loops = tmp_path / "loops.yaml"
    loops.write_text("[]\n")
    no_issues(make(tp2))  # single-turn async
    # multi-turn and custom loops: the TP group's first rank drives them, the others mirror its engine
    no_issues(make({**tp2, f"{R}.multi_turn.enable": True, f"{R}.agent.agent_loop_config_path": str(loops)}))
    issue_for(make({**tp2, f"{R}.multi_turn.enable": True, f"{R}.mode": "sync"}), f"{R}.multi_turn.enable",
              "rollout.mode=async")
    issue_for(make({**base, f"{R}.agent.agent_loop_config_path": str(tmp_path / "none.yaml")}),
              f"{R}.agent.agent_loop_config_path", "file does not exist")
    issue_for(make({**base, f"{R}.multi_turn.format": "xml"}), f"{R}.multi_turn.format", "hermes")
    issue_for(make({**base, f"{R}.multi_turn.tool_timeout_s": 0}), f"{R}.multi_turn.tool_timeout_s")


def test_tools_calculator_is_one_override(monkeypatch, tmp_path):
    """`+tools=calculator` (megarl/configs/megatron/tools/calculator.yaml) turns the demo into a tool-agent run
    on the demo's tool task (profiles/demo_tools.yaml over demo.yaml); its relative tool_config_path resolves
    against the checkout from any working directory. With a model path none of the demo's values apply."""
    from megarl.config import collect_issues, load_config

    monkeypatch.setenv("MEGARL_DEMO_DIR", str(tmp_path))
    cfg = load_config(["+tools=calculator"])
    rollout = cfg.actor_rollout_ref.rollout
    assert (rollout.mode, rollout.multi_turn.enable, rollout.agent.default_agent_loop) == ("async", True, "tool_agent")
    # the only issues: the tool task's assets are not built yet (main_ppo builds them before validating)
    assert {i.key for i in collect_issues(cfg)} <= {"data.train_files", "data.val_files", "actor_rollout_ref.model.path"}
    from megarl.agent.tools import load_tools

    assert list(load_tools(rollout.multi_turn.tool_config_path)) == ["calculator"]
    assert cfg.actor_rollout_ref.model.path == f"{tmp_path}/tool_model"
    assert (cfg.data.train_files, cfg.data.val_files) == (f"{tmp_path}/tool_train.parquet", f"{tmp_path}/tool_val.parquet")
    assert (cfg.data.max_response_length, cfg.trainer.experiment_name) == (24, "demo_tools_grpo")
    assert load_config([])["data"]["max_response_length"] == 4  # the plain demo keeps its own task

    own = load_config(["+tools=calculator", "actor_rollout_ref.model.path=/my/model"])
    plain = load_config(["actor_rollout_ref.model.path=/my/model"])
    for key in ("data.train_files", "data.max_response_length", "data.train_batch_size", "actor_rollout_ref.actor.optim.lr",
                "trainer.experiment_name", "trainer.total_training_steps"):
        assert OmegaConf.select(own, key) == OmegaConf.select(plain, key), key
