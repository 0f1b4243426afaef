"""Lexical diversity of one side of a dialogue: MATTR, Yule's K and HD-D.

The three measures MirrorBench (Hathidara et al., 2026) uses to tell user proxies from real
users, each computed on the word tokens of one speaker's utterances concatenated in order:

* **MATTR** (Covington & McFall, 2010): the type–token ratio of every window of
  ``window`` consecutive tokens (50 by default), averaged over all windows. A side with fewer
  tokens than the window has one window, the whole text: its TTR (as in Kyle's
  ``lexical_diversity`` and NeMo User Sim). Range (0, 1]; higher = more diverse.
* **Yule's K** (Yule, 1944): ``10⁴ · (Σ f² − N) / N²`` over the frequency ``f`` of each
  type, N tokens. 0 when no word repeats; higher = more repetitive. Nearly independent
  of text length.
* **HD-D** (McCarthy & Jarvis, 2007; 2010): the expected type–token ratio of a random
  sample of ``sample_size`` (42) tokens drawn without replacement,
  ``Σ_types P(type occurs in the sample) / 42`` with ``P = 1 − hypergeom.pmf(0; N, f, 42)``
  (``scipy.stats.hypergeom``). Undefined (``None``) with fewer than 42 tokens.

Tokens are lower-cased runs of letters and digits (an inner apostrophe kept: "don't"),
so punctuation and case never count as vocabulary. ``None`` means "not defined for this
text" (no tokens; HD-D: too few).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt

__all__ = [
    "HDD_SAMPLE",
    "MATTR_WINDOW",
    "hdd",
    "hdd_many",
    "mattr",
    "word_tokens",
    "yules_k",
]

MATTR_WINDOW = 50
HDD_SAMPLE = 42

_TOKEN = re.compile(r"[^\W_]+(?:'[^\W_]+)*")


def word_tokens(text: str) -> list[str]:
    """Lower-cased word tokens of ``text`` (typographic apostrophes normalised first)."""
    return _TOKEN.findall(text.replace("\u2019", "'").replace("\u2018", "'").lower())


def _ids(tokens: Sequence[str]) -> npt.NDArray[np.int64]:
    index: dict[str, int] = {}
    return np.fromiter((index.setdefault(t, len(index)) for t in tokens), dtype=np.int64, count=len(tokens))


def mattr(tokens: Sequence[str], window: int = MATTR_WINDOW) -> float | None:
    """Moving-average type–token ratio over windows of ``window`` tokens.

    Computed without materialising the windows: a token at position ``i`` adds a new type
    to every window that contains it but not its previous occurrence ``prev[i]``, i.e. to
    the windows starting in ``[max(i − W + 1, prev[i] + 1), min(i, N − W)]``.
    """
    if window < 1:
        raise ValueError("window must be at least 1")
    n = len(tokens)
    if n == 0:
        return None
    if n <= window:
        return len(set(tokens)) / n
    ids = _ids(tokens)
    order = np.argsort(ids, kind="stable")
    prev = np.full(n, -1, dtype=np.int64)
    same = ids[order[1:]] == ids[order[:-1]]
    prev[order[1:][same]] = order[:-1][same]
    i = np.arange(n, dtype=np.int64)
    first = np.maximum(np.maximum(i - window + 1, prev + 1), 0)
    last = np.minimum(i, n - window)
    new_type_windows = np.clip(last - first + 1, 0, None).sum()
    return float(new_type_windows) / (window * (n - window + 1))


def yules_k(counts: Iterable[int]) -> float | None:
    """Yule's K of a frequency vector (one count per type): ``10⁴ (Σ f² − N) / N²``."""
    f = np.asarray(list(counts), dtype=np.float64)
    f = f[f > 0]
    n = float(f.sum())
    if n == 0:
        return None
    return 1e4 * (float((f * f).sum()) - n) / (n * n)


def hdd(tokens: Sequence[str], sample_size: int = HDD_SAMPLE) -> float | None:
    """HD-D of a token sequence (``None`` with fewer than ``sample_size`` tokens)."""
    return hdd_many([list(Counter(tokens).values())], sample_size)[0]


def hdd_many(count_vectors: Sequence[Sequence[int]], sample_size: int = HDD_SAMPLE) -> list[float | None]:
    """HD-D of many texts given as frequency vectors, in one vectorised hypergeometric call."""
    from scipy.stats import hypergeom

    if sample_size < 1:
        raise ValueError("sample_size must be at least 1")
    out: list[float | None] = [None] * len(count_vectors)
    keep = [k for k, c in enumerate(count_vectors) if sum(c) >= sample_size]
    # Texts in chunks of about 2**19 types, so memory stays bounded on a large run.
    start = 0
    while start < len(keep):
        stop, size = start, 0
        while stop < len(keep) and (size == 0 or size + len(count_vectors[keep[stop]]) <= 1 << 19):
            size += len(count_vectors[keep[stop]])
            stop += 1
        chunk = keep[start:stop]
        freqs = [np.asarray(count_vectors[k], dtype=np.int64) for k in chunk]
        lengths = np.array([len(f) for f in freqs])
        f_all = np.concatenate(freqs)
        totals = np.repeat(np.array([int(f.sum()) for f in freqs]), lengths)
        # P(a type with frequency f is absent from a 42-token sample of a text of N tokens).
        p_absent = hypergeom.pmf(0, totals, f_all, sample_size)
        contrib = (1.0 - p_absent) / sample_size
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        for k, value in zip(chunk, np.add.reduceat(contrib, starts), strict=True):
            out[k] = float(value) if math.isfinite(value) else None
        start = stop
    return out
