"""The harness evaluation's metrics, per dialogue, and their confidence intervals per level.

Every metric is a *ratio of sums over dialogues*: each dialogue contributes a numerator and a
denominator (:func:`dialogue_metrics`), a level's value is ``Σ num / Σ den`` over its
dialogues, and its 95% interval is a percentile bootstrap over dialogues
(:func:`estimate`: :data:`RESAMPLES` resamples drawn with a fixed seed, so a report is
reproducible). A rate pools its events (a dialogue with more checked turns weighs more), a
per-turn figure pools turns, a per-dialogue figure has one unit per dialogue. A metric whose
denominator is 0 at a level does not exist there (no state below level C, no verdicts without
a checker or audit, no probes without ``harness.recall_probe``) and is ``None`` ("n/a"), not 0.
:data:`DEFINITIONS` says what each metric counts; docs/harness.md repeats it.
"""

from __future__ import annotations

import itertools
import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from spasm.dataset.columns import (
    DIMENSIONS,
    CheckerVerdict,
    Probe,
    load_probes,
    load_state,
    load_state_log,
    load_verdict,
)
from spasm.dataset.persona_rows import persona_of
from spasm.harness.context import classify_intent, content_words, dialogue_act
from spasm.harness.levels import LEVELS, layers
from spasm.harness.policy import CharacterPolicy, baseline_client_policy, parse_stored_policy
from spasm.harness.state import MAX_STEP
from spasm.personas.persona import Persona

__all__ = [
    "DEFINITIONS", "MEASUREMENT_ROLES", "ONE_OFF_ROLES", "RESAMPLES", "adjusted_tokens",
    "decision_consistency", "dialogue_metrics", "estimate", "level_estimates", "recall_by_depth",
    "style_consistency", "style_similarity",
]

#: Roles that exist only to measure (reported apart from a level's cost).
MEASUREMENT_ROLES = frozenset({"audit", "probe", "persona_probe"})
#: Roles run once per persona per run, whichever dialogue triggered them.
ONE_OFF_ROLES = frozenset({"policy"})
RESAMPLES = 1000
_SEED = 0

DEFINITIONS: dict[str, str] = {
    "boundary_violation_rate": "accepted replies whose verdict (checker at E, audit below) "
    "breached a boundary / replies with a verdict",
    "decision_consistency": "per agent, turns grouped by situation (the dialogue's intent, by "
    "the rule classifier over the Client's messages so far, + the dialogue act of the "
    "partner's last message); share of turns, in situations met at least twice, whose reply "
    "act is the situation's most frequent one",
    "state_jump_rate": "state turns where the reducer proposed a change beyond the per-turn "
    f"limit (|proposed - previous| > {MAX_STEP}) / state turns",
    "state_clip_rate": "state turns where a hard constraint clipped a proposed value / state turns",
    "state_clips_per_turn": "clipped values / state turns",
    "state_step_violation_rate": "consecutive stored states of an agent with any value moved "
    f"more than {MAX_STEP} / pairs of consecutive states (0 when the constraints hold)",
    "style_similarity": "Client: cosine of word-count profiles (function words, ?, ! and the "
    "5-letter stems of the references' content words) of its turns and of its policy's "
    "speech patterns and style rules (personas.policy, else the baseline policy)",
    "style_consistency": "per agent, cosine of function-word profiles of the first and second "
    "half of its turns",
    "recall": "probes: share of the probed partner message's first content words the answer "
    "contains (5-letter stems), all depths",
    "recall_out_of_window": "recall of the probes whose message had left the verbatim window",
    "latency_s_per_turn": "seconds of the level's calls (measurement and policy calls excluded) "
    "/ utterances",
    "tokens_per_turn": "prompt + completion tokens of the level's calls / utterances",
    "tokens_per_dialogue": "prompt + completion tokens of the level's calls per dialogue",
    "cache_adjusted_tokens_per_dialogue": "tokens with cached prompt tokens at their price "
    "relative to an input token (see cost_source)",
    "fallback_turn_share": "turns with at least one harness fallback / turns (levels with a "
    "harness layer or an audit)",
    "fallbacks_per_turn": "harness fallbacks / turns (same levels)",
}

_FUNCTION_WORDS = (
    "i", "me", "my", "you", "your", "we", "it", "is", "am", "are", "was", "the", "a", "an", "and",
    "but", "so", "or", "because", "if", "then", "just", "really", "very", "not", "no", "yes", "please",
    "thanks", "thank", "sorry", "well", "oh", "okay", "maybe", "actually", "also", "that", "this",
    "what", "how", "why", "when", "can", "could", "would", "should", "will", "do", "does", "did",
    "have", "has", "had",
)
_MARKS = ("?", "!")
_TOKEN = re.compile(r"[a-z][a-z']*|[?!]")


