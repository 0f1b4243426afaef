"""Exact and near-duplicate dialogues (docs/export.md), found while the dialogues stream past.

* **Exact**: two dialogues whose utterances (speaker and text, case and whitespace folded) are
  the same. A 16-byte digest per dialogue is kept.
* **Near**: the Jaccard similarity of the dialogues' word 5-gram sets is at least
  ``threshold`` (0.8 by default), estimated with MinHash (128 permutations, ``datasketch``,
  the ``export`` extra) and found by banded locality-sensitive hashing with datasketch's banding
  for the threshold. Only the signatures are kept (512 bytes a dialogue), never the shingle
  sets; candidates are checked on their signatures. benchmarks/export.py compares this with
  datasketch's own LSH index and with exact Jaccard over pairs blocked by persona on a
  45,000-dialogue run (time, memory, and what each finds).

The finding goes on the later dialogue (by id) of each pair and names the earlier one, so the
first of a group is kept and the result does not depend on the order dialogues are read in.
"""

from __future__ import annotations

import functools
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

__all__ = ["MAX_BUCKET", "NUM_PERM", "SHINGLE_WORDS", "DuplicateFinding", "DuplicateIndex", "gram_hashes",
           "minhash_available", "word_hashes"]

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


#: Largest LSH bucket compared pair by pair; a member of a larger bucket (a run whose model
#: says the same thing over and over) is compared with the bucket's first members only.
MAX_BUCKET = 256
_CHUNK = 4096


@functools.cache
def _banding(threshold: float) -> tuple[int, int]:
    """``datasketch.MinHashLSH``'s optimal banding for ``threshold`` (``b`` bands of ``r`` rows):
    found by numerical integration over every split of ``NUM_PERM`` (~40 ms), so once per
    threshold and process."""
    ds = importlib.import_module("datasketch")  # untyped: Any
    lsh = ds.MinHashLSH(threshold=threshold, num_perm=NUM_PERM)
    return int(lsh.b), int(lsh.r)


@dataclass
class DuplicateIndex:
    """Feed dialogues with :meth:`add`; :meth:`findings` at the end.

    Each dialogue's MinHash signature (datasketch, ``NUM_PERM`` uint32 values) is kept in a
    signature matrix; :meth:`findings` bands it the way ``datasketch.MinHashLSH`` would for the
    threshold (its ``b`` bands of ``r`` rows), finds the dialogues that agree on a whole band by
    sorting the band's keys, and checks each candidate pair on its signatures. datasketch's own
    index keeps a Python set per band and bucket, about 3 KB a dialogue (128 MiB more peak at
    45,000 dialogues, benchmarks/export.py); the matrix takes 512 bytes.
    """

    threshold: float = 0.8
    #: ``False``: exact duplicates only (datasketch missing, or near duplicates not wanted).
    near: bool = True
    _digests: dict[bytes, list[str]] = field(default_factory=dict)
    _ids: list[str] = field(default_factory=list)
    _chunks: list[np.ndarray] = field(default_factory=list)
    _minhash: Any = None
    _bands: int = 0
    _rows: int = 0

    def __post_init__(self) -> None:
        if self.near:
            ds = importlib.import_module("datasketch")  # untyped: Any
            self._minhash = ds.MinHash(num_perm=NUM_PERM, seed=1, scheme="affine32", hashfunc=_identity)
            self._bands, self._rows = _banding(self.threshold)

    def add(self, dialogue_id: str, turns: Sequence[Turn]) -> None:
        """Index one dialogue."""
        folded = "\x1e".join(f"{t.speaker}\x1f{' '.join(t.text.split()).lower()}" for t in turns)
        digest = hashlib.blake2b(folded.encode(), digest_size=16).digest()
        same = self._digests.setdefault(digest, [])
        same.append(dialogue_id)
        if not self.near or len(same) > 1:
            return  # an exact copy: reported as such, not again as a near one
        words = word_hashes(w for t in turns for w in words_of(t.text))
        if words.size == 0:
            return
        m = self._minhash
        m.clear()
        m.update_batch(np.unique(gram_hashes(words, SHINGLE_WORDS) >> np.uint64(32)).tolist())
        row = len(self._ids) % _CHUNK
        if row == 0:
            self._chunks.append(np.empty((_CHUNK, NUM_PERM), dtype=np.uint32))
        self._chunks[-1][row] = m.hashvalues
        self._ids.append(dialogue_id)

    def _candidates(self, sigs: np.ndarray) -> set[tuple[int, int]]:
        """Row pairs ``(later, earlier)`` that agree on at least one whole band."""
        pairs: set[tuple[int, int]] = set()
        for band in range(self._bands):
            key = np.zeros(len(sigs), dtype=np.uint64)
            with np.errstate(over="ignore"):
                for col in range(band * self._rows, (band + 1) * self._rows):
                    key = key * _PRIME + sigs[:, col]
            order = np.argsort(key, kind="stable")
            ordered = key[order]
            starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
            sizes = np.diff(np.r_[starts, len(ordered)])
            for start, size in zip(starts[sizes > 1].tolist(), sizes[sizes > 1].tolist(), strict=True):
                members = sorted(order[start : start + size].tolist())
                for k in range(1, len(members)):
                    pairs.update((members[k], members[j]) for j in range(min(k, MAX_BUCKET)))
        return pairs

    def _near_pairs(self) -> list[tuple[str, str, float]]:
        n = len(self._ids)
        if not self.near or n < 2:
            return []
        sigs = np.concatenate(self._chunks)[:n]
        candidates = sorted(self._candidates(sigs))
        if not candidates:
            return []
        later, earlier = (np.array(x, dtype=np.int64) for x in zip(*candidates, strict=True))
        similarity = np.empty(len(later))
        for lo in range(0, len(later), 65_536):  # bounded memory for many candidates
            hi = lo + 65_536
            similarity[lo:hi] = (sigs[later[lo:hi]] == sigs[earlier[lo:hi]]).mean(axis=1)
        keep = np.flatnonzero(similarity >= self.threshold)
        return [(self._ids[later[i]], self._ids[earlier[i]], float(similarity[i])) for i in keep.tolist()]

    def findings(self) -> list[DuplicateFinding]:
        """One finding per later dialogue (by id) of each exact group and near pair."""
        out: dict[tuple[str, str], DuplicateFinding] = {}
        for ids in self._digests.values():
            if len(ids) > 1:
                first, *rest = sorted(ids)
                for d in rest:
                    out[(d, "duplicate")] = DuplicateFinding(d, "duplicate", first, 1.0)
        for a, b, sim in self._near_pairs():
            later, earlier = max(a, b), min(a, b)
            key = (later, "near_duplicate")
            known = out.get(key)
            if known is None or earlier < known.other:  # name the earliest similar dialogue
                out[key] = DuplicateFinding(later, "near_duplicate", earlier, sim)
        return sorted(out.values(), key=lambda f: (f.dialogue_id, f.kind))
