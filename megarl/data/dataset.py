"""The RL prompt dataset: verl-style parquet rows -> left-padded prompt tensors.

Each row holds a chat (``data.prompt_key``: a list of ``{role, content}`` messages) plus
whatever the reward needs (``reward_model.ground_truth``, ``extra_info``, ...). An item is
a dict of

* tensors ``input_ids``, ``attention_mask``, ``position_ids`` — ``[P]`` with
  P = ``data.max_prompt_length``, left-padded (pads have mask 0, position 0);
* non-tensors: every other column of the row, ``data_source`` (copied from the column
  ``data.reward_fn_key``), ``extra_info`` (a dict that always has ``index``, the row's
  position in the dataset), ``raw_prompt`` (the chat, when ``data.return_raw_chat``) and
  ``full_prompts`` (the templated text, when ``data.return_full_prompt``).

Data config keys read (by attribute: the typed ``data`` section, or the DictConfig of it that a
custom dataset class subclassing this one gets, as in verl): prompt_key,
max_prompt_length, truncation, filter_overlong_prompts, return_raw_chat, return_full_prompt,
reward_fn_key, apply_chat_template_kwargs, shuffle and seed (for ``max_samples``).

The chat template is the tokenizer's (``megarl.data.tokenizer`` puts
``actor_rollout_ref.model.custom_chat_template`` there); the rollout generates from these
token ids, so the same template renders the prompts for training and generation.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping, Sequence

import torch
from torch.utils.data import Dataset
from omegaconf import DictConfig, OmegaConf
from transformers import PreTrainedTokenizerBase

from megarl.config.schema.data import DataConfig
from megarl.data.errors import DataError
from megarl.data.parquet_io import read_parquet_rows
from megarl.data.sampler import data_seed
from megarl.data.subset import kept_rows
from megarl.data.truncation import TRUNCATION_MODES, PromptTooLong, truncate_prompt

logger = logging.getLogger(__name__)

TOO_LONG_FIX = (
    "raise data.max_prompt_length, set data.truncation to left / right / middle, "
    "or data.filter_overlong_prompts=true (drops such rows)"
)

# The key holding the template override; the preflight names the tokenizer's key instead when
# it is not set.
CHAT_TEMPLATE_KEY = "actor_rollout_ref.model.custom_chat_template"

# apply_chat_template arguments megarl sets itself (the prompt is rendered to text, generation
# prompt added, then tokenized): data.apply_chat_template_kwargs may not change them.
RESERVED_CHAT_TEMPLATE_KWARGS = (
    "conversation", "add_generation_prompt", "continue_final_message", "tokenize", "return_dict",
    "return_tensors", "return_assistant_tokens_mask", "padding", "truncation", "max_length", "tokenizer_kwargs",
)


def left_pad(token_ids: Sequence[int], length: int, pad_token_id: int) -> dict[str, torch.Tensor]:
    """``input_ids``/``attention_mask``/``position_ids`` of shape ``[length]``, pads on the left.

    Positions count real tokens from 0; pad positions are 0.
    """
    num_pad = length - len(token_ids)
    if num_pad < 0:
        raise ValueError(f"{len(token_ids)} tokens do not fit in length {length}")
    input_ids = torch.tensor([pad_token_id] * num_pad + list(token_ids), dtype=torch.long)
    attention_mask = torch.cat([torch.zeros(num_pad, dtype=torch.long), torch.ones(len(token_ids), dtype=torch.long)])
    position_ids = torch.clamp(torch.cumsum(attention_mask, dim=0) - 1, min=0)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}


class RLDataset(Dataset):
    """Prompts from one or more parquet files (see module docstring for item layout)."""

    def __init__(
        self,
        data_files: Sequence[str],
        tokenizer: PreTrainedTokenizerBase,
        config: DataConfig | DictConfig,
        files_key: str = "data.train_files",
        max_samples: int = -1,
    ):
        """config: the ``data`` section (attribute access); files_key: the config key listing
        ``data_files`` (named in errors); max_samples: ``data.{train,val}_max_samples`` of that
        split (see ``megarl.data.subset.kept_rows``; -1 = every row), applied before the
        overlong-prompt filter as verl does."""
        self.tokenizer = tokenizer
        self.prompt_key: str = config.prompt_key
        self.max_prompt_length: int = int(config.max_prompt_length)
        self.truncation: str = config.truncation
        self.return_raw_chat: bool = bool(config.return_raw_chat)
        self.return_full_prompt: bool = bool(config.return_full_prompt)
        self.reward_fn_key: str = config.reward_fn_key
        kwargs = config.apply_chat_template_kwargs
        self.chat_template_kwargs: dict[str, Any] = dict(OmegaConf.to_container(kwargs) if OmegaConf.is_config(kwargs) else kwargs)
        filter_overlong: bool = bool(config.filter_overlong_prompts)

        if self.truncation not in TRUNCATION_MODES:
            raise DataError(f"data.truncation={self.truncation!r} is not a truncation mode", key="data.truncation",
                            fix=f"use one of {', '.join(TRUNCATION_MODES)}")
        if self.max_prompt_length <= 0:
            raise DataError(f"data.max_prompt_length must be positive, got {self.max_prompt_length}",
                            key="data.max_prompt_length", fix="set data.max_prompt_length >= 1")
        reserved = sorted(set(self.chat_template_kwargs) & set(RESERVED_CHAT_TEMPLATE_KWARGS))
        if reserved:
            raise DataError(f"data.apply_chat_template_kwargs sets {reserved}, which megarl sets itself when it renders a prompt",
                            key="data.apply_chat_template_kwargs", fix=f"remove {', '.join(reserved)} from data.apply_chat_template_kwargs")
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if self.pad_token_id is None:
            raise DataError("the tokenizer has neither a pad nor an eos token; cannot left-pad prompts", key="data.tokenizer",
                            fix="use a tokenizer with a pad_token or eos_token (set it in tokenizer_config.json)")

        # rows[i] came from origins[i] = (file, row index in that file)
        self.rows: list[dict[str, Any]] = []
        self.origins: list[tuple[str, int]] = []
        for path in data_files:
            for row_index, row in enumerate(read_parquet_rows(
                path, [self.prompt_key, self.reward_fn_key], files_key=files_key,
                column_keys={self.prompt_key: "data.prompt_key", self.reward_fn_key: "data.reward_fn_key"},
            )):
                self._check_row(row, path, row_index)
                self.rows.append(row)
                self.origins.append((path, row_index))

        kept = kept_rows(len(self.rows), max_samples, bool(config.shuffle), data_seed(config))
        if kept is not None:
            logger.info("%s: using %d of %d rows (%s)", files_key.replace("_files", "_max_samples"), len(kept),
                        len(self.rows), f"random, seed {data_seed(config)}" if config.shuffle else "the first ones")
            self.rows = [self.rows[i] for i in kept]
            self.origins = [self.origins[i] for i in kept]

        if filter_overlong:
            kept = [i for i in range(len(self.rows)) if len(self.prompt_token_ids(i)) <= self.max_prompt_length]
            dropped = len(self.rows) - len(kept)
            logger.warning(
                "data.filter_overlong_prompts: dropped %d of %d rows longer than %d tokens",
                dropped, len(self.rows), self.max_prompt_length,
            )
            self.rows = [self.rows[i] for i in kept]
            self.origins = [self.origins[i] for i in kept]
            if not self.rows:
                raise DataError(
                    f"data.filter_overlong_prompts dropped every row of {list(data_files)}: "
                    f"all prompts exceed data.max_prompt_length={self.max_prompt_length}",
                    key="data.max_prompt_length", fix="raise data.max_prompt_length",
                )

    def _check_row(self, row: Mapping[str, Any], path: str, row_index: int) -> None:
        messages = row.get(self.prompt_key)
        if not isinstance(messages, list) or not messages:
            raise DataError(
                f"expected a non-empty list of chat messages, got {type(messages).__name__}",
                file=path, row=row_index, column=self.prompt_key, key="data.prompt_key",
                fix=f"store each prompt as a list of {{role, content}} messages (verl format), or set data.prompt_key to such a column",
            )
        for message in messages:
            if not isinstance(message, dict) or not isinstance(message.get("role"), str) or not isinstance(
                message.get("content"), str
            ):
                raise DataError(
                    f"each message must be a dict with string 'role' and 'content', got {message!r}",
                    file=path, row=row_index, column=self.prompt_key, key="data.prompt_key",
                    fix="give every message a string 'role' and a string 'content'",
                )
        source = row.get(self.reward_fn_key)
        if not isinstance(source, str) or not source:
            raise DataError(
                f"expected a non-empty string naming the reward function's data source, got {source!r}",
                file=path, row=row_index, column=self.reward_fn_key, key="data.reward_fn_key",
                fix="fill the column in every row, or set data.reward_fn_key to the column that names the data source",
            )

    def __len__(self) -> int:
        return len(self.rows)

    def chat_text(self, index: int) -> str:
        """Row ``index``'s chat rendered by the tokenizer's chat template, generation prompt added,
        ``data.apply_chat_template_kwargs`` passed to the template as variables."""
        try:
            return self.tokenizer.apply_chat_template(
                self.rows[index][self.prompt_key], add_generation_prompt=True, tokenize=False, **self.chat_template_kwargs
            )
        except Exception as exc:  # template errors are data errors: say which row
            path, row_index = self.origins[index]
            raise DataError(
                f"chat template failed: {type(exc).__name__}: {exc}", file=path, row=row_index, column=self.prompt_key,
                key=CHAT_TEMPLATE_KEY,
                fix="fix the row's messages, or use a chat template that accepts them (the tokenizer's, "
                    f"{CHAT_TEMPLATE_KEY}, and the variables in data.apply_chat_template_kwargs)",
            ) from None

    def prompt_token_ids(self, index: int) -> list[int]:
        """Token ids of :meth:`chat_text` (no truncation)."""
        return self.tokenizer(self.chat_text(index), add_special_tokens=False)["input_ids"]

    def overlong_rows(self) -> list[tuple[str, int, int]]:
        """``(file, row in file, prompt tokens)`` of every prompt longer than max_prompt_length.

        Tokenizes every row (the templated chat); ``main_ppo`` calls it before training when
        ``data.truncation=error`` so an overlong prompt is found before the first step.
        """
        out = []
        for index in range(len(self.rows)):
            length = len(self.prompt_token_ids(index))
            if length > self.max_prompt_length:
                out.append((*self.origins[index], length))
        return out

    def __getitem__(self, index: int) -> dict[str, Any]:
        row = self.rows[index]
        path, row_index = self.origins[index]
        full_prompt = self.chat_text(index)
        token_ids = self.tokenizer(full_prompt, add_special_tokens=False)["input_ids"]
        try:
            token_ids = truncate_prompt(token_ids, self.max_prompt_length, self.truncation)
        except PromptTooLong as exc:
            raise DataError(
                str(exc), file=path, row=row_index, column=self.prompt_key, key="data.max_prompt_length",
                fix=TOO_LONG_FIX,
            ) from None

        item: dict[str, Any] = dict(left_pad(token_ids, self.max_prompt_length, self.pad_token_id))
        for key, value in row.items():
            if key != self.prompt_key:
                item[key] = value
        item["data_source"] = row[self.reward_fn_key]
        extra_info = dict(row.get("extra_info") or {})
        extra_info.setdefault("index", index)
        item["extra_info"] = extra_info
        if self.return_raw_chat:
            item["raw_prompt"] = row[self.prompt_key]
        if self.return_full_prompt:
            item["full_prompts"] = full_prompt
        return item
