"""Persona-level train/validation/test splits: seeded, deterministic, no persona in two splits.

Splitting by dialogue would put one persona's conversations on both sides, and a model would
be validated on the very people it was trained on. :func:`assign_splits` shuffles the sorted
persona ids with ``random.Random(seed)`` and cuts the list by the fractions (largest-remainder
rounding, and at least one persona in each split with a share when there are enough), so the
same personas, fractions and seed give the same splits on any machine.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable

from spasm.errors import UserError

__all__ = ["SPLIT_NAMES", "assign_splits", "parse_split", "split_counts"]

SPLIT_NAMES = ("train", "validation", "test")


def parse_split(text: str) -> tuple[float, ...]:
    """``"0.9,0.05,0.05"`` → fractions for train, validation and test (1 to 3 of them)."""
    try:
        parts = tuple(float(p) for p in text.split(","))
    except ValueError:
        raise UserError(f"--split {text!r}: give 1 to 3 comma-separated fractions, "
                        "e.g. 0.9,0.05,0.05") from None
    if not 1 <= len(parts) <= 3 or any(not math.isfinite(p) or p < 0 for p in parts):
        raise UserError(f"--split {text!r}: give 1 to 3 non-negative fractions (train,validation,test)")
    if abs(sum(parts) - 1) > 1e-6 or parts[0] <= 0:
        raise UserError(f"--split {text!r}: the fractions must add up to 1, with a share for train")
    return parts


def split_counts(n: int, fractions: tuple[float, ...]) -> list[int]:
    """How many of ``n`` personas go to each split."""
    raw = [f * n for f in fractions]
    counts = [math.floor(r) for r in raw]
    by_remainder = sorted(range(len(raw)), key=lambda i: (-(raw[i] - counts[i]), i))
    for i in by_remainder[: n - sum(counts)]:
        counts[i] += 1
    wanted = [i for i, f in enumerate(fractions) if f > 0]
    if n >= len(wanted):
        for i in wanted:  # a split asked for gets at least one persona, taken from the largest
            if counts[i] == 0:
                donor = max(range(len(counts)), key=lambda j: counts[j])
                counts[donor] -= 1
                counts[i] += 1
    return counts


def assign_splits(persona_ids: Iterable[str], fractions: tuple[float, ...], seed: int) -> dict[str, str]:
    """Map each persona id to its split name."""
    ids = sorted(set(persona_ids))
    random.Random(seed).shuffle(ids)
    out: dict[str, str] = {}
    start = 0
    for name, count in zip(SPLIT_NAMES, split_counts(len(ids), fractions), strict=False):
        for pid in ids[start : start + count]:
            out[pid] = name
        start += count
    return out
