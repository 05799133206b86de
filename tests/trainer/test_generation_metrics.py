"""The replicas' generation metrics: the engine time's mean and the slowest replica's (what the step waits for)."""

from megarl.trainer.metrics import generation_metrics


def test_engine_time_mean_and_slowest_replica():
    got = generation_metrics([{"timing/generate_s": 2.0, "rollout/x": 1.0}, {"timing/generate_s": 5.0, "rollout/x": 3.0}])
    assert got == {"timing_s/gen_engine": 3.5, "timing_s/gen_engine_max": 5.0, "rollout/x": 2.0}


def test_without_engine_time_nothing_is_invented():
    assert generation_metrics([{"rollout/x": 1.0}, {}]) == {"rollout/x": 1.0}
