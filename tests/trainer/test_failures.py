"""Failures after start-up are reported like config errors: one message naming the phase,
step, worker, file and the fix, a documented exit code, the traceback in a log file."""

from __future__ import annotations

import errno
import os
import tempfile

import numpy as np
import pytest
import torch

from megarl.protocol import DataProto


def _explain(error, phase="update_actor", step=3, run_dir=None, tmp_path=None):
    from megarl.trainer.failures import FailureContext, explain

    return explain(error, FailureContext(phase=phase, step=step, run_dir=str(run_dir or tmp_path)))


def _report(failure, capsys):
    """What python -m megarl.main_ppo does with it: stderr message + exit code."""
    from megarl.main_ppo import exit_with

    with pytest.raises(SystemExit) as info:
        exit_with(failure)
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return info.value.code, err


def _worker_error(error_type, error_text, method="update_actor"):
    from megarl.trainer.worker_group import WorkerError

    remote = f'Traceback (most recent call last):\n  File "engine.py", line 9, in step\n{error_type}: {error_text}\n'
    return WorkerError(f"actor_rollout_ref.{method}: rank 1: ActorRolloutRefWorker.{method} failed:\n{remote}",
                       group="actor_rollout_ref", rank=1, pid=4242, method=method, error_type=error_type,
                       error_text=error_text, remote_traceback=remote)


def test_worker_exception_names_phase_step_worker_and_keeps_the_traceback_in_a_log(tmp_path, capsys):
    failure = _explain(_worker_error("ZeroDivisionError", "float division by zero"), tmp_path=tmp_path)
    code, err = _report(failure, capsys)
    assert code == 7
    for word in ("phase update_actor", "global step 3", "actor_rollout_ref rank 1 (pid 4242)",
                 "ZeroDivisionError: float division by zero", "fix:", "trainer.resume_mode=auto"):
        assert word in err, (word, err)
    log = failure.log_file
    assert log and log in err and log.startswith(str(tmp_path))
    assert 'File "engine.py", line 9, in step' in open(log).read()


def test_a_reward_error_in_the_rollout_worker_is_a_reward_failure(tmp_path, capsys):
    """reward.launch_reward_fn_async in rollout.mode=async scores in the rollout worker: its RewardError
    arrives as a WorkerError and exits 5 like the trainer's own reward phase."""
    text = "reward function failed on row 3 (data_source='src') in training at step 2; sample: ...: ValueError: bad"
    failure = _explain(_worker_error("RewardError", text, "generate_sequences"), phase="gen", step=2, tmp_path=tmp_path)
    code, err = _report(failure, capsys)
    assert code == 5 and "reward function failed on row 3" in err and "custom_reward_function" in err, err


def test_disk_full_in_a_worker_save_is_a_storage_failure(tmp_path, capsys):
    text = f"no space left on /mnt (12 KiB free) while writing {tmp_path}/global_step_2.saving/actor"
    failure = _explain(_worker_error("StorageError", text, "save_checkpoint"), phase="save_checkpoint", step=2, tmp_path=tmp_path)
    code, err = _report(failure, capsys)
    assert code == 6 and "no space left on /mnt" in err and "trainer.default_local_dir" in err, err
    assert "[enforce fail" not in err


def test_disk_full_in_the_controller_is_reported_with_the_path_not_torch_words(tmp_path, capsys):
    from megarl.trainer import checkpointing as ckpt
    from megarl.utils.storage import StorageError

    step = tmp_path / "global_step_2.saving"
    step.mkdir()
    os.symlink("/dev/full", step / ".trainer.pt.tmp")  # the kernel's ENOSPC on every write
    with pytest.raises(StorageError) as info:
        ckpt.write_trainer_state(step, {"global_step": 2, "w": torch.zeros(10000)})
    assert info.value.errno == errno.ENOSPC and "no space left on" in str(info.value) and str(step) in str(info.value)
    code, err = _report(_explain(info.value, phase="save_checkpoint", step=2, tmp_path=tmp_path), capsys)
    assert code == 6 and "no space left on" in err, err


