"""Rank body of the agent-loop test at rollout TP = 2 (spawned by run_distributed)."""

from __future__ import annotations

from typing import Any


def tool_batch_at_rollout_tp2(hf_dir: str, overrides: dict[str, Any], prompt_length: int, response_length: int,
                              batch: Any, tool: str) -> dict[str, Any]:
    """One RolloutWorker per rank, both ranks one rollout TP = 2 replica (vLLM's external_launcher), every
    model turn calling ``tool``; a greedy batch. Returns the rank's batch (responses, response_mask,
    ``__num_turns__``) and what ITS engine finished, request id -> token ids (the follower's engine
    runs the leader's operations, so they must agree)."""
    import torch.distributed as dist
    from safetensors.torch import load_file

    import agent_fixtures as fx
    from helpers.tiny_hf import actor_rollout_ref_config

    from megarl.workers.rollout import RolloutWorker

    dist.init_process_group("gloo")
    fx.CallsTool.tool = tool
    cfg = actor_rollout_ref_config(hf_dir, prompt_length, response_length,
                                   **{**overrides, "rollout.tensor_model_parallel_size": 2})
    worker = RolloutWorker(cfg, hf_dir)
    worker.update_weights(load_file(f"{hf_dir}/model.safetensors").items())
    engine, finished = worker.llm.llm_engine, {}
    step = engine.step

    def recording_step():
        outputs = step()
        finished.update({o.request_id: list(o.outputs[0].token_ids) for o in outputs if o.finished})
        return outputs

    engine.step = recording_step
    try:
        out = worker.generate_sequences(batch, validate=False, do_sample=False)
    finally:
        worker.shutdown()
    return {"leads": worker.tp_channel.leads, "finished": finished,
            "responses": out.batch["responses"].clone(), "response_mask": out.batch["response_mask"].clone(),
            "num_turns": out.non_tensor_batch["__num_turns__"].tolist(), "metrics": out.meta_info["metrics"]}
