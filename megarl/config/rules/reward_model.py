"""Rules of the learned reward model (`reward.reward_model`, megarl.workers.reward_model).

verl 0.9.1 serves the reward model with vLLM (`/classify`) and reads its score as the score head's
raw output at the last token; megarl computes the same with a forward-only Megatron-Core worker
whose layout and batches come from verl's `rollout.*` keys (see the yaml's comments).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from omegaconf import OmegaConf

from megarl.config.errors import Issue
from megarl.config.rules.model import kv_heads_split, model_dir
from megarl.config.rules.roles import RM_ROLE
from megarl.config.rules.view import View, needs_files

RM = "reward.reward_model"


def reward_model(v: View) -> Iterator[Issue]:
    if not v.get(f"{RM}.enable"):
        return
    if OmegaConf.is_missing(OmegaConf.select(v.cfg, f"{RM}.rollout"), "name"):  # other values than vllm: verl_compat.accepted_keys
        yield Issue(f"{RM}.rollout.name", "???", f"{RM}.enable needs the engine named (verl: mandatory)",
                    f"set {RM}.rollout.name=vllm (megarl computes vLLM's /classify score on Megatron-Core)")
    if v.get("reward.custom_reward_function.path") is not None:
        yield Issue(f"{RM}.enable", True,
                    "with reward.custom_reward_function.path verl scores with that function alone, which reaches the "
                    "reward model over its HTTP router (a generative RM); megarl serves no such router",
                    f"unset reward.custom_reward_function.path (the reward model's score is then the reward), or set {RM}.enable=false")
    if v.get("reward.launch_reward_fn_async"):
        yield Issue("reward.launch_reward_fn_async", True,
                    f"with {RM}.enable the reward model's score replaces the rule reward: there is no rule scoring to run in the background",
                    "set reward.launch_reward_fn_async=false")
    tp, pp = v.get(f"{RM}.rollout.tensor_model_parallel_size"), v.get(f"{RM}.rollout.pipeline_model_parallel_size")
    world = v.world_size()
    if world % (tp * pp):
        yield Issue(f"{RM}.rollout.tensor_model_parallel_size", tp,
                    f"tp={tp} x pp={pp} does not divide the trainer world of {world} ranks (trainer.nnodes x n_gpus_per_node)",
                    f"choose {RM}.rollout.tensor_model_parallel_size x pipeline_model_parallel_size dividing {world}")
    hf = yield from model_dir(v, RM_ROLE)
    if hf is None:
        return
    yield from rm_tokenizer(v)
    labels = len(hf["id2label"]) if isinstance(hf.get("id2label"), dict) else hf.get("num_labels", 2)
    if labels != 1:
        yield Issue(RM_ROLE.model_path, v.get(RM_ROLE.model_path),
                    f"its config.json has {labels} labels; a reward model has one score (num_labels 1, score.weight [1, hidden])",
                    "point it at a reward model saved with num_labels=1")
    heads, kv, layers = hf.get("num_attention_heads"), hf.get("num_key_value_heads") or hf.get("num_attention_heads"), hf.get("num_hidden_layers")
    if isinstance(heads, int) and isinstance(kv, int) and (heads % tp or not kv_heads_split(kv, tp)):
        yield Issue(f"{RM}.rollout.tensor_model_parallel_size", tp,
                    f"does not divide the reward model's num_attention_heads={heads}, or neither divides its "
                    f"num_key_value_heads={kv} nor is a multiple of it", f"choose a TP size dividing {heads} and {kv}, "
                    f"or dividing {heads} and a multiple of {kv}")
    if isinstance(layers, int) and layers % pp:
        yield Issue(f"{RM}.rollout.pipeline_model_parallel_size", pp,
                    f"does not divide the reward model's num_hidden_layers={layers}", f"choose a PP size dividing {layers}")


@needs_files("the reward model's tokenizer")
def rm_tokenizer(v: View) -> Iterator[Issue]:
    path = v.path(RM_ROLE.model_path)
    if not any(os.path.isfile(os.path.join(path, f)) for f in ("tokenizer.json", "tokenizer_config.json")):
        yield Issue(RM_ROLE.model_path, v.get(RM_ROLE.model_path),
                    "has no tokenizer (tokenizer.json / tokenizer_config.json): the reward model renders its own input",
                    "save the reward model's tokenizer in that dir (tokenizer.save_pretrained)")


RULES = (reward_model,)
