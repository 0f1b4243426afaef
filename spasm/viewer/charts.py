"""Small SVG line charts of the harness state per turn (emotions, relation, goal progress).

Pure functions from the turns' stored ``state`` JSON to chart geometry; the template draws the
SVG. Only numbers go into the geometry; labels (goal descriptions are model text) are escaped
by the template like every other text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Chart", "Line", "harness_charts"]

WIDTH, HEIGHT, PAD = 340, 130, 22
EMOTIONS = ("joy", "sadness", "anger", "fear", "trust", "surprise", "disgust", "anticipation")
RELATION = ("trust", "intimacy", "dominance", "friendliness")


@dataclass(frozen=True)
class Line:
    """One series: its label, SVG polyline points and colour slot (0-7)."""

    label: str
    points: str
    colour: int
    last: float


@dataclass(frozen=True)
class Chart:
    """One chart of 0-100 values over the turns of one speaker."""

    title: str
    lines: list[Line]
    #: (x, label) of the turn ticks
    ticks: list[tuple[float, str]]
    width: int = WIDTH
    height: int = HEIGHT
    pad: int = PAD


def _state(raw: Any) -> dict[str, Any] | None:
    if not isinstance(raw, str) or not raw:
        return None
    try:
        data = json.loads(raw)
    except json.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return max(0.0, min(100.0, float(value)))


def _chart(title: str, xs: Sequence[int], series: Mapping[str, Sequence[float | None]]) -> Chart | None:
    if not xs:
        return None
    lo, hi = min(xs), max(xs)
    span = max(hi - lo, 1)

    def x_of(t: int) -> float:
        return round(PAD + (t - lo) / span * (WIDTH - 2 * PAD), 1)

    def y_of(v: float) -> float:
        return round(HEIGHT - PAD - v / 100 * (HEIGHT - 2 * PAD), 1)

    lines = []
    for i, (label, values) in enumerate(series.items()):
        pts = [(x_of(t), y_of(v)) for t, v in zip(xs, values, strict=True) if v is not None]
        if not pts:
            continue
        last = next(v for v in reversed(values) if v is not None)
        lines.append(Line(label, " ".join(f"{x},{y}" for x, y in pts), i % 8, last))
    if not lines:
        return None
    step = max(1, len(xs) // 8)
    ticks = [(x_of(t), str(t)) for t in xs[::step]]
    return Chart(title, lines, ticks)


def harness_charts(turns: Sequence[Mapping[str, Any]]) -> dict[str, list[Chart]]:
    """Per speaker, the charts of its state after each of its turns (empty: no stored state)."""
    out: dict[str, list[Chart]] = {}
    for speaker in ("client", "responder"):
        states = [(int(t["turn_index"]), s) for t in turns if t.get("speaker") == speaker
                  if (s := _state(t.get("state"))) is not None]
        if not states:
            continue
        xs = [t for t, _ in states]
        emotions = {e: [_number((s.get("emotions") or {}).get(e)) for _, s in states] for e in EMOTIONS}
        relation = {r: [_number((s.get("relation") or {}).get(r)) for _, s in states] for r in RELATION}
        goals: dict[str, list[float | None]] = {}
        for k, (_, s) in enumerate(states):
            for goal in s.get("goals") or []:
                if isinstance(goal, dict) and isinstance(goal.get("description"), str):
                    goals.setdefault(goal["description"], [None] * len(states))[k] = _number(
                        goal.get("progress"))
        charts = [_chart("Emotions (Plutchik, 0-100)", xs, emotions),
                  _chart("Relation to the partner", xs, relation),
                  _chart("Goal progress", xs, dict(list(goals.items())[:8]))]
        out[speaker] = [c for c in charts if c is not None]
    return out
