"""Deterministic shards of a run (``spasm generate --shard I/N``).

A shard is one of N parts of the plan, split by persona: shard I runs every dialogue of the
personas whose ``persona_index % N == I`` — all their conversations, conditions, pairings and
harness levels — with exactly the seeds and dialogue ids of the unsharded run (both depend on
the persona and the conversation only). The split is round-robin over the persona index, so
the shards differ by at most one persona, and it needs nothing but the index: any scheduler
(a SLURM array, a Kubernetes job index) can run the shards in any order, on any machine.

Every shard draws the whole persona set with the run's seed (the draw is sequential: which
candidates pass depends on those before), keeps its own personas in its ``personas`` table and
all rejected candidates in ``persona_rejections`` (the same in every shard; a merge keeps them
once). Its manifest records ``shard``: index, count and a digest of the whole persona set, so
a merge can tell shards that drew different personas (an LLM validator or crafter that
answered differently) from shards of one run, and a shard directory cannot be resumed as
another shard or as an unsharded run.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from spasm.errors import UserError

__all__ = ["Shard", "parallel_shards", "personas_digest", "resume_check", "share_limits"]

P = TypeVar("P", bound=Mapping[str, Any])

_SPEC = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` of ``count`` (0-based: ``0/3``, ``1/3``, ``2/3``)."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if self.count < 1 or not 0 <= self.index < self.count:
            raise UserError(
                f"shard {self.index}/{self.count} does not exist: write --shard I/N with "
                "0 <= I < N (a SLURM array --array=0-(N-1) gives I as $SLURM_ARRAY_TASK_ID)."
            )

    @classmethod
    def parse(cls, text: str) -> Shard:
        """Parse ``"I/N"`` (raises :class:`UserError` saying how to write it)."""
        match = _SPEC.match(text)
        if not match:
            raise UserError(f"--shard {text!r}: write it as I/N, e.g. --shard 0/3 for the first "
                            "of three shards.")
        return cls(int(match.group(1)), int(match.group(2)))

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    @property
    def dirname(self) -> str:
        """The directory name the Ray executor gives this shard (``1-of-3``)."""
        return f"{self.index}-of-{self.count}"

    def owns(self, persona: Mapping[str, Any]) -> bool:
        """Whether the persona's dialogues belong to this shard."""
        return int(persona["persona_index"]) % self.count == self.index

    def select(self, personas: Sequence[P]) -> list[P]:
        """This shard's personas, in their order (already selected ones pass unchanged)."""
        return [p for p in personas if self.owns(p)]

    def record(self, personas: Sequence[Mapping[str, Any]] | None = None) -> dict[str, Any]:
        """What the manifest records of the shard; with the whole persona set, its digest."""
        out: dict[str, Any] = {"spec": str(self), "index": self.index, "count": self.count}
        if personas is not None:
            out["personas"] = len(personas)
            out["personas_sha256"] = personas_digest(personas)
        return out


def personas_digest(personas: Sequence[Mapping[str, Any]]) -> str:
    """sha256 of a persona set (every field of every persona, in index order)."""
    rows = sorted(personas, key=lambda p: int(p["persona_index"]))
    blob = json.dumps([dict(p) for p in rows], sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()


def stored_shard(run_dir: Path) -> tuple[bool, dict[str, Any] | None]:
    """(whether ``run_dir`` has a readable manifest, the shard it records or ``None``)."""
    try:
        manifest = json.loads((Path(run_dir) / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False, None
    if not isinstance(manifest, dict):
        return False, None
    shard = manifest.get("shard")
    return True, shard if isinstance(shard, dict) else None


def resume_check(run_dir: Path, shard: Shard | None) -> dict[str, Any] | None:
    """Refuse to resume ``run_dir`` as another shard than it holds; returns its shard record
    (with the persona digest of the first pass) to carry on, or ``None``."""
    readable, old = stored_shard(run_dir)
    if not readable:
        return shard.record() if shard is not None else None
    held = old.get("spec") if old else None
    wanted = str(shard) if shard is not None else None
    if held == wanted:
        return old
    if held is None:
        raise UserError(
            f"{run_dir} holds an unsharded run, so it cannot be resumed as shard {wanted}. "
            "Give the shard its own --out, or drop --shard to resume the run."
        )
    if wanted is None:
        raise UserError(
            f"{run_dir} holds shard {held} of a sharded run; resume it with --shard {held}, "
            "merge the shards with `spasm merge`, or use another --out."
        )
    raise UserError(
        f"{run_dir} holds shard {held}, so it cannot be resumed as shard {wanted}. Give each "
        "shard its own --out (e.g. runs/<name>/shards/I-of-N)."
    )


def _used_backends(config: Any) -> set[str]:
    used = {p.client for p in config.pairing_list} | {p.responder for p in config.pairing_list}
    for extra in (config.personas.backend, config.termination.judge_backend, config.harness.backend):
        if extra:
            used.add(extra)
    return used


def parallel_shards(config: Any, shards: int, slots: int) -> int:
    """How many shards may run at once so each gets a whole share of every limit: at most
    ``shards`` and ``slots``, and no more than a backend's ``max_concurrency`` or ``rpm``."""
    ways = max(1, min(shards, slots))
    for name in _used_backends(config):
        b = config.backends[name]
        ways = min(ways, b.max_concurrency, *(v for v in (b.rpm, b.tpm) if v))
    return max(1, ways)


def share_limits(config: Any, ways: int, shards: int) -> Any:
    """The config one of ``ways`` shards running at once uses: each backend's
    ``max_concurrency``, ``rpm`` and ``tpm`` divided by ``ways`` (rounded down, so the shares
    add up to at most the limit), and the budget caps (``engine.max_cost``/``max_tokens``,
    which count a whole run) divided by ``shards``. None of these is part of the config
    fingerprint, so the shards still merge and resume as one run."""
    if ways <= 1 and shards <= 1:
        return config
    backends = {
        name: b.model_copy(update={
            "max_concurrency": max(1, b.max_concurrency // ways),
            "rpm": max(1, b.rpm // ways) if b.rpm else None,
            "tpm": max(1, b.tpm // ways) if b.tpm else None,
        })
        for name, b in config.backends.items()
    }
    ec = config.engine
    engine = ec.model_copy(update={
        "max_cost": ec.max_cost / shards if ec.max_cost is not None else None,
        "max_tokens": max(1, ec.max_tokens // shards) if ec.max_tokens is not None else None,
    })
    return config.model_copy(update={"backends": backends, "engine": engine})