# -- confidence intervals ---------------------------------------------------------------------


def estimate(num: Sequence[float] | np.ndarray, den: Sequence[float] | np.ndarray,
             resamples: np.ndarray | None = None) -> dict[str, Any] | None:
    """``Σ num / Σ den`` over dialogues with a 95% percentile-bootstrap interval over them.

    ``resamples`` (rows of dialogue indices) lets the metrics of one level share their draws;
    by default :data:`RESAMPLES` are drawn with a fixed seed. ``None`` when ``Σ den`` is 0.
    """
    n = np.asarray(num, dtype=float)
    d = np.asarray(den, dtype=float)
    total = d.sum()
    if not len(d) or total <= 0:
        return None
    if resamples is None:
        resamples = np.random.default_rng(_SEED).integers(0, len(d), size=(RESAMPLES, len(d)))
    dens = d[resamples].sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        stats = n[resamples].sum(axis=1) / dens
    stats = stats[np.isfinite(stats)]
    lo, hi = np.percentile(stats, [2.5, 97.5])
    return {"value": round(float(n.sum() / total), 4), "ci95": [round(float(lo), 4),
            round(float(hi), 4)], "n": int((d > 0).sum())}


def level_estimates(per_dialogue: pd.DataFrame) -> dict[str, dict[str, Any] | None]:
    """Every ``<name>__num`` / ``<name>__den`` pair of ``per_dialogue`` (one level's dialogues)
    as an :func:`estimate`, all on the same bootstrap draws."""
    rows = len(per_dialogue)
    draws = np.random.default_rng(_SEED).integers(0, max(rows, 1), size=(RESAMPLES, rows))
    names = [c[: -len("__num")] for c in per_dialogue.columns if c.endswith("__num")]
    return {
        name: estimate(per_dialogue[f"{name}__num"].to_numpy(),
                       per_dialogue[f"{name}__den"].to_numpy(), draws)
        for name in names
    }


# -- the metrics' pieces ----------------------------------------------------------------------


def _counts(texts: Iterable[str], vocabulary: Sequence[str]) -> list[float]:
    counts = Counter(_TOKEN.findall(" ".join(texts).lower()))
    return [float(counts[w]) for w in vocabulary]


def _cosine(a: list[float], b: list[float]) -> float | None:
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(x * x for x in b))
    if not na or not nb:
        return None
    return sum(x * y for x, y in zip(a, b, strict=True)) / (na * nb)


def style_consistency(texts: list[str]) -> float | None:
    """Cosine between the function-word profiles of the first and second half of ``texts``."""
    if len(texts) < 4:
        return None
    half = len(texts) // 2
    vocabulary = (*_FUNCTION_WORDS, *_MARKS)
    return _cosine(_counts(texts[:half], vocabulary), _counts(texts[half:], vocabulary))


def _stemmed(texts: Iterable[str]) -> list[str]:
    return [w[:5] for t in texts for w in content_words(t)]


def style_similarity(texts: list[str], references: list[str]) -> float | None:
    """Cosine of the word-count profiles of ``texts`` and ``references`` over the function
    words, ``?``/``!`` and the references' content stems; ``None`` without either side."""
    if not texts or not references:
        return None
    stems = sorted(set(_stemmed(references)))
    vocabulary = (*_FUNCTION_WORDS, *_MARKS)
    theirs = _counts(references, vocabulary) + [float(c) for c in _stem_counts(references, stems)]
    ours = _counts(texts, vocabulary) + [float(c) for c in _stem_counts(texts, stems)]
    if not any(theirs):
        return None
    return _cosine(ours, theirs) or 0.0  # an agent that shares nothing is dissimilar, not n/a


def _stem_counts(texts: Iterable[str], stems: Sequence[str]) -> list[int]:
    counts = Counter(w[:5] for t in texts for w in _TOKEN.findall(t.lower()) if len(w) >= 4)
    return [counts[s] for s in stems]


def decision_consistency(speakers: Sequence[str], texts: Sequence[str]) -> tuple[int, int]:
    """``(turns answering their situation's modal way, turns in situations met twice)`` of one
    dialogue, both agents (see :data:`DEFINITIONS`)."""
    intent = None
    seen: dict[tuple[str, str | None, str], Counter[str]] = {}
    last: dict[str, str] = {}
    for speaker, text in zip(speakers, texts, strict=True):
        partner = "responder" if speaker == "client" else "client"
        if partner in last:
            key = (speaker, intent, dialogue_act(last[partner]))
            seen.setdefault(key, Counter())[dialogue_act(text)] += 1
        if speaker == "client":
            intent = classify_intent(text, intent)
        last[speaker] = text
    repeated = [c for c in seen.values() if sum(c.values()) >= 2]
    return sum(max(c.values()) for c in repeated), sum(sum(c.values()) for c in repeated)


