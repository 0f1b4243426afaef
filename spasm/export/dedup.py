"""Exact and near-duplicate dialogues (SPEC §10), found while the dialogues stream past.

* **Exact**: two dialogues whose utterances (speaker and text, case and whitespace folded) are
  the same. A 16-byte digest per dialogue is kept.
* **Near**: the Jaccard similarity of the dialogues' word 5-gram sets is at least
  ``threshold`` (0.8 by default), estimated with MinHash (128 permutations) and found with
  banded locality-sensitive hashing, both from ``datasketch`` (the ``export`` extra). Only the
  signatures are kept (512 bytes a dialogue), never the shingle sets; candidates are checked on
  their signatures. benchmarks/export.py compares this with exact Jaccard over pairs blocked by
  persona on a 45,000-dialogue run (time, memory, and what each finds).

The finding goes on the later dialogue (by id) of each pair and names the earlier one, so the
first of a group is kept and the result does not depend on the order dialogues are read in.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from spasm.export.scans import words_of
from spasm.export.stream import Turn

__all__ = ["SHINGLE_WORDS", "DuplicateFinding", "DuplicateIndex", "gram_hashes", "minhash_available",
           "word_hashes"]

SHINGLE_WORDS = 5
NUM_PERM = 128


_word_cache: dict[str, int] = {}
_PRIME = np.uint64(0x100000001B3)  # FNV-64 prime: a well-mixed multiplier for the rolling hash


def word_hashes(words: Iterable[str]) -> np.ndarray:
    """A stable 32-bit hash (crc32) of each word, as uint64 (stable across processes, unlike
    ``hash``, so signatures do not depend on the process or the order of reading)."""
    cache = _word_cache
    if len(cache) > 2_000_000:  # bounded: a run with millions of distinct words still streams
        cache.clear()
    words = list(words)
    get = cache.get
    out = [get(w) for w in words]
    if None in out:
        for k, h in enumerate(out):
            if h is None:
                out[k] = cache[words[k]] = zlib.crc32(words[k].encode())
    return np.array(out, dtype=np.uint64)


def gram_hashes(words: np.ndarray, n: int) -> np.ndarray:
    """Rolling hashes of every ``n`` consecutive words (one hash of all when fewer)."""
    if words.size == 0:
        return words
    if words.size < n:
        n = int(words.size)
    h = np.zeros(words.size - n + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for k in range(n):
            h = h * _PRIME + words[k : words.size - n + 1 + k]
    return h


def minhash_available() -> bool:
    """Whether datasketch (the ``export`` extra) is installed."""
    return importlib.util.find_spec("datasketch") is not None


@dataclass(frozen=True, slots=True)
class DuplicateFinding:
    """``dialogue_id`` repeats ``other`` exactly (``duplicate``) or nearly (``near_duplicate``)."""

    dialogue_id: str
    kind: str
    other: str
    #: Estimated Jaccard similarity of the two (1.0 for an exact duplicate).
    similarity: float


def _identity(x: Any) -> Any:
    return x


@dataclass
class DuplicateIndex:
    """Feed dialogues with :meth:`add`; :meth:`findings` at the end."""

    threshold: float = 0.8
    #: ``False``: exact duplicates only (datasketch missing, or near duplicates not wanted).
    near: bool = True
    _digests: dict[bytes, list[str]] = field(default_factory=dict)
    _sigs: dict[str, Any] = field(default_factory=dict)
    _pairs: list[tuple[str, str, float]] = field(default_factory=list)
    _lsh: Any = None
    _perm: Any = None
    _ds: Any = None

    def __post_init__(self) -> None:
        if self.near:
            self._ds = importlib.import_module("datasketch")  # untyped: Any
            self._perm = self._ds.MinHash(num_perm=NUM_PERM, seed=1).permutations
            self._lsh = self._ds.MinHashLSH(threshold=self.threshold, num_perm=NUM_PERM)

    def add(self, dialogue_id: str, turns: Sequence[Turn]) -> None:
        """Index one dialogue (its candidates among those added before are checked now)."""
        folded = "\x1e".join(f"{t.speaker}\x1f{' '.join(t.text.split()).lower()}" for t in turns)
        digest = hashlib.blake2b(folded.encode(), digest_size=16).digest()
        same = self._digests.setdefault(digest, [])
        same.append(dialogue_id)
        if not self.near or len(same) > 1:
            return  # an exact copy: reported as such, not again as a near one
        words = word_hashes(w for t in turns for w in words_of(t.text))
        if words.size == 0:
            return
        m = self._ds.MinHash(num_perm=NUM_PERM, permutations=self._perm, scheme="affine32",
                             hashfunc=_identity)
        m.update_batch(np.unique(gram_hashes(words, SHINGLE_WORDS) >> np.uint64(32)).tolist())
        sig = self._ds.LeanMinHash(m)
        for other in self._lsh.query(sig):
            similarity = float(np.mean(sig.hashvalues == self._sigs[other].hashvalues))
            if similarity >= self.threshold:
                self._pairs.append((dialogue_id, other, similarity))
        self._lsh.insert(dialogue_id, sig)
        self._sigs[dialogue_id] = sig

    def findings(self) -> list[DuplicateFinding]:
        """One finding per later dialogue of each exact group and near pair, sorted by id."""
        out: dict[tuple[str, str], DuplicateFinding] = {}
        for ids in self._digests.values():
            if len(ids) > 1:
                first, *rest = sorted(ids)
                for d in rest:
                    out[(d, "duplicate")] = DuplicateFinding(d, "duplicate", first, 1.0)
        for a, b, sim in self._pairs:
            later, earlier = max(a, b), min(a, b)
            key = (later, "near_duplicate")
            known = out.get(key)
            if known is None or earlier < known.other:  # name the earliest similar dialogue
                out[key] = DuplicateFinding(later, "near_duplicate", earlier, sim)
        return sorted(out.values(), key=lambda f: (f.dialogue_id, f.kind))
