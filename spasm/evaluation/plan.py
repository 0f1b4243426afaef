"""What an evaluation costs before it runs (``spasm eval RUN --dry-run``).

:func:`eval_plan` reads the run, collects every text the embedding stages would embed (the
utterances, cheap drift's persona anchors, own content's cut utterances, the persona cards of
card retrieval, a group run's seats' own content), removes those already in the run's
embedding cache, and times the chosen embedder on a random sample of what is left, right now,
on this machine. It writes nothing (opening the cache may merge its shards, as any read does).
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from spasm.evaluation.drift import persona_anchor_texts
from spasm.evaluation.embeddings import CachedEmbedder, Embedder, create_embedder, text_key
from spasm.evaluation.loader import load_run
from spasm.evaluation.owncontent import OwnRule, own_content, own_texts

__all__ = ["EvalPlan", "duration", "eval_plan", "plan_text"]

#: Texts timed at most, after a warm-up of :data:`WARMUP` texts (model loading, first batch).
SAMPLE = 256
WARMUP = 8


@dataclass
class EvalPlan:
    """The embedding work of one evaluation, and its expected time."""

    embedder: str
    dialogues: int
    utterances: int
    #: Distinct texts per source (a text in two sources counts in the first).
    sources: dict[str, int]
    unique: int
    cached: int
    #: Texts the embedder would compute: ``unique - cached``.
    to_embed: int
    #: Texts timed for the rate (0: nothing left to embed, so nothing was timed).
    sampled: int = 0
    seconds_sampled: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float | None:
        """Texts per second, as measured (``None`` when nothing was timed)."""
        if not self.sampled or self.seconds_sampled <= 0:
            return None
        return self.sampled / self.seconds_sampled

    @property
    def expected_seconds(self) -> float | None:
        """The embedding stages' expected time at :attr:`rate` (0 when nothing is left)."""
        if self.to_embed == 0:
            return 0.0
        rate = self.rate
        return None if rate is None else self.to_embed / rate


def _texts(data: Any, mode: str, retrieval: str, rule: OwnRule) -> tuple[dict[str, list[str]], list[str]]:
    """Every text the embedding stages embed, by source (the same helpers the stages call)."""
    convs = data.conversations
    notes: list[str] = []
    personas = data.by_id
    sources: dict[str, list[str]] = {"utterances": [t for c in convs for t in c.texts]}
    if mode == "cheap":
        sources["persona anchors"] = [t for p in personas.values()
                                      for t in persona_anchor_texts(p.fields).values() if t is not None]
    else:
        notes.append("Probe mode: the probe's stated stances are embedded too (up to one per client "
                     "turn and persona dimension); they are not known before the LLM answers, so "
                     "they are not counted.")
    own = own_content(convs, rule)
    changed = [u.text for rows in own.utterances.values() for u in rows
               if u.text is not None and u.text != u.raw]
    group = [c for c in convs if c.is_group]
    seats = own_texts(own, group)
    for c in group:
        changed += [t for t, side in zip(seats[c.dialogue_id], c.sides, strict=True)
                    if side == "client" and t is not None]
    sources["own content"] = changed
    if retrieval == "card":
        used = {c.persona_id for c in convs}
        sources["persona cards"] = [p.card for pid, p in personas.items()
                                    if pid in used and p.card.strip()]
    return sources, notes


def eval_plan(
    run_dir: str | Path,
    *,
    embedder: str | Embedder = "local",
    embedder_options: Mapping[str, Any] | None = None,
    mode: Literal["cheap", "probe"] = "cheap",
    retrieval: Literal["card", "centroid"] = "card",
    own_rule: OwnRule | None = None,
    cache_dir: str | Path | None = None,
    sample: int = SAMPLE,
    seed: int = 0,
) -> EvalPlan:
    """Count what :func:`spasm.evaluation.evaluate` would embed and time the embedder.

    Args:
        run_dir: the run (or imported dataset) to evaluate.
        embedder: a registered embedder name or an object, as for ``evaluate``.
        embedder_options: its options.
        mode, retrieval, own_rule: as for ``evaluate`` (they decide which texts are embedded).
        cache_dir: the embedding cache (default ``RUN_DIR/eval/embeddings-cache``).
        sample: texts timed at most (a seeded random sample of those not cached).
        seed: the sample's seed.

    Raises:
        UserError: as ``evaluate`` (no such run, a missing table, an unknown embedder).
    """
    from spasm.evaluation.pipeline import CACHE_DIRNAME, EVAL_DIRNAME

    data = load_run(run_dir)
    inner = (create_embedder(embedder, **dict(embedder_options or {}))
             if isinstance(embedder, str) else embedder)
    cache = CachedEmbedder(inner, Path(cache_dir) if cache_dir is not None
                           else data.run_dir / EVAL_DIRNAME / CACHE_DIRNAME)
    by_source, notes = _texts(data, mode, retrieval, own_rule or OwnRule())
    seen: set[str] = set()
    sources: dict[str, int] = {}
    for name, texts in by_source.items():
        fresh = {t for t in texts if t not in seen}
        sources[name] = len(fresh)
        seen |= fresh
    unique = sorted(seen)
    missing = [t for t, v in zip(unique, cache.cache.get([text_key(t) for t in unique]), strict=True)
               if v is None]
    plan = EvalPlan(
        embedder=inner.name, dialogues=len(data.conversations),
        utterances=len(by_source["utterances"]), sources=sources, unique=len(unique),
        cached=len(unique) - len(missing), to_embed=len(missing), notes=notes,
    )
    if missing:
        picked = random.Random(seed).sample(missing, min(len(missing), sample + WARMUP))
        inner.embed(picked[:WARMUP])  # loads the model; not timed
        timed = picked[WARMUP:] or picked
        t0 = time.perf_counter()
        inner.embed(timed)
        plan.seconds_sampled = time.perf_counter() - t0
        plan.sampled = len(timed)
    return plan


def duration(seconds: float) -> str:
    """Seconds as a short human duration (s, min or h)."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def plan_text(plan: EvalPlan) -> str:
    """The dry run's lines, as ``spasm eval --dry-run`` prints them."""
    parts = ", ".join(f"{n:,} {name}" for name, n in plan.sources.items() if n)
    lines = [
        f"Dry run: {plan.dialogues:,} dialogues, {plan.utterances:,} utterances; nothing evaluated.",
        f"Texts to embed with {plan.embedder}: {plan.unique:,} unique ({parts or 'none'}); "
        f"{plan.cached:,} already in the embedding cache; {plan.to_embed:,} to embed.",
    ]
    rate, seconds = plan.rate, plan.expected_seconds
    if rate is not None and seconds is not None:
        lines.append(
            f"Rate on this machine: {rate:,.1f} texts/s, measured now on {plan.sampled} of those "
            f"texts (after a warm-up of {WARMUP}).")
        lines.append(f"Expected embedding time: {duration(seconds)} "
                     "(LLM stages, when asked for, are not counted).")
    elif plan.to_embed == 0:
        lines.append("Expected embedding time: 0 s (every text is cached).")
    lines += [f"Note: {n}" for n in plan.notes]
    return "\n".join(lines) + "\n"