def test_metrics_file_on_a_full_disk_is_a_storage_failure(tmp_path, capsys):
    code, err = _report(_explain(OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "metrics.jsonl")),
                                 phase="log_metrics", tmp_path=tmp_path), capsys)
    assert code == 6 and str(tmp_path / "metrics.jsonl") in err, err


def test_reward_failure_names_validation_and_the_sample(tmp_path, capsys):
    from megarl.reward import RewardError, RewardManager

    class Tok:
        def decode(self, ids, skip_special_tokens=True):
            return "".join(chr(ord("a") + i) for i in ids)

    def fn(ds, text, gt, extra):
        raise KeyError("answer")

    data = DataProto.from_dict(
        {"responses": torch.tensor([[1]]), "response_mask": torch.ones(1, 1, dtype=torch.long),
         "prompts": torch.tensor([[2]]), "attention_mask": torch.ones(1, 2, dtype=torch.long)},
        non_tensors={"data_source": np.array(["src"], dtype=object), "reward_model": np.array([{"ground_truth": "9"}], dtype=object),
                     "extra_info": np.array([{}], dtype=object)},
        meta_info={"validate": True, "global_step": 0},
    )
    manager = RewardManager(Tok(), fn, "naive", timeout_s=30.0)
    try:
        with pytest.raises(RewardError) as info:
            manager(data)
    finally:
        manager.close()
    failure = _explain(info.value, phase="validate", step=0, tmp_path=tmp_path)
    code, err = _report(failure, capsys)
    assert code == 5
    for word in ("validation", "row 0", "ground_truth='9'", "KeyError", "custom_reward_function"):
        assert word in err, (word, err)
    assert "in fn" in open(failure.log_file).read()


def test_checkpoint_lock_config_and_unknown_errors_have_their_codes(tmp_path, capsys):
    from megarl.config import ConfigError, Issue
    from megarl.trainer.checkpointing import CheckpointError
    from megarl.trainer.run_lock import RunDirLockedError

    cases = [
        (CheckpointError(f"{tmp_path}/global_step_4/trainer.pt", "sha256 mismatch", "fix it"), 4),
        (RunDirLockedError(f"{tmp_path}", "pid 1 on host h"), 3),
        (ConfigError([Issue("actor_rollout_ref.model.path", "/x", "differs from the checkpoint", "set it back")]), 2),
        (RuntimeError("an unforeseen bug"), 1),
    ]
    for error, want in cases:
        code, err = _report(_explain(error, tmp_path=tmp_path), capsys)
        assert code == want, (error, err)
        assert str(error).splitlines()[0][:40] in err, err


def test_log_file_falls_back_to_the_temp_dir_when_the_run_dir_cannot_be_written(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the fallback lands in this test's directory
    failure = _explain(RuntimeError("x"), run_dir="/proc/megarl-cannot-write-here")
    assert failure.log_file and os.path.dirname(failure.log_file) == str(tmp_path) and os.path.isfile(failure.log_file)


class _OutOfMemoryWorker:
    def update_actor(self):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
                                     "79.19 GiB of which 1.06 GiB is free.\nIf reserved but unallocated memory is large "
                                     "try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")

    generate_sequences = update_actor

    def sync_weights(self):  # vLLM's sleep-mode allocator at a wake-up (the 8B run of 2026-11-28, step 3)
        raise RuntimeError("CUDA Error: out of memory at /workspace/csrc/cumem_allocator.cpp:163")


