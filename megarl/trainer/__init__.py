"""The single controller: resource pools, worker groups, the PPO loop, checkpoints.

``run_ppo(cfg)`` is what ``megarl.main_ppo`` calls with the run's typed config.
"""

from __future__ import annotations

from typing import Any

from megarl.config.schema.root import MegaRLConfig


# The raylet's agents notice its end only after about a minute; workers stopped by the raylet go at once.
RAY_EXIT_GRACE_S = 1.0


def run_ppo(cfg: MegaRLConfig) -> dict[str, Any]:
    """Hold trainer.default_local_dir, build the trainer (data, reward, the checkpoint to resume:
    all checked before Ray starts), start (or join) Ray and the workers, train; returns the last
    step's metrics. An exception leaves with ``megarl_context`` (a FailureContext: phase, step,
    run dir) for megarl.trainer.failures."""
    import os

    import ray

    from megarl.trainer.failures import FailureContext
    from megarl.trainer.ppo_trainer import RayPPOTrainer
    from megarl.trainer.run_lock import hold_run_dir
    from megarl.utils.bounded import CLEANUP_TIMEOUT_S, within
    from megarl.utils.descendants import descendants, end
    from megarl.utils.signals import exit_on_sigterm

    root = os.path.expanduser(cfg.trainer.default_local_dir)
    trainer = None
    try:
        with hold_run_dir(root):
            trainer = RayPPOTrainer(cfg)
            started = False
            if not ray.is_initialized():
                # RAY_ADDRESS (set by launch/*.sh) joins a running cluster; otherwise a local Ray
                # with ray_kwargs.ray_init (num_cpus, runtime_env.py_executable).
                ray_init = cfg.ray_kwargs.ray_init
                runtime_env: dict[str, Any] = {"env_vars": {"TOKENIZERS_PARALLELISM": "false"}}
                if ray_init.runtime_env.py_executable:
                    runtime_env["py_executable"] = ray_init.runtime_env.py_executable
                num_cpus = None if _cluster_running() else ray_init.num_cpus
                ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=True, runtime_env=runtime_env)
                started = True
                exit_on_sigterm()  # ray.init replaced megarl's SIGTERM handler (twice: in Python and in its core worker)
            failed = True
            try:
                trainer.init_workers()
                result = trainer.fit()
                failed = False
                return result
            finally:
                # After a failure (a worker error or death, NaN stop, Ctrl-C) the workers are killed,
                # not asked to shut down: a rank may wait forever in a collective with a dead peer.
                trainer.close(graceful=not failed)
                timeline = cfg.ray_kwargs.timeline_json_file
                if timeline:
                    ray.timeline(filename=timeline)
                if started:
                    # listed before the shutdown: after it the raylet's workers and agents are init's children
                    ray_processes = descendants(child_cmd=os.path.dirname(ray.__file__))
                    within(CLEANUP_TIMEOUT_S, "ray.shutdown", ray.shutdown)
                    if stuck := end(ray_processes, grace_s=RAY_EXIT_GRACE_S):
                        print(f"[megarl] processes {sorted(p for p, _ in stuck)} of the local Ray outlive SIGKILL "
                              "(in the kernel, e.g. a GPU context's teardown); they go when it ends", flush=True)
    except BaseException as error:  # Ctrl-C and SIGTERM too: main_ppo names the phase they stopped
        context = trainer.failure_context() if trainer is not None else FailureContext(phase="start", run_dir=root)
        try:
            error.megarl_context = context
        except AttributeError:  # an exception type without a __dict__
            pass
        raise


def _cluster_running() -> bool:
    """True when this process is on a node of a running Ray cluster (launch/ray_*.sh started it)."""
    import os

    return bool(os.environ.get("RAY_ADDRESS"))