def _style_references(persona: Persona | None, responder_role: str) -> list[str]:
    if persona is None:
        return []
    policy: CharacterPolicy | None = parse_stored_policy(persona)
    if policy is None:
        policy = baseline_client_policy(persona, responder_role)
    return [*policy.speech_patterns, *policy.style_rules]


def _verdicts(raw: Iterable[Any]) -> list[CheckerVerdict]:
    return [v for cell in raw if (v := load_verdict(cell)) is not None]


def _state_metrics(g: pd.DataFrame) -> dict[str, float]:
    states = g[g.state.notna()]
    jumps = clips = clipped = 0
    for raw in states.state_log:
        log = load_state_log(raw)
        found = log.clips if log is not None else []
        clips += len(found)
        clipped += bool(found)
        jumps += any(c.proposed is not None and abs(c.proposed - c.previous) > MAX_STEP
                     for c in found)
    pairs = steps = 0
    for _, own in states.groupby("speaker"):
        parsed = [s for raw in own.state if (s := load_state(raw)) is not None]
        for a, b in itertools.pairwise(parsed):
            pairs += 1
            steps += any(abs(a.value(d) - b.value(d)) > MAX_STEP for d in DIMENSIONS)
    n = float(len(states))
    return {"state_jump_rate__num": jumps, "state_jump_rate__den": n,
            "state_clip_rate__num": clipped, "state_clip_rate__den": n,
            "state_clips_per_turn__num": clips, "state_clips_per_turn__den": n,
            "state_step_violation_rate__num": steps, "state_step_violation_rate__den": pairs}


def _probe_metrics(g: pd.DataFrame, n_utterances: int) -> tuple[dict[str, float], list[Probe]]:
    probes = [p for raw in g.probe for p in load_probes(raw, n_utterances)]
    scored = [p.recall for p in probes if p.recall is not None]
    out_of = [p.recall for p in probes if p.recall is not None and p.in_window is False]
    return {"recall__num": sum(scored), "recall__den": len(scored),
            "recall_out_of_window__num": sum(out_of),
            "recall_out_of_window__den": len(out_of)}, probes


# -- per dialogue -----------------------------------------------------------------------------


def adjusted_tokens(
    cost: pd.DataFrame, turns: pd.DataFrame, backends: dict[str, Any], cache_discount: float
) -> tuple[pd.Series, str]:
    """Cache-adjusted tokens per dialogue of the level-cost calls ``cost``, and the source.

    ``api``: when any call reports ``calls.cached_tokens``, those tokens are billed at the
    backend's cached input price relative to its input price (``prices``; not discounted when
    it sets an input price but no cached one), or at ``1 - cache_discount`` when it sets no
    prices. ``estimate``: otherwise spasm's prefix estimate ``turns.cached_prompt_tokens`` is
    billed at ``1 - cache_discount``.
    """
    raw = cost.prompt_tokens + cost.completion_tokens
    if "cached_tokens" in cost and cost.cached_tokens.fillna(0).sum() > 0:
        relative = cost.backend.map(lambda b: _cached_price(backends.get(b), cache_discount))
        cached = np.minimum(cost.cached_tokens.fillna(0), cost.prompt_tokens)
        adjusted = raw - cached * (1 - relative.astype(float))
        return adjusted.groupby(cost.dialogue_id).sum(), "api"
    estimate_ = turns.groupby("dialogue_id").cached_prompt_tokens.sum()
    tokens = raw.groupby(cost.dialogue_id).sum()
    return tokens.sub(cache_discount * estimate_.reindex(tokens.index).fillna(0)), "estimate"


def _cached_price(backend: dict[str, Any] | None, cache_discount: float) -> float:
    prices = (backend or {}).get("prices") or {}
    if not prices.get("input_per_1m"):
        return 1 - cache_discount
    cached = prices.get("cached_input_per_1m")
    return 1.0 if cached is None else float(cached) / float(prices["input_per_1m"])


def _harnessed(label: str, verdicts: list[CheckerVerdict]) -> bool:
    return any(lv in LEVELS and layers(lv).any for lv in label.split("/")) or bool(verdicts)


