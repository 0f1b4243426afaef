"""Layer 4, behaviour-example retrieval (docs/harness.md, "The layers").

Candidates are the agent's own accepted utterances in this dialogue plus an optional corpus
(JSONL, one example per line: ``{"text": ..., "speaker": "client", "intent": ..., "emotion":
..., "relation": ..., "act": ..., "scene": ...}``; missing features are inferred). A query picks
4–5 of them in two steps:

1. a fast lexical pre-filter keeps the top :data:`PREFILTER` (50) by word overlap with what was
   just said;
2. a re-rank by the weighted five-dimension match of :data:`WEIGHTS`: intent 30%, emotion 25%,
   relation stage 20%, dialogue act 15%, scene 10%. Ties go to the lexical score, then to the
   most recent example.

An utterance still inside the verbatim window is never offered as an example: the agent sees
it already, and showing it twice invites copying.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from spasm.errors import ConfigError
from spasm.harness.context import INTENTS, classify_intent, content_words, dialogue_act
from spasm.harness.state import EMOTIONS, NEUTRAL, AgentState

__all__ = [
    "PREFILTER",
    "WEIGHTS",
    "Example",
    "Query",
    "dominant_emotion",
    "lexical_prefilter",
    "load_corpus",
    "match_score",
    "relation_stage",
    "rerank",
    "retrieve",
    "scene_of",
]

WEIGHTS: dict[str, float] = {
    "intent": 0.30, "emotion": 0.25, "relation": 0.20, "act": 0.15, "scene": 0.10,
}
PREFILTER = 50

#: Plutchik's wheel, in order: neighbours on it half-match.
_WHEEL = ("joy", "trust", "fear", "surprise", "sadness", "disgust", "anger", "anticipation")
_STAGES = ("distant", "neutral", "warm")
_SCENES = ("opening", "middle", "late")


@dataclass(frozen=True)
class Example:
    """One in-character utterance and the situation it was said in."""

    text: str
    intent: str
    emotion: str
    relation: str
    act: str
    scene: str
    source: str = "own"
    #: Position in the dialogue (own examples); ``-1`` for corpus examples.
    index: int = -1


@dataclass(frozen=True)
class Query:
    """The situation the next utterance is for."""

    text: str
    intent: str
    emotion: str
    relation: str
    act: str
    scene: str


def dominant_emotion(state: AgentState) -> str:
    """The emotion furthest above neutral, or ``neutral`` when none stands out."""
    best = max(EMOTIONS, key=lambda e: getattr(state.emotions, e))
    return best if getattr(state.emotions, best) >= NEUTRAL + 10 else "neutral"


def relation_stage(state: AgentState) -> str:
    """distant / neutral / warm, from trust and friendliness."""
    v = (state.relation.trust + state.relation.friendliness) / 2
    return "distant" if v < 40 else "warm" if v > 62 else "neutral"


def scene_of(n_utterances: int, max_utterances: int) -> str:
    """Where in the conversation we are: opening, middle or late."""
    if n_utterances < 4:
        return "opening"
    return "late" if n_utterances >= 0.7 * max_utterances else "middle"


def _ordinal(a: str, b: str, scale: Sequence[str], wrap: bool = False) -> float:
    if a == b:
        return 1.0
    if a not in scale or b not in scale:
        return 0.0
    d = abs(scale.index(a) - scale.index(b))
    if wrap:
        d = min(d, len(scale) - d)
    return 0.5 if d == 1 else 0.0


def match_score(query: Query, ex: Example) -> float:
    """The weighted five-dimension match in [0, 1]; adjacent values (emotion on Plutchik's wheel,
    relation stage, scene) count half."""
    return (
        WEIGHTS["intent"] * (query.intent == ex.intent)
        + WEIGHTS["emotion"] * _ordinal(query.emotion, ex.emotion, _WHEEL, wrap=True)
        + WEIGHTS["relation"] * _ordinal(query.relation, ex.relation, _STAGES)
        + WEIGHTS["act"] * (query.act == ex.act)
        + WEIGHTS["scene"] * _ordinal(query.scene, ex.scene, _SCENES)
    )


def lexical_prefilter(
    text: str, candidates: Sequence[Example], k: int = PREFILTER
) -> list[tuple[float, Example]]:
    """The ``k`` candidates sharing most words with ``text`` (Jaccard), best first, stable."""
    q = set(content_words(text))
    scored: list[tuple[float, int, Example]] = []
    for i, ex in enumerate(candidates):
        words = set(content_words(ex.text))
        union = q | words
        scored.append((len(q & words) / len(union) if union else 0.0, i, ex))
    scored.sort(key=lambda x: (-x[0], x[1]))
    return [(s, ex) for s, _, ex in scored[:k]]


def rerank(query: Query, shortlist: Iterable[tuple[float, Example]]) -> list[Example]:
    """Order the shortlist by match score, then lexical score, then recency."""
    ranked = sorted(shortlist, key=lambda x: (-match_score(query, x[1]), -x[0], -x[1].index))
    return [ex for _, ex in ranked]


def retrieve(
    query: Query,
    candidates: Sequence[Example],
    *,
    k: int = 4,
    prefilter: int = PREFILTER,
    exclude_texts: Iterable[str] = (),
) -> list[Example]:
    """The ``k`` best examples for ``query``: lexical top ``prefilter``, then the weighted re-rank."""
    banned = {t.strip() for t in exclude_texts}
    pool = [c for c in candidates if c.text.strip() and c.text.strip() not in banned]
    unique: dict[str, Example] = {}
    for c in pool:
        unique.setdefault(c.text.strip(), c)
    return rerank(query, lexical_prefilter(query.text, list(unique.values()), prefilter))[:k]


@lru_cache(maxsize=8)
def _read_corpus(path: str) -> tuple[tuple[str, dict[str, str]], ...]:
    rows: list[tuple[str, dict[str, str]]] = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ConfigError(f"harness.corpus: cannot read {path}: {exc.strerror}") from None
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            text = str(data["text"])
        except (json.JSONDecodeError, KeyError, TypeError):
            raise ConfigError(
                f"harness.corpus: {path} line {n} is not a JSON object with a 'text' field"
            ) from None
        rows.append((text, {k: str(v) for k, v in data.items() if k != "text"}))
    return tuple(rows)


def load_corpus(path: str, speaker: str) -> list[Example]:
    """The corpus examples for one speaker (lines without ``speaker`` are the Client's)."""
    out: list[Example] = []
    for text, f in _read_corpus(path):
        if f.get("speaker", "client") != speaker:
            continue
        intent = f.get("intent") if f.get("intent") in INTENTS else classify_intent(text)
        out.append(
            Example(
                text=text, intent=str(intent), emotion=f.get("emotion", "neutral"),
                relation=f.get("relation", "neutral"), act=f.get("act") or dialogue_act(text),
                scene=f.get("scene", "middle"), source="corpus",
            )
        )
    return out


def render_examples(examples: Sequence[Example]) -> str:
    """The examples block of the prompt."""
    lines = ["Examples of how you speak (stay in this voice; do not copy them word for word):"]
    lines.extend(f"- {ex.text[:120]}" for ex in examples)
    return "\n".join(lines)
