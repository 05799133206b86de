"""Where the config lives, and how a file path given in the config is found.

megarl/configs/megatron ships inside the package (package data of the wheel), so an editable
install, `pip install .` and a wheel all find it. pip installs unpack to a directory, which
Hydra needs: a zipped megarl would have no path to give it.
"""

from __future__ import annotations

import os
from importlib.resources import files

PACKAGE_DIR = str(files("megarl"))
CONFIG_DIR = os.path.join(PACKAGE_DIR, "configs", "megatron")
CONFIG_NAME = "ppo_megatron_trainer"
CONFIG_YAML = os.path.join(CONFIG_DIR, f"{CONFIG_NAME}.yaml")


def resolve_file(path: str) -> str:
    """``path`` as given (``~`` expanded) when it exists, else relative to the megarl package (as
    verl resolves its config paths against its package), so ``configs/tools/calculator.yaml`` works
    from any working directory and in an installed wheel. Unchanged when neither exists (the caller
    reports it)."""
    path = os.path.expanduser(path)
    if os.path.exists(path) or os.path.isabs(path):
        return path
    in_package = os.path.join(PACKAGE_DIR, path)
    return in_package if os.path.exists(in_package) else path
