"""Persona drift: how far the Client's stance at client turn t is from its stance at the start.

``Drift(t)_d = 1 − cos(E(A0_d), E(At_d))`` (docs/evaluation.md), with ``t`` counting the Client's
turns from 0. What ``A0_d`` and ``At_d`` are depends on the mode (docs/evaluation.md):

cheap (default, no LLM)
    ``utterance``: A0 = the Client's opening utterance, At = its utterance at turn t. This
    is "stance at 0 vs stance at t" with the utterance standing in for the
    stance, so Drift(0) = 0 and identical utterances give 0 throughout; it cannot tell
    the three dimensions apart, hence one dimension.
    ``concerns`` / ``emotion`` / ``motivation``: A0 = the persona's stated field (its
    concern; "I feel <emotion> (<intensity>)"; its motivation), At = the utterance at t:
    how far each utterance is from what the card says the Client cares about.
probe
    an LLM reads the dialogue up to client turn t and states the Client's current
    concerns, emotion and motivation (structured output through the engine's Caller, the
    backend's judge temperature, 0.3 by default); A0/At are the statements at turns 0 and t.
    The ``utterance`` dimension is kept as in cheap mode.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Literal

import anyio
import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field

from spasm.backends.base import Message
from spasm.evaluation.embeddings import FloatArray
from spasm.evaluation.llm import PROBE_ROLE, EvalSession
from spasm.evaluation.loader import Conversation
from spasm.evaluation.metrics import ConditionSummary, DriftPoint, PairedComparison
from spasm.evaluation.stats import finite, mean_ci, paired_test
from spasm.personas.persona import Persona
from spasm.registry import condition_rank

__all__ = [
    "DRIFT_DIMENSIONS",
    "PERSONA_DIMENSIONS",
    "UTTERANCE_DIMENSION",
    "DriftSeries",
    "StanceProbe",
    "cheap_drift",
    "condition_summaries",
    "dialogue_means",
    "drift_column",
    "drift_curves",
    "drift_from_anchor",
    "paired_comparisons",
    "persona_anchor_texts",
    "probe_drift",
    "references",
]

#: The persona dimensions of drift (the columns ``drift_<dimension>``), each anchored on the
#: persona field at the same place in :data:`spasm.personas.sources.DIMENSIONS` (the dimension
#: ``concerns`` on the field ``concern``).
PERSONA_DIMENSIONS: tuple[str, ...] = ("concerns", "emotion", "motivation")
UTTERANCE_DIMENSION = "utterance"
#: Every drift dimension, in reporting order: what metrics.json, the per-dialogue table, the
#: group stage and the report list.
DRIFT_DIMENSIONS: tuple[str, ...] = (UTTERANCE_DIMENSION, *PERSONA_DIMENSIONS)


def drift_column(dimension: str) -> str:
    """A dimension's per-dialogue (and per-seat) column: ``drift_<dimension>``."""
    return f"drift_{dimension}"


DriftSeries = dict[str, dict[str, npt.NDArray[np.float64]]]
"""dialogue_id -> dimension -> drift at each client turn (NaN where unavailable)."""

Embed = Callable[[list[str]], FloatArray]


def references(mode: Literal["cheap", "probe"]) -> dict[str, str]:
    """Human-readable definitions of A0 and At per dimension, stored in metrics.json."""
    refs = {
        UTTERANCE_DIMENSION: ("A0 = the Client's opening utterance; At = its utterance at client turn t"),
    }
    if mode == "cheap":
        refs["concerns"] = "A0 = the persona's stated concern; At = the Client's utterance at t"
        refs["emotion"] = "A0 = 'I feel <emotion> (<intensity>).' from the persona; At = utterance at t"
        refs["motivation"] = "A0 = the persona's stated motivation; At = the Client's utterance at t"
    else:
        for dim in PERSONA_DIMENSIONS:
            refs[dim] = f"A0/At = the Client's {dim} at client turns 0/t, stated by an LLM probe"
    return refs


_DIM_RANK = {UTTERANCE_DIMENSION: 0, **{d: i + 1 for i, d in enumerate(PERSONA_DIMENSIONS)}}


