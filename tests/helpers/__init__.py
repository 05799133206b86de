"""Helpers shared by the test areas, imported as `helpers.<module>` (pytest.ini puts tests/ on
sys.path; spawned ranks inherit it): the CPU overrides a small run uses (`cpu_config`), N-process
torch.distributed jobs (`dist_utils`), tiny HF checkpoints and rollout configs (`tiny_hf`), the tiny
Qwen2 of the worker tests with its configs, batches and HF references (`tiny`)."""
