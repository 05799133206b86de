"""verl 0.9.1's V1 trainer modes (``trainer.v1``): what ``colocate_async`` and ``separate_async`` add to
the sync loop. Each step is the sync step's phases; only the rollout half differs
(``RayPPOTrainer.train_step_async`` -> ``RolloutStage.run_async``):

    weight sync (colocated) | weight push (separate) -> admission -> generation until the batch is
    ready -> the batch (oldest-first or earliest-finished groups) -> the PPO step as in sync

* :mod:`.admission` -- how many prompts may enter generation (verl's feed, AReaL's pacing), the bound;
* :mod:`.groups` -- the groups in flight and which form a step's batch (``wait`` / ``drop``);
* :mod:`.feed` -- the prompts one at a time, and where a resumed run restarts;
* :mod:`.sampler` -- one step's batch from the three above and the engines;
* :mod:`.colocated_engines` -- colocate_async's engines (the colocated workers, time-sliced);
* :mod:`.standalone_engines` -- separate_async's engines (their own pool, the weight push, faults);
* :mod:`.staleness` -- per-step staleness metrics from each token's policy version (every mode).
"""
