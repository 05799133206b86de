"""The embedded demo: where its assets live and how they are built on first use.

Assets under ``demo_dir()`` (env ``MEGARL_DEMO_DIR``, default ``~/.cache/megarl/demo``):

* ``model/``        — tiny Qwen2 model (``demo_model``) warmed up on the task
  (``demo_warmup``, seconds on a CPU core) + its tokenizer (``demo_tokenizer``), stamped
  in ``model/megarl_demo.json`` with ``DATA_VERSION`` and ``MODEL_VERSION``,
* ``train.parquet`` — ``TRAIN_ROWS`` rows of the "small arithmetic" task (``demo_data``),
* ``val.parquet``   — ``VAL_ROWS`` rows (every problem once);
* the tool task's (``demo_tool_data``, ``+tools=calculator``): ``tool_model/`` (the tool
  tokenizer variant, warmed up by ``warm_up_tools``, stamped with ``TOOL_DATA_VERSION`` and
  ``TOOL_MODEL_VERSION``), ``tool_train.parquet`` (``TRAIN_ROWS``), ``tool_val.parquet``
  (``TOOL_VAL_ROWS`` distinct problems).

``ensure_demo_assets(cfg)`` builds the missing ones among those the config points at, and
rebuilds an asset whose stamped versions are not the current ones (a cache left by an
older megarl, e.g. the random-init model of earlier versions, or a file that is not a
demo asset).
Paths outside the demo dir belong to the user and are never written. Every asset is
built in a temporary path in the demo dir and renamed into place, so two processes
building at once both end with one complete copy.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

from megarl.data.demo_data import DATA_VERSION, data_version, generate_rows, write_rows_parquet
from megarl.data.demo_tool_data import TOOL_DATA_VERSION, generate_tool_rows

logger = logging.getLogger(__name__)

DEMO_DIR_ENV = "MEGARL_DEMO_DIR"
DEFAULT_DEMO_DIR = "~/.cache/megarl/demo"
MODEL_NAME = "model"
TRAIN_NAME = "train.parquet"
VAL_NAME = "val.parquet"
TRAIN_ROWS = 1024
VAL_ROWS = 200  # every problem once (demo_data.PROBLEMS)
DATA_SEED = 0
MODEL_STAMP = "megarl_demo.json"  # in model/: the versions the model was built with
# Bump when demo_model, demo_tokenizer or demo_warmup would build another model: a cached
# model dir stamped with another version is rebuilt. 1: warm-up on "small arithmetic"
# (the unstamped dirs of earlier megarl versions hold a random-init model); 2: the warm-up
# stops on its measured target instead of after 150 steps.
MODEL_VERSION = 2
TOOL_MODEL_NAME = "tool_model"
TOOL_TRAIN_NAME = "tool_train.parquet"
TOOL_VAL_NAME = "tool_val.parquet"
TOOL_VAL_ROWS = 64  # of 16200 problems: a validation of multi-turn samples stays ~1 s on CPU
TOOL_MODEL_VERSION = 1  # as MODEL_VERSION, for the tool model

# Config keys that may name a demo asset (dotted paths; absent keys are skipped).
ASSET_KEYS = (
    "data.train_files",
    "data.val_files",
    "data.tokenizer",
    "actor_rollout_ref.model.path",
    "actor_rollout_ref.model.tokenizer_path",
    "critic.model.path",
    "critic.model.tokenizer_path",
)


def demo_dir() -> Path:
    """The demo cache directory (``$MEGARL_DEMO_DIR`` or ``~/.cache/megarl/demo``), absolute."""
    return Path(os.path.expanduser(os.environ.get(DEMO_DIR_ENV) or DEFAULT_DEMO_DIR)).resolve()


def _select(cfg: Any, dotted_key: str) -> Any:
    """``cfg.a.b.c`` for a DictConfig or nested dict; None when any part is missing."""
    node = cfg
    for part in dotted_key.split("."):
        try:
            node = node[part] if part in node else None
        except TypeError:
            return None
        if node is None:
            return None
    return node


def _as_paths(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, (str, os.PathLike)):
        return [os.fspath(value)]
    return [os.fspath(v) for v in value]


def _current_model_stamp(name: str = MODEL_NAME) -> dict[str, int]:
    if name == TOOL_MODEL_NAME:
        return {"data_version": TOOL_DATA_VERSION, "model_version": TOOL_MODEL_VERSION}
    return {"data_version": DATA_VERSION, "model_version": MODEL_VERSION}


def model_stamp(model_dir: Path) -> dict | None:
    """The versions a demo model dir was built with; None if unstamped or unreadable."""
    try:
        stamp = json.loads((model_dir / MODEL_STAMP).read_text())
    except (OSError, ValueError):
        return None
    return stamp if isinstance(stamp, dict) else None


def _build_model_dir(target: Path) -> None:
    from megarl.data.demo_model import build_demo_model
    from megarl.data.demo_tokenizer import build_demo_tokenizer
    from megarl.data.demo_warmup import warm_up

    tokenizer = build_demo_tokenizer()
    model = build_demo_model(tokenizer)
    losses, measured = warm_up(model, tokenizer)
    logger.info("demo model warm-up: %d steps, loss %.3f -> %.3f, greedy answers %.3f right, %.3f well formed",
                len(losses), losses[0], losses[-1], measured.right, measured.well_formed)
    model.save_pretrained(target, safe_serialization=True)
    tokenizer.save_pretrained(target)
    (target / MODEL_STAMP).write_text(json.dumps(_current_model_stamp()) + "\n")


def _build_tool_model_dir(target: Path) -> None:
    from megarl.data.demo_model import build_demo_model
    from megarl.data.demo_tokenizer import build_demo_tokenizer
    from megarl.data.demo_warmup import warm_up_tools

    tokenizer = build_demo_tokenizer(with_tools=True)
    model = build_demo_model(tokenizer)
    losses = warm_up_tools(model, tokenizer)
    logger.info("demo tool model warm-up: %d steps, loss %.3f -> %.3f", len(losses), losses[0], losses[-1])
    model.save_pretrained(target, safe_serialization=True)
    tokenizer.save_pretrained(target)
    (target / MODEL_STAMP).write_text(json.dumps(_current_model_stamp(TOOL_MODEL_NAME)) + "\n")


def _build_split(split: str, num_rows: int, generate: Callable = generate_rows,
                 version: int = DATA_VERSION) -> Callable[[Path], None]:
    def build(target: Path) -> None:
        write_rows_parquet(generate(split, num_rows, DATA_SEED), target, version)

    return build


BUILDERS: dict[str, Callable[[Path], None]] = {
    MODEL_NAME: _build_model_dir,
    TRAIN_NAME: _build_split("train", TRAIN_ROWS),
    VAL_NAME: _build_split("val", VAL_ROWS),
    TOOL_MODEL_NAME: _build_tool_model_dir,
    TOOL_TRAIN_NAME: _build_split("train", TRAIN_ROWS, generate_tool_rows, TOOL_DATA_VERSION),
    TOOL_VAL_NAME: _build_split("val", TOOL_VAL_ROWS, generate_tool_rows, TOOL_DATA_VERSION),
}
MODEL_NAMES = (MODEL_NAME, TOOL_MODEL_NAME)


def _is_current(name: str, target: Path) -> bool:
    """An existing asset is reused if it is stamped with the current versions."""
    if name in MODEL_NAMES:
        return target.is_dir() and model_stamp(target) == _current_model_stamp(name)
    return target.exists() and data_version(target) == _current_stamp(name)


def _stamp_of(name: str, target: Path) -> object:
    return model_stamp(target) if name in MODEL_NAMES else data_version(target)


def _current_stamp(name: str) -> object:
    if name in MODEL_NAMES:
        return _current_model_stamp(name)
    return TOOL_DATA_VERSION if name.startswith("tool_") else DATA_VERSION


def build_asset(name: str, root: Path | None = None) -> Path:
    """Build asset ``name`` under ``root`` (default ``demo_dir()``) unless it exists and is
    stamped with the current versions (``DATA_VERSION``; the model also ``MODEL_VERSION``);
    return its path."""
    root = root or demo_dir()
    target = root / name
    if _is_current(name, target):
        return target
    if target.exists():
        found = _stamp_of(name, target)
        logger.warning("demo asset %s has %s, not version %s: rebuilding it", target,
                       "no version stamp" if found is None else f"version {found}", _current_stamp(name))
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=root))
    try:
        staged = tmp / name
        if name in MODEL_NAMES:
            staged.mkdir()
        BUILDERS[name](staged)
        if target.is_dir() and not _is_current(name, target):
            # A stale model dir cannot be replaced by one rename: move it aside first
            # (into tmp, removed below). Another process may do the same at once; each
            # rename is atomic and both builds are identical, so one current copy remains.
            try:
                os.rename(target, tmp / "stale")
            except OSError:
                pass
        try:
            os.rename(staged, target)  # atomic (replaces a stale file); a dir fails if another process won the race
        except OSError:
            if not _is_current(name, target):
                raise
        logger.info("built demo asset %s", target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def ensure_demo_assets(cfg: Any) -> list[Path]:
    """Build the demo assets that ``cfg`` points at and that are missing; return those built-or-present.

    A path under ``demo_dir()`` that is not a demo asset raises ValueError naming the key.
    """
    root = demo_dir()
    needed: dict[str, str] = {}
    for key in ASSET_KEYS:
        for raw in _as_paths(_select(cfg, key)):
            path = Path(os.path.expanduser(raw)).resolve()
            if path != root and root not in path.parents:
                continue  # the user's own file: never touched
            name = path.relative_to(root).as_posix()
            if name not in BUILDERS:
                raise ValueError(
                    f"{key}={raw!r} lies in the demo dir {root} but is not a demo asset "
                    f"(known: {sorted(BUILDERS)}); point it elsewhere or at one of those"
                )
            needed.setdefault(name, key)
    return [build_asset(name, root) for name in sorted(needed)]