@pytest.mark.parametrize("phase,method,keys", [
    ("update_actor", "update_actor", ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
                                      "recompute_granularity=full", "pipeline_model_parallel_size")),
    ("gen", "generate_sequences", ("actor_rollout_ref.rollout.gpu_memory_utilization",
                                   "actor_rollout_ref.actor.megatron.param_offload")),
    ("weight_sync", "sync_weights", ("actor_rollout_ref.rollout.gpu_memory_utilization",
                                     "actor_rollout_ref.actor.megatron.param_offload")),
])
def test_out_of_memory_gives_the_memory_by_pool_and_the_phases_keys(tmp_path, capsys, monkeypatch, phase, method, keys):
    """A worker's out-of-memory error (torch's OutOfMemoryError, or vLLM's allocator's RuntimeError at a
    wake-up) goes through the worker host (which adds the GPU's memory by pool while it is still held) and
    the controller (the keys the plan names for that phase)."""
    from megarl.trainer.worker_group import WorkerError, WorkerHost

    host = WorkerHost.__new__(WorkerHost)  # the Ray actor's body, without Ray
    host.worker = _OutOfMemoryWorker()
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(WorkerError) as info:
        host.call(method)
    error = info.value
    error.group = "actor_rollout_ref"
    assert error.out_of_memory
    first, report = error.error_text.splitlines()
    assert first.startswith("CUDA out of memory. Tried to allocate 2.00 GiB" if method != "sync_weights" else
                            "CUDA Error: out of memory at"), first
    assert report.startswith("memory (GiB): GPU" if torch.cuda.is_available() else "memory: no CUDA device"), report
    code, err = _report(_explain(error, phase=phase, tmp_path=tmp_path), capsys)
    assert code == 7
    for word in (f"phase {phase}", "actor_rollout_ref rank 1", f"out of GPU memory: {first}",
                 report, "python -m megarl.plan", *keys):
        assert word in err, (word, err)
    assert "expandable_segments" not in err  # torch's advice stays in the log


def test_oom_report_reads_vllms_pool_by_tag_as_vllm_counts_it(monkeypatch):
    """The pool by tag sums each allocation's handle[1], the size vLLM's own get_current_usage sums."""
    import inspect
    import sys
    from types import SimpleNamespace

    from megarl.utils import gpu_memory

    cumem = pytest.importorskip("vllm.device_allocator.cumem")
    assert "handle[1]" in inspect.getsource(cumem.CuMemAllocator.get_current_usage)
    gib = 2**30
    data = {1: SimpleNamespace(tag="weights", handle=(0, 7 * gib)), 2: SimpleNamespace(tag="kv_cache", handle=(0, 30 * gib)),
            3: SimpleNamespace(tag="weights", handle=(0, gib))}
    fake = SimpleNamespace(CuMemAllocator=SimpleNamespace(instance=SimpleNamespace(pointer_to_data=data)))
    monkeypatch.setitem(sys.modules, "vllm.device_allocator.cumem", fake)
    assert gpu_memory._vllm_pool_by_tag() == {"weights": 8 * gib, "kv_cache": 30 * gib}


def test_oom_report_leaves_vllms_sleeping_pool_out_of_torchs_figures(monkeypatch):
    """The 7B OOM of 2026-11-27 (H200): torch counted vLLM's 69.5 GiB pool (asleep, unmapped) in allocated
    and reserved, so the report said 'reserved 169.7' on a 139.8 GiB card. Each of torch's figures is given
    without the pool: allocated 169.3 - 69.5, reserved 169.7 - 69.5, and the phase's peak (torch's own message
    said 205.0 allocated when it failed) 205.0 - 69.5."""
    import sys
    from types import SimpleNamespace

    import torch

    from megarl.utils import gpu_memory

    gib = 2**30
    data = {1: SimpleNamespace(tag="weights", handle=(0, int(7.4 * gib))),
            2: SimpleNamespace(tag="kv_cache", handle=(0, int(62.1 * gib)))}
    fake = SimpleNamespace(CuMemAllocator=SimpleNamespace(instance=SimpleNamespace(pointer_to_data=data)))
    monkeypatch.setitem(sys.modules, "vllm.device_allocator.cumem", fake)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (int(1.2 * gib), int(139.8 * gib)))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda: int(169.3 * gib))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: int(205.0 * gib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda: int(169.7 * gib))
    line = gpu_memory.oom_report()
    assert "GPU 138.6 of 139.8" in line
    assert "torch allocated 99.8 (peak 135.5 in this phase), reserved 100.2," in line, line
    assert "kv_cache 62.1, weights 7.4" in line
