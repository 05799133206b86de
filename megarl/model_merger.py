"""A megarl Megatron checkpoint -> an HF model directory (verl's model merger CLI).

    python -m megarl.model_merger merge --backend megatron \\
        --local_dir <default_local_dir>/global_step_N/actor --target_dir <hf_dir>
    python -m megarl.model_merger test --backend megatron --local_dir ... --test_hf_dir <reference hf_dir>

The dist checkpoint stores every tensor with its global shape, so any saved TP/PP/VPP/EP layout
loads into one CPU process at TP=PP=EP=1 (megatron dist-checkpointing reshards); the model is
rebuilt from ``<local_dir>/huggingface/config.json`` and the build record in the checkpoint
(parameter dtype, value head, ``override_transformer_config``), then exported with the same
Megatron -> HF mapping as the live export (``megarl.models.save_hf_checkpoint``): safetensors,
config.json, tokenizer files. ``merge`` writes it; ``test`` compares it with ``--test_hf_dir``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class MergeError(ValueError):
    """A checkpoint or argument the merger cannot use; the message names it and the fix."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """verl 0.9.1's arguments (verl/model_merger/base_model_merger.py), plus ``--hf_model_path``."""
    parser = argparse.ArgumentParser(prog="python -m megarl.model_merger", description="megarl model merger")
    ops = parser.add_subparsers(dest="operation", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--backend", required=True, choices=["fsdp", "megatron"])
    common.add_argument("--local_dir", required=True, help="<default_local_dir>/global_step_N/actor (or /critic)")
    common.add_argument("--hf_model_path", default=None,
                        help="HF dir with config.json + tokenizer, for checkpoints without <local_dir>/huggingface")
    common.add_argument("--tie-word-embedding", action="store_true", help="must agree with config.json")
    common.add_argument("--trust-remote-code", action="store_true")
    common.add_argument("--is-value-model", action="store_true", help="must agree with the checkpoint")
    common.add_argument("--use_cpu_initialization", action="store_true", help="always on: megarl merges on CPU")
    merge = ops.add_parser("merge", parents=[common])
    merge.add_argument("--target_dir", default="tmp")
    merge.add_argument("--hf_upload_path", default=None)
    merge.add_argument("--private", action="store_true")
    test = ops.add_parser("test", parents=[common])
    test.add_argument("--test_hf_dir", required=True)
    return parser.parse_args(argv)


def _check_checkpoint(local_dir: Path) -> dict[str, Any]:
    """The checkpoint's megarl record, after refusing anything that would run code when loaded."""
    from megatron.core import dist_checkpointing

    from megarl.utils.safe_checkpoint import verify_dist_checkpoint

    ckpt_dir = local_dir / "dist_ckpt"
    if not ckpt_dir.is_dir() and (local_dir / "fsdp_dtensor").is_dir():
        raise MergeError(f"--local_dir {local_dir}: a Megatron-FSDP checkpoint (fsdp_dtensor/, written with "
                         "megatron.use_megatron_fsdp=true), which the merger does not read; its HF model is the "
                         "huggingface/ export of a save with checkpoint.save_contents including hf_model")
    if not ckpt_dir.is_dir():
        raise MergeError(f"--local_dir {local_dir}: no dist_ckpt/ in it; point it at "
                         "<trainer.default_local_dir>/global_step_N/actor (or /critic)")
    verify_dist_checkpoint(str(ckpt_dir))
    meta = dist_checkpointing.load_common_state_dict(str(ckpt_dir)).get("megarl", {})
    if "model" not in meta.get("contents", ["model"]):
        raise MergeError(f"--local_dir {local_dir}: the checkpoint holds {meta['contents']}, no model weights; "
                         "save with checkpoint.save_contents including model")
    if "lora" in meta.get("build", {}):
        raise MergeError(f"--local_dir {local_dir}: the checkpoint holds LoRA adapters only (the base is the run's "
                         "actor_rollout_ref.model.path); its merged model is the huggingface/ export of a save with "
                         "checkpoint.save_contents including hf_model")
    return meta


def _hf_dir(args: argparse.Namespace, local_dir: Path) -> Path:
    hf_dir = Path(args.hf_model_path) if args.hf_model_path else local_dir / "huggingface"
    if not (hf_dir / "config.json").is_file():
        raise MergeError(f"{hf_dir / 'config.json'} does not exist (a checkpoint written before megarl saved it); "
                         "give --hf_model_path <the run's actor_rollout_ref.model.path>")
    return hf_dir


def _init_single_process() -> None:
    """A world of one gloo rank: TP = PP = EP = 1."""
    from megarl.parallel import init_distributed
    from megarl.parallel.rendezvous import open_rendezvous

    if not torch.distributed.is_initialized():
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
        os.environ["MASTER_PORT"] = str(open_rendezvous("127.0.0.1", "world"))
    init_distributed({}, "cpu", seed=0)


def merge_to_dir(args: argparse.Namespace, target_dir: Path) -> None:
    """Load ``args.local_dir`` at TP=PP=1 and write the HF directory ``target_dir``."""
    import transformers

    from megarl.models import build_model, save_hf_checkpoint
    from megarl.workers.megatron.checkpoint import load_model_only

    local_dir = Path(args.local_dir)
    meta = _check_checkpoint(local_dir)
    hf_dir = _hf_dir(args, local_dir)
    build = meta.get("build")
    if build is None:
        raise MergeError(f"--local_dir {local_dir}: the checkpoint has no build record (written before megarl "
                         "stored one); export it with checkpoint.save_contents=[...,hf_model] from a resumed run")
    if args.is_value_model != build["value_head"]:
        raise MergeError(f"--is-value-model={args.is_value_model}, but the checkpoint is "
                         f"{'a critic (value head)' if build['value_head'] else 'a language model'}; "
                         f"{'add' if build['value_head'] else 'drop'} --is-value-model")
    hf_config = transformers.AutoConfig.from_pretrained(str(hf_dir), trust_remote_code=args.trust_remote_code)
    if args.tie_word_embedding and not getattr(hf_config, "tie_word_embeddings", False):
        raise MergeError(f"--tie-word-embedding, but {hf_dir / 'config.json'} has tie_word_embeddings=false "
                         "(megarl reads tying from config.json); drop the flag")
    _init_single_process()
    megatron_cfg = {"sequence_parallel": False, "override_transformer_config": build["override_transformer_config"]}
    chunks = build_model(hf_config, megatron_cfg, value_head=build["value_head"], device="cpu",
                         dtype=DTYPES[build["dtype"]])
    load_model_only(chunks, str(local_dir))
    save_hf_checkpoint(chunks, hf_config, target_dir, tokenizer_dir=hf_dir)


def _tensors(hf_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(hf_dir.glob("*.safetensors"))
    if not files:
        raise MergeError(f"--test_hf_dir {hf_dir}: no *.safetensors in it")
    return {name: t for f in files for name, t in load_file(str(f)).items()}


def compare_dirs(merged: Path, reference: Path) -> None:
    """Every tensor of ``reference``'s safetensors equals the merged one (same names, shapes, dtypes)."""
    got, want = _tensors(merged), _tensors(reference)
    if got.keys() != want.keys():
        raise AssertionError(f"merged tensors differ in names: missing {sorted(want.keys() - got.keys())}, "
                             f"extra {sorted(got.keys() - want.keys())}")
    for name in sorted(want):
        torch.testing.assert_close(got[name], want[name], msg=lambda m, n=name: f"{n}: {m}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        if args.backend != "megatron":
            raise MergeError("--backend fsdp: megarl writes Megatron checkpoints only; use --backend megatron")
        if args.operation == "merge" and args.hf_upload_path:
            raise MergeError("--hf_upload_path: megarl does not upload; run `huggingface-cli upload <repo> "
                             f"{args.target_dir}` after the merge")
        if args.operation == "merge":
            merge_to_dir(args, Path(args.target_dir))
            print(f"megarl: merged {args.local_dir} into {args.target_dir}")
        else:
            with tempfile.TemporaryDirectory() as tmp:
                merge_to_dir(args, Path(tmp))
                compare_dirs(Path(tmp), Path(args.test_hf_dir))
            print(f"megarl: {args.local_dir} matches {args.test_hf_dir}")
    except MergeError as error:
        print(f"megarl: {error}", file=sys.stderr)
        sys.exit(2)
    except AssertionError as error:  # `test`: a difference is the answer, not a crash
        print(f"megarl: {args.local_dir} differs from {args.test_hf_dir}: {error}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":  # needed: megatron's checkpoint reader may spawn processes
    main()
