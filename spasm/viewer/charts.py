"""Small SVG line charts of the harness state per turn (emotions, relation, goal progress).

Pure functions from the turns' stored ``state`` (:class:`~spasm.dataset.columns.AgentState`,
its dimensions declared there) to chart geometry; the template draws the SVG. Only numbers go
into the geometry; labels (goal descriptions are model text) are escaped by the template like
every other text. A state cell that does not parse is left out of the charts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from spasm.dataset.columns import EMOTIONS, RELATION, AgentState, load_state
from spasm.errors import FormatError

__all__ = ["Chart", "Line", "harness_charts"]

WIDTH, HEIGHT, PAD = 340, 130, 22


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


def _state(raw: Any) -> AgentState | None:
    try:
        return load_state(raw)
    except FormatError:
        return None


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
        emotions: dict[str, list[float | None]] = {
            e: [float(getattr(s.emotions, e)) for _, s in states] for e in EMOTIONS}
        relation: dict[str, list[float | None]] = {
            r: [float(getattr(s.relation, r)) for _, s in states] for r in RELATION}
        goals: dict[str, list[float | None]] = {}
        for k, (_, s) in enumerate(states):
            for goal in s.goals:
                goals.setdefault(goal.description, [None] * len(states))[k] = float(goal.progress)
        charts = [_chart("Emotions (Plutchik, 0-100)", xs, emotions),
                  _chart("Relation to the partner", xs, relation),
                  _chart("Goal progress", xs, dict(list(goals.items())[:8]))]
        out[speaker] = [c for c in charts if c is not None]
    return out
