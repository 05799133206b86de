"""Worker groups: one Ray actor per rank, each hosting a plain worker class (SPMD).

``WorkerHost`` (the Ray actor) sets the torch.distributed environment (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT, LOCAL_RANK) before it builds the worker, so the worker's
``init_model`` joins the group's own world. ``WorkerGroup`` calls a method on every rank
and waits on all of them; the first rank that fails stops the call with that rank's
traceback (``WorkerError``) instead of leaving the others hanging in a collective; a rank
whose process dies (OOM kill, segfault, ``kill -9``) stops it the same way, naming the
group, rank and pid with Ray's ActorDiedError report.
"""

from __future__ import annotations

import importlib
import os
import time
import traceback
from typing import Any, Sequence

import ray

from megarl.parallel.layout import ParallelLayout
from megarl.parallel.rendezvous import open_rendezvous
from megarl.protocol import DataProto
from megarl.trainer.dispatch import chunk_index, gather, scatter

DEFAULT_CALL_TIMEOUT_S = 3 * 3600.0  # one phase of one step; a hang beyond this is a bug


class WorkerError(RuntimeError):
    """A worker method raised, its process died, or it hung; the message has the group, rank and
    the worker's traceback. Attributes (None when unknown): group, rank, pid, method,
    error_type / error_text (the worker's exception), remote_traceback, died (process died), out_of_memory
    (the worker ran out of GPU memory: torch's allocator or vLLM's)."""

    def __init__(self, message: str, *, group: str | None = None, rank: int | None = None, pid: int | None = None,
                 method: str | None = None, error_type: str | None = None, error_text: str | None = None,
                 remote_traceback: str | None = None, died: bool = False, out_of_memory: bool = False) -> None:
        super().__init__(message)
        self.group, self.rank, self.pid, self.method = group, rank, pid, method
        self.error_type, self.error_text, self.remote_traceback, self.died = error_type, error_text, remote_traceback, died
        self.out_of_memory = out_of_memory


def device_index(ray_gpu_id: int | str, visible_devices: str | None) -> int:
    """This process's CUDA ordinal of the GPU Ray assigned (``ray.get_gpu_ids()[0]``) when Ray leaves
    the node's GPUs visible: Ray names a GPU by its entry in the ``CUDA_VISIBLE_DEVICES`` it started
    under (``"2,3"`` -> ids 2 and 3, or GPU UUIDs), while torch numbers the visible GPUs 0, 1, ...
    """
    entries = [entry.strip() for entry in (visible_devices or "").split(",") if entry.strip()]
    if str(ray_gpu_id) in entries:
        return entries.index(str(ray_gpu_id))
    return int(ray_gpu_id)


class WorkerHost:
    """Ray actor body: builds ``cls_path`` (``module:Class``) with ``args``/``kwargs`` after setting
    the distributed environment; ``call(method, *args)`` runs a method of that worker."""

    def __init__(self, env: dict[str, str]) -> None:
        gpu_ids = ray.get_gpu_ids()
        if gpu_ids and os.environ.get("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES") == "1":
            # Ray leaves every GPU of the node visible, so NCCL and vLLM see real device ids; this
            # rank uses the one Ray assigned. (Isolated groups see only theirs, as device 0.)
            env = {**env, "LOCAL_RANK": str(device_index(gpu_ids[0], os.environ.get("CUDA_VISIBLE_DEVICES")))}
        os.environ.update(env)
        threads = os.environ.get("OMP_NUM_THREADS")
        if threads:
            import torch

            torch.set_num_threads(int(threads))
        self.worker: Any = None

    def pid(self) -> int:
        """This rank's process id (named in errors when the process dies)."""
        return os.getpid()

    def node(self) -> tuple[str, str]:
        """(Ray node id, node IP) of this rank; the IP followed by the Slurm node name when Slurm
        started the Ray node (its raylet's SLURMD_NODENAME, which the worker inherits)."""
        ip, slurm = ray.util.get_node_ip_address(), os.environ.get("SLURMD_NODENAME")
        return ray.get_runtime_context().get_node_id(), f"{ip}, Slurm node {slurm}" if slurm else ip

    def address(self, purpose: str = "world") -> tuple[str, int]:
        """(this node's IP, the port this process listens on from now): the rendezvous of ``purpose``'s
        group (:mod:`megarl.parallel.rendezvous`)."""
        ip = ray.util.get_node_ip_address()
        return ip, open_rendezvous(ip, purpose)

    def set_env(self, env: dict[str, str]) -> None:
        os.environ.update(env)

    def build(self, cls_path: str, args: tuple, kwargs: dict) -> None:
        module, name = cls_path.split(":")
        cls = getattr(importlib.import_module(module), name)
        self.worker = cls(*args, **kwargs)

    def call(self, method: str, *args: Any, _keep_result: bool = True, **kwargs: Any) -> Any:
        """``method(*args, **kwargs)`` of the worker; ``_keep_result=False`` returns None instead
        (a rank whose output the driver does not collect sends nothing back)."""
        try:
            result = getattr(self.worker, method)(*args, **kwargs)
            return result if _keep_result else None
        except Exception as error:
            trace = traceback.format_exc()
            text = str(error)
            from megarl.utils.gpu_memory import is_out_of_memory, oom_report

            out_of_memory = is_out_of_memory(error)
            if out_of_memory:  # the memory by pool while it is still held
                text = f"{text.splitlines()[0] if text else ''}\n{oom_report()}"
            raise WorkerError(
                f"rank {os.environ.get('RANK')}: {type(self.worker).__name__}.{method} failed:\n{trace}",
                rank=int(os.environ.get("RANK", "-1")), pid=os.getpid(), method=method, error_type=type(error).__name__,
                error_text=text, remote_traceback=trace, out_of_memory=out_of_memory,
            ) from error