def _order(key: tuple[object, ...]) -> tuple[object, ...]:
    """Sort key: dimensions in reporting order, then ECP before CONCAT, then the rest."""
    dim = str(key[0])
    rest = tuple(condition_rank(k) if isinstance(k, str) else (0, k) for k in key[1:])
    return (_DIM_RANK.get(dim, 9), dim, *rest)


def drift_from_anchor(anchor: npt.ArrayLike, vectors: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """``1 − cos(anchor, v)`` for each row ``v`` (inputs need not be normalised)."""
    a = np.asarray(anchor, dtype=np.float64).reshape(-1)
    m = np.asarray(vectors, dtype=np.float64)
    if m.ndim == 1:
        m = m[None, :]
    denom = np.clip(np.linalg.norm(m, axis=1) * np.linalg.norm(a), 1e-12, None)
    cos = (m @ a) / denom
    # Rounding can push cos a hair past ±1; drift is defined on [0, 2].
    return np.asarray(np.clip(1.0 - cos, 0.0, 2.0), dtype=np.float64)


def _field(fields: Mapping[str, object], *names: str) -> str | None:
    for name in names:
        value = fields.get(name)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            continue
        if isinstance(value, (list, tuple, np.ndarray)):
            text = "; ".join(str(v) for v in value)
        else:
            text = str(value)
        if text.strip():
            return text.strip()
    return None


def persona_anchor_texts(fields: Mapping[str, object]) -> dict[str, str | None]:
    """The cheap-mode A0 text per persona dimension, from a persona's schema fields
    (:attr:`Persona.fields <spasm.personas.persona.Persona.fields>`; ``None`` when the field
    is absent)."""
    emotion = _field(fields, "emotion")
    intensity = _field(fields, "intensity", "emotion_intensity")
    if emotion is not None:
        emotion_text: str | None = f"I feel {emotion}" + (f" ({intensity})." if intensity else ".")
    else:
        emotion_text = None
    return {
        "concerns": _field(fields, "concern", "concerns"),
        "emotion": emotion_text,
        "motivation": _field(fields, "motivation", "motivations", "goal"),
    }


def cheap_drift(
    conversations: Sequence[Conversation],
    client_vectors: Mapping[str, FloatArray],
    personas: Mapping[str, Persona],
    embed: Embed,
) -> DriftSeries:
    """Cheap-mode drift for every conversation.

    Args:
        client_vectors: dialogue_id -> embeddings of the Client's utterances, in order.
        personas: persona_id -> its persona.
        embed: embeds the persona anchor texts (a few per persona).
    """
    anchors: dict[str, dict[str, str | None]] = {
        pid: persona_anchor_texts(p.fields) for pid, p in personas.items()}
    texts = sorted({t for a in anchors.values() for t in a.values() if t is not None})
    vecs = embed(texts) if texts else np.zeros((0, 0), dtype=np.float32)
    anchor_vec = {t: vecs[i] for i, t in enumerate(texts)}

    out: DriftSeries = {}
    for conv in conversations:
        client = client_vectors.get(conv.dialogue_id)
        if client is None or len(client) == 0:
            continue
        series = {UTTERANCE_DIMENSION: drift_from_anchor(client[0], client)}
        persona_anchor = anchors.get(conv.persona_id, {})
        for dim in PERSONA_DIMENSIONS:
            text = persona_anchor.get(dim)
            if text is None:
                series[dim] = np.full(len(client), np.nan)
            else:
                series[dim] = drift_from_anchor(anchor_vec[text], client)
        out[conv.dialogue_id] = series
    return out


class StanceProbe(BaseModel):
    """The probe's structured answer: the Client's current stance, one sentence each."""

    model_config = ConfigDict(extra="ignore")

    concerns: str = Field(min_length=1)
    emotion: str = Field(min_length=1)
    motivation: str = Field(min_length=1)


_PROBE_SYSTEM = (
    "You analyse conversations between a Client (a person seeking help) and a Responder. "
    "Read the conversation so far and describe the Client's stance as of its LAST message, "
    "in the Client's own first-person voice, one short sentence per field:\n"
    '- "concerns": what the Client is worried about or wants resolved right now;\n'
    '- "emotion": how the Client feels right now and how strongly;\n'
    '- "motivation": why the Client is pursuing this conversation.\n'
    'Reply with only a JSON object: {"concerns": "...", "emotion": "...", "motivation": "..."}'
)


def _probe_messages(conv: Conversation, upto: int) -> list[Message]:
    lines = [
        f"{'Client' if s == 'client' else 'Responder'}: {t}"
        for s, t in zip(conv.speakers[: upto + 1], conv.texts[: upto + 1], strict=True)
    ]
    return [
        {"role": "system", "content": _PROBE_SYSTEM},
        {"role": "user", "content": "Conversation so far:\n\n" + "\n\n".join(lines)},
    ]


async def probe_drift(
    conversations: Sequence[Conversation],
    client_vectors: Mapping[str, FloatArray],
    embed: Embed,
    llm: EvalSession,
    *,
    concurrency: int = 8,
    on_done: Callable[[int], None] | None = None,
) -> tuple[DriftSeries, int, int]:
    """Probe-mode drift: one structured call (role ``eval_probe``, plus at most one re-ask)
    per client turn, through the engine's :class:`~spasm.calls.Caller`.

    A turn whose probe never validates, or whose call fails, falls back to its utterance as
    the stance on every dimension (counted in the returned fallbacks). A dialogue's turns
    are probed one after another (they share its call scope); ``concurrency`` dialogues at
    once.

    Returns:
        ``(series, calls, fallbacks)``; ``calls`` counts every request (re-asks, retries and
        cache hits too).
    """
    stances: dict[tuple[str, int], dict[str, str]] = {}
    fallbacks = 0
    limiter = anyio.CapacityLimiter(concurrency)

    async def probe_dialogue(conv: Conversation) -> None:
        nonlocal fallbacks
        async with limiter:
            turns = [(i, t) for i, (s, t) in enumerate(zip(conv.speakers, conv.texts, strict=True))
                     if s == "client"]
            for k, (i, utterance) in enumerate(turns):
                parsed = await llm.structured(
                    PROBE_ROLE, conv.dialogue_id, _probe_messages(conv, i), StanceProbe
                )
                if parsed is None:
                    fallbacks += 1
                    stances[(conv.dialogue_id, k)] = {d: utterance for d in PERSONA_DIMENSIONS}
                else:
                    stances[(conv.dialogue_id, k)] = {
                        "concerns": parsed.concerns,
                        "emotion": parsed.emotion,
                        "motivation": parsed.motivation,
                    }
                if on_done is not None:
                    on_done(1)

    async with anyio.create_task_group() as tg:
        for conv in conversations:
            tg.start_soon(probe_dialogue, conv)

    texts = sorted({t for s in stances.values() for t in s.values()})
    vecs = embed(texts)
    index = {t: i for i, t in enumerate(texts)}
    out: DriftSeries = {}
    for conv in conversations:
        client = client_vectors.get(conv.dialogue_id)
        if client is None or len(client) == 0:
            continue
        n = len(client)
        series = {UTTERANCE_DIMENSION: drift_from_anchor(client[0], client)}
        for dim in PERSONA_DIMENSIONS:
            rows = vecs[[index[stances[(conv.dialogue_id, k)][dim]] for k in range(n)]]
            series[dim] = drift_from_anchor(rows[0], rows)
        out[conv.dialogue_id] = series
    return out, llm.calls(PROBE_ROLE), fallbacks


def dialogue_means(series: DriftSeries) -> dict[str, dict[str, float]]:
    """Per-dialogue mean drift over client turns t >= 1 (NaN for one-turn dialogues).

    Turn 0 is left out because it is 0 by construction for anchors taken at turn 0.
    """
    out: dict[str, dict[str, float]] = {}
    for did, dims in series.items():
        out[did] = {}
        for dim, values in dims.items():
            tail = values[1:]
            tail = tail[np.isfinite(tail)]
            out[did][dim] = float(tail.mean()) if tail.size else math.nan
    return out


def drift_curves(
    series: DriftSeries, conversations: Iterable[Conversation], max_turns: int = 25
) -> list[DriftPoint]:
    """Mean ± 95% CI of drift per dimension, condition and client turn."""
    buckets: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    for conv in conversations:
        dims = series.get(conv.dialogue_id)
        if dims is None:
            continue
        for dim, curve in dims.items():
            for t, v in enumerate(curve[:max_turns]):
                if math.isfinite(float(v)):
                    buckets[(dim, conv.condition, t)].append(float(v))
    points = []
    for (dim, cond, t), values in sorted(buckets.items(), key=lambda kv: _order(kv[0])):
        mean, low, high, n = mean_ci(values)
        points.append(
            DriftPoint(dimension=dim, condition=cond, turn=t, n=n, mean=mean, ci_low=low, ci_high=high)
        )
    return points


def condition_summaries(
    means: Mapping[str, Mapping[str, float]], conversations: Iterable[Conversation]
) -> list[ConditionSummary]:
    """Per-dialogue mean drift summarised per dimension and condition."""
    buckets: dict[tuple[str, str], list[float]] = defaultdict(list)
    for conv in conversations:
        for dim, value in means.get(conv.dialogue_id, {}).items():
            buckets[(dim, conv.condition)].append(value)
    out = []
    for (dim, cond), values in sorted(buckets.items(), key=lambda kv: _order(kv[0])):
        mean, low, high, n = mean_ci(values)
        out.append(
            ConditionSummary(
                dimension=dim,
                condition=cond,
                n_dialogues=n,
                mean=finite(mean),
                ci_low=finite(low),
                ci_high=finite(high),
            )
        )
    return out


def paired_comparisons(
    means: Mapping[str, Mapping[str, float]], conversations: Sequence[Conversation]
) -> list[PairedComparison]:
    """ECP − CONCAT per dimension, overall and per pairing.

    Dialogues are paired on (persona_id, conversation_index, pairing, harness_level); when
    a key has several dialogues of one condition, their means are averaged first.
    """
    dims = sorted({d for m in means.values() for d in m}, key=lambda d: _order((d,)))
    cells: dict[tuple[str, str, int, str, str], dict[str, list[float]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for conv in conversations:
        if conv.condition not in ("ecp", "concat") or conv.dialogue_id not in means:
            continue
        key = (
            conv.pairing,
            conv.persona_id,
            conv.conversation_index,
            conv.harness_level,
            conv.condition,
        )
        for dim in dims:
            cells[key][dim].append(means[conv.dialogue_id].get(dim, math.nan))

    def cell_mean(values: list[float]) -> float:
        finite = [v for v in values if math.isfinite(v)]
        return float(np.mean(finite)) if finite else math.nan

    pairings = sorted({k[0] for k in cells})
    out: list[PairedComparison] = []
    for dim in dims:
        for scope in ["all", *pairings]:
            ecp: list[float] = []
            concat: list[float] = []
            for key, by_dim in cells.items():
                if key[4] != "ecp" or (scope != "all" and key[0] != scope):
                    continue
                partner = cells.get((*key[:4], "concat"))
                if partner is None:
                    continue
                ecp.append(cell_mean(by_dim[dim]))
                concat.append(cell_mean(partner[dim]))
            res = paired_test(ecp, concat)
            if scope != "all" and len(pairings) == 1:
                continue  # identical to "all"
            out.append(
                PairedComparison(
                    dimension=dim,
                    pairing=scope,
                    n_pairs=int(res["n_pairs"] or 0),
                    mean_ecp=finite(res["mean_a"]),
                    mean_concat=finite(res["mean_b"]),
                    delta=finite(res["delta"]),
                    delta_ci_low=finite(res["delta_ci_low"]),
                    delta_ci_high=finite(res["delta_ci_high"]),
                    cohen_d=finite(res["cohen_d"]),
                    p_ttest=finite(res["p_ttest"]),
                    p_wilcoxon=finite(res["p_wilcoxon"]),
                    note=None if res["note"] is None else str(res["note"]),
                )
            )
    return out
