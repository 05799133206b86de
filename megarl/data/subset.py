"""``data.train_max_samples`` / ``data.val_max_samples``: which rows of a split are used."""

from __future__ import annotations

import numpy as np


def kept_rows(total: int, max_samples: int, shuffle: bool, seed: int) -> list[int] | None:
    """Row indices (into the concatenated files) a split keeps; None = every row.

    verl's rule (``RLHFDataset``): ``max_samples <= 0`` or ``>= total`` keeps every row;
    otherwise the first ``max_samples`` rows, or with ``shuffle`` (``data.shuffle``) the
    ``max_samples`` rows ``numpy.random.default_rng(seed).choice(total, max_samples,
    replace=False)`` draws, in that drawn order (so verl and megarl pick the same rows for
    the same seed).
    """
    if max_samples <= 0 or max_samples >= total:
        return None
    if shuffle:
        return np.random.default_rng(seed).choice(total, size=max_samples, replace=False).tolist()
    return list(range(max_samples))