def _behaviour(g: pd.DataFrame, label: str, references: list[str]) -> dict[str, float]:
    """The numerators and denominators one dialogue's turns ``g`` give (cost comes apart)."""
    n = float(len(g))
    checked = _verdicts(g.checker_verdict)
    verdicts = [v for v in checked if v.passed is not None]
    consistent, grouped = decision_consistency(list(g.speaker), list(g.text))
    similar = style_similarity(list(g[g.speaker == "client"].text), references)
    halves = [s for _, own in g.groupby("speaker")
              if (s := style_consistency(list(own.text))) is not None]
    harnessed = n if _harnessed(label, checked) else 0.0
    fallbacks = g.harness_fallbacks.fillna(0)
    return {
        "boundary_violation_rate__num": sum(bool(v.boundary_violation) for v in verdicts),
        "boundary_violation_rate__den": len(verdicts),
        "decision_consistency__num": consistent, "decision_consistency__den": grouped,
        "style_similarity__num": similar or 0.0, "style_similarity__den": similar is not None,
        "style_consistency__num": sum(halves), "style_consistency__den": len(halves),
        "fallback_turn_share__num": float((fallbacks > 0).sum()) if harnessed else 0.0,
        "fallback_turn_share__den": harnessed,
        "fallbacks_per_turn__num": float(fallbacks.sum()) if harnessed else 0.0,
        "fallbacks_per_turn__den": harnessed,
        **_state_metrics(g),
    }


def dialogue_metrics(
    dialogues: pd.DataFrame, turns: pd.DataFrame, calls: pd.DataFrame,
    personas: pd.DataFrame | None, run_config: dict[str, Any] | None, cache_discount: float,
) -> tuple[pd.DataFrame, dict[str, list[Probe]], str]:
    """One row per dialogue of ``<metric>__num`` / ``__den`` columns, each dialogue's probes
    (for recall by depth) and the source of the cache-adjusted cost (``api`` or ``estimate``)."""
    config = run_config or {}
    role = (config.get("dialogue") or {}).get("responder_role") or "assistant"
    people: dict[str, Persona] = {} if personas is None else {
        (persona := persona_of(p, place=i)).id: persona
        for i, p in enumerate(personas.to_dict("records"))
    }
    cost = calls[~calls.role.isin(MEASUREMENT_ROLES | ONE_OFF_ROLES)]
    adjusted, source = adjusted_tokens(cost, turns, config.get("backends") or {}, cache_discount)
    tokens = (cost.prompt_tokens + cost.completion_tokens).groupby(cost.dialogue_id).sum()
    latency = cost.latency_s.groupby(cost.dialogue_id).sum()
    by_dialogue = dict(iter(turns.sort_values(["dialogue_id", "turn_index"]).groupby("dialogue_id")))
    rows: list[dict[str, float]] = []
    probes: dict[str, list[Probe]] = {}
    for d in dialogues.to_dict("records"):
        did = str(d["dialogue_id"])
        g = by_dialogue.get(did, turns.iloc[0:0])
        n = float(len(g))
        references = _style_references(people.get(str(d["persona_id"])), role)
        recall_cols, probes[did] = _probe_metrics(g, int(d["n_utterances"]))
        rows.append({
            **_behaviour(g, str(d["harness_level"]), references),
            **recall_cols,
            "latency_s_per_turn__num": float(latency.get(did, 0.0)), "latency_s_per_turn__den": n,
            "tokens_per_turn__num": float(tokens.get(did, 0)), "tokens_per_turn__den": n,
            "tokens_per_dialogue__num": float(tokens.get(did, 0)), "tokens_per_dialogue__den": 1.0,
            "cache_adjusted_tokens_per_dialogue__num": float(adjusted.get(did, 0)),
            "cache_adjusted_tokens_per_dialogue__den": 1.0,
        })
    frame = pd.DataFrame(rows, index=pd.Index(list(dialogues.dialogue_id), name="dialogue_id"))
    return frame.astype(float), probes, source


def recall_by_depth(dialogue_ids: Sequence[str], probes: dict[str, list[Probe]]) -> dict[str, Any]:
    """Recall per probe depth of the dialogues ``dialogue_ids`` (an :func:`estimate` over
    them), with how many probes, how far from the end their messages were on average
    (utterances said after them) and the share still in the agent's verbatim window."""
    mine = {did: probes.get(did, []) for did in dialogue_ids}
    depths = sorted({p.depth for ps in mine.values() for p in ps})
    out: dict[str, Any] = {}
    for depth in depths:
        num: list[float] = []
        den: list[int] = []
        at: list[Probe] = []
        for here in mine.values():
            here = [p for p in here if p.depth == depth]
            scored = [p.recall for p in here if p.recall is not None]
            num.append(sum(scored))
            den.append(len(scored))
            at += here
        distances = [p.distance for p in at if p.distance is not None]
        windows = [p.in_window for p in at if p.in_window is not None]
        out[f"{depth:g}"] = {
            "recall": estimate(num, den),
            "probes": len(at),
            "mean_distance": round(sum(distances) / len(distances), 1) if distances else None,
            "in_window_share": round(sum(windows) / len(windows), 4) if windows else None,
        }
    return out
