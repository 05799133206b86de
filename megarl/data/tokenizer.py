"""The tokenizer that renders and tokenizes the prompts (preflight and trainer load it the same way).

Directory: ``data.tokenizer``, else ``actor_rollout_ref.model.tokenizer_path``, else
``actor_rollout_ref.model.path``. Custom tokenizer code runs only with
``data.trust_remote_code`` or ``actor_rollout_ref.model.trust_remote_code``.
``actor_rollout_ref.model.custom_chat_template`` replaces its chat template, as verl does on
the model's tokenizer: megarl's rollout generates from the token ids the dataset rendered with
it, so the template applies to training and generation alike.
"""

from __future__ import annotations

import os

from transformers import PreTrainedTokenizerBase

from megarl.config.schema.root import MegaRLConfig

TOKENIZER_KEYS = ("data.tokenizer", "actor_rollout_ref.model.tokenizer_path", "actor_rollout_ref.model.path")


def tokenizer_key(cfg: MegaRLConfig) -> str:
    """The first of ``TOKENIZER_KEYS`` that is set (``model.path`` when none is)."""
    values = (cfg.data.tokenizer, cfg.actor_rollout_ref.model.tokenizer_path)
    return next((key for key, value in zip(TOKENIZER_KEYS, values) if value), TOKENIZER_KEYS[-1])


def tokenizer_dir(cfg: MegaRLConfig) -> str:
    """The tokenizer directory (``~`` expanded) named by ``tokenizer_key(cfg)``."""
    values = dict(zip(TOKENIZER_KEYS, (cfg.data.tokenizer, cfg.actor_rollout_ref.model.tokenizer_path,
                                       cfg.actor_rollout_ref.model.path)))
    return os.path.expanduser(str(values[tokenizer_key(cfg)]))


def load_data_tokenizer(cfg: MegaRLConfig) -> PreTrainedTokenizerBase:
    """The tokenizer of the run's config with the custom chat template set.

    Raises what ``AutoTokenizer.from_pretrained`` raises for a bad directory.
    """
    from transformers import AutoTokenizer

    trust = bool(cfg.data.trust_remote_code or cfg.actor_rollout_ref.model.trust_remote_code)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir(cfg), trust_remote_code=trust)
    template = cfg.actor_rollout_ref.model.custom_chat_template
    if template is not None:
        tokenizer.chat_template = template
    return tokenizer