class WorkerGroup:
    """``world_size`` ranks of one worker class, placed on ``bundles`` (placement group, index).

    Args:
        name: for messages ("actor_rollout_ref", "critic").
        cls_path: ``"module:Class"`` of the plain worker.
        args, kwargs: constructor arguments (same on every rank).
        placements: per rank, ``(placement_group, bundle_index)``.
        num_cpus, num_gpus: Ray resources per rank (fractions allowed, to share bundles).
        env: extra environment for every rank (OMP_NUM_THREADS, VLLM_CPU_KVCACHE_SPACE, ...).
        layout: the Megatron layout of the group's model (for :meth:`call_dp`).
        rollout_layout: the vLLM replicas' layout (for :meth:`call_rollout`).
        max_concurrency: calls a rank runs at once (a worker whose methods are thread-safe, such as
            megarl.workers.engine_worker, takes more than 1).
        isolate_gpus: each rank sees only the GPU Ray gave it (CUDA_VISIBLE_DEVICES, as device 0):
            for processes that are no rank of a shared torch.distributed world (standalone engines).
    """

    def __init__(
        self,
        name: str,
        cls_path: str,
        args: tuple,
        kwargs: dict,
        placements: Sequence[tuple[Any, int]],
        num_cpus: float,
        num_gpus: float,
        env: dict[str, str] | None = None,
        call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
        layout: ParallelLayout | None = None,
        rollout_layout: ParallelLayout | None = None,
        max_concurrency: int = 1,
        isolate_gpus: bool = False,
    ) -> None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.name = name
        self.world_size = len(placements)
        for given in (layout, rollout_layout):
            if given is not None and given.world_size != self.world_size:
                raise ValueError(f"{name}: layout {given} is not over the group's {self.world_size} ranks")
        self.layout = layout
        self.rollout_layout = rollout_layout
        self.call_timeout_s = call_timeout_s
        remote = ray.remote(WorkerHost)
        runtime_env = ({"env_vars": {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}}
                       if num_gpus > 0 and not isolate_gpus else None)
        base_env = {k: str(v) for k, v in (env or {}).items()}
        self.hosts: list[Any] = []
        master: tuple[str, int] | None = None
        for rank, (pg, bundle) in enumerate(placements):
            options = dict(
                num_cpus=num_cpus,
                num_gpus=num_gpus,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=pg, placement_group_bundle_index=bundle
                ),
                name=None,
                max_concurrency=max_concurrency,
            )
            if runtime_env:
                options["runtime_env"] = runtime_env
            rank_env = {**base_env, "RANK": str(rank), "WORLD_SIZE": str(self.world_size), "LOCAL_RANK": "0"}
            if master is not None:
                rank_env.update(MASTER_ADDR=master[0], MASTER_PORT=str(master[1]))
            host = remote.options(**options).remote(rank_env)
            if master is None:
                master = self._get([host.address.remote()], "address", timeout=600)[0]
                self._get([host.set_env.remote({"MASTER_ADDR": master[0], "MASTER_PORT": str(master[1])})], "set_env")
            self.hosts.append(host)
        self.pids: list[int] = self._get([h.pid.remote() for h in self.hosts], "pid")
        self.nodes: list[tuple[str, str]] = self._get([h.node.remote() for h in self.hosts], "node")
        print(f"[megarl] worker group {name}: rank pids {self.pids}", flush=True)
        for node_id, ip in dict.fromkeys(self.nodes):
            ranks = [r for r, n in enumerate(self.nodes) if n == (node_id, ip)]
            print(f"[megarl] worker group {name}: ranks {ranks} on node {node_id} ({ip})", flush=True)
        self._get([h.build.remote(cls_path, tuple(args), dict(kwargs)) for h in self.hosts], "__init__")

    # ------------------------------------------------------------------ calls
    def _get(self, refs: list[Any], method: str, timeout: float | None = None) -> list[Any]:
        """Wait for all refs; raise the first failure (with the worker traceback) at once."""
        timeout = self.call_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + timeout
        pending = list(refs)
        values: list[Any] = [None] * len(refs)
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                ranks = sorted(refs.index(ref) for ref in pending)
                raise WorkerError(
                    f"{self.name}.{method}: {len(pending)} of {len(refs)} ranks did not finish within {timeout:.0f} s",
                    group=self.name, rank=ranks[0], pid=self._pid(ranks[0]), method=method, error_type="Timeout",
                    error_text=f"ranks {ranks} did not finish {method} within {timeout:.0f} s",
                )
            done, pending = ray.wait(pending, num_returns=1, timeout=min(left, 60.0))
            for ref in done:
                try:
                    values[refs.index(ref)] = ray.get(ref)
                except ray.exceptions.RayTaskError as error:
                    cause = error.cause if isinstance(getattr(error, "cause", None), BaseException) else error
                    rank = refs.index(ref)
                    raise WorkerError(
                        f"{self.name}.{method}: {cause}", group=self.name, rank=rank, pid=self._pid(rank), method=method,
                        error_type=getattr(cause, "error_type", None) or type(cause).__name__,
                        error_text=getattr(cause, "error_text", None) or str(cause),
                        remote_traceback=getattr(cause, "remote_traceback", None) or str(error),
                        out_of_memory=getattr(cause, "out_of_memory", False),
                    ) from None
                except ray.exceptions.RayActorError as error:
                    rank = refs.index(ref)
                    raise WorkerError(
                        f"{self.name} rank {rank} (pid {self._pid(rank)}{self._where(rank)}): the worker process died during "
                        f"{self.name}.{method} ({type(error).__name__}); the run stops.\nRay's report:\n{error}",
                        group=self.name, rank=rank, pid=self._pid(rank), method=method, error_type=type(error).__name__,
                        error_text=f"the worker process died during {self.name}.{method}", remote_traceback=str(error),
                        died=True,
                    ) from None
        return values  # each fetched once: a second ray.get would deserialise every tensor again

    def _where(self, rank: int) -> str:
        """", on node <id> (<ip>)" once the group knows its ranks' nodes (a dead node is named)."""
        nodes = getattr(self, "nodes", None) or []
        return f", on node {nodes[rank][0]} ({nodes[rank][1]})" if rank < len(nodes) else ""

    def _pid(self, rank: int) -> int | str:
        """Process id of ``rank`` ("?" while the group is being built)."""
        pids = getattr(self, "pids", None) or []
        return pids[rank] if rank < len(pids) else "?"

    def answers_within(self, timeout_s: float) -> bool:
        """Whether every rank answers within ``timeout_s`` (none is still busy with an earlier call)."""
        try:
            self._get([h.pid.remote() for h in self.hosts], "pid", timeout=timeout_s)
        except WorkerError:
            return False
        return True

    def call_all(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """``method(*args)`` on every rank with the same arguments; per-rank results."""
        return self._get([h.call.remote(method, *args, **kwargs) for h in self.hosts], method)

    def call_all_within(self, timeout_s: float, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """``call_all`` with its own time limit (e.g. a bounded graceful shutdown)."""
        return self._get([h.call.remote(method, *args, **kwargs) for h in self.hosts], method, timeout=timeout_s)

    def start_all(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """``method(*args)`` started on every rank; wait for it with :meth:`wait_all` (two groups in one
        collective, e.g. the weight push between the trainer and the standalone engines)."""
        return [h.call.remote(method, *args, **kwargs) for h in self.hosts]

    def wait_all(self, refs: list[Any], method: str, timeout_s: float | None = None) -> list[Any]:
        """The per-rank results of :meth:`start_all`; a failure names the rank, as :meth:`call_all`."""
        return self._get(refs, method, timeout=timeout_s)

    def call_dp(self, method: str, data: DataProto, pad: bool = True) -> Any:
        """Megatron DP dispatch (``layout``): chunk ``d`` to every rank of DP group ``d``; returns
        the concatenated DataProto of the output ranks (or their dict results, DP-ordered list)."""
        inputs, outputs, collect, pad_size = self._call_chunks(method, data, self.layout, "layout", pad)
        if isinstance(outputs[collect[0]], DataProto):
            return gather(outputs, collect, pad_size)
        return [outputs[r] for r in collect]

    def call_rollout(self, method: str, prompts: DataProto, **kwargs: Any) -> DataProto:
        """Rollout-replica dispatch (``rollout_layout``): chunk ``r`` (and ``kwargs``) to every rank of
        replica ``r``; the replica heads' outputs."""
        inputs, outputs, collect, pad_size = self._call_chunks(method, prompts, self.rollout_layout, "rollout_layout", True,
                                                               **kwargs)
        rows_per_prompt = len(outputs[collect[0]]) // max(1, len(inputs[collect[0]]))
        return gather(outputs, collect, pad_size * rows_per_prompt)

    def call_replicas(self, method: str, args_per_replica: Sequence[tuple]) -> list[Any]:
        """``method(*args_per_replica[r])`` on every rank of rollout replica ``r`` (``rollout_layout``);
        the replicas' first ranks' results in replica order."""
        if self.rollout_layout is None:
            raise ValueError(f"worker group {self.name} was built without a rollout_layout; pass it to WorkerGroup")
        chunk_of_rank, collect = chunk_index(self.rollout_layout)
        if len(args_per_replica) != self.rollout_layout.dp:
            raise ValueError(f"{self.name}.{method}: {len(args_per_replica)} argument tuples for {self.rollout_layout.dp} replicas")
        shared = [[ray.put(arg) for arg in args] for args in args_per_replica]  # once per replica, for all its ranks
        keep = set(collect)
        outputs = self._get([h.call.remote(method, *shared[chunk_of_rank[rank]], _keep_result=rank in keep)
                             for rank, h in enumerate(self.hosts)], method)
        return [outputs[r] for r in collect]

    def _call_chunks(
        self, method: str, data: DataProto, layout: ParallelLayout | None, name: str, pad: bool, **kwargs: Any
    ) -> tuple[list[DataProto], list[Any], list[int], int]:
        """``method`` on every rank with chunk ``layout.coordinates(rank).dp`` of ``data``:
        (per-rank inputs, per-rank outputs, collecting ranks in chunk order, padded rows)."""
        if layout is None:
            raise ValueError(f"worker group {self.name} was built without a {name}; pass it to WorkerGroup")
        chunk_of_rank, collect = chunk_index(layout)
        inputs, pad_size = scatter(data, layout.dp, chunk_of_rank, pad=pad)
        # Each chunk is serialised once for all ranks of its DP group (TP/PP/CP ranks share
        # it), and only the collecting ranks send their output back.
        shared = {id(x): ray.put(x) for x in inputs}
        keep = set(collect)
        outputs = self._get([h.call.remote(method, shared[id(x)], _keep_result=rank in keep, **kwargs)
                             for rank, (h, x) in enumerate(zip(self.hosts, inputs))], method)
        return inputs, outputs, collect, pad_size

    def shutdown(self) -> None:
        for host in self.hosts:
            try:
                ray.kill(host)
            except Exception:
                pass
        self.hosts = []
