"""Loading the scoring function named by ``reward.custom_reward_function.{path, name, reward_kwargs}``."""

from __future__ import annotations

import functools
import importlib.util
import inspect
import os
import sys
from typing import Any, Callable

from megarl.reward.default import default_compute_score

ScoreFn = Callable[..., Any]


class RewardFunctionError(ValueError):
    """A custom reward function that cannot be loaded; the message names the config key."""


def load_reward_fn(custom_cfg: Any) -> ScoreFn:
    """The configured scorer with ``reward_kwargs`` bound, or ``default_compute_score``.

    The function is called as ``fn(data_source, solution_str, ground_truth, extra_info, **reward_kwargs)``
    (per row) or, for the ``batch`` manager, with lists of those.
    """
    path = None if custom_cfg is None else custom_cfg.get("path")
    if not path:
        return default_compute_score
    name = custom_cfg.get("name") or "compute_score"
    path = os.path.expanduser(str(path))
    if not os.path.isfile(path):
        raise RewardFunctionError(f"reward.custom_reward_function.path={path!r}: file not found")
    module_name = "megarl_custom_reward_" + str(abs(hash(os.path.abspath(path))))
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as error:  # the user's file; report where it failed
        raise RewardFunctionError(f"reward.custom_reward_function.path={path!r}: importing it failed: {error!r}") from error
    sys.modules[module_name] = module  # so worker processes (prime manager) can unpickle fn
    fn = getattr(module, name, None)
    if not callable(fn):
        raise RewardFunctionError(
            f"reward.custom_reward_function.name={name!r}: no function of that name in {path!r}"
        )
    kwargs = dict(custom_cfg.get("reward_kwargs") or {})
    return functools.partial(fn, **kwargs) if kwargs else fn


def describe_scorer(fn: ScoreFn) -> str:
    """How messages name a scorer: megarl's built-in one, or the custom function's name and file."""
    base = fn.func if isinstance(fn, functools.partial) else fn
    if base is default_compute_score:
        return "megarl's built-in scorer for that data_source (megarl.reward.default_compute_score)"
    name = getattr(base, "__qualname__", None) or repr(base)
    try:
        where = inspect.getsourcefile(base)
    except TypeError:  # a builtin or a callable object
        where = None
    return f"{name} in {where}" if where else name
