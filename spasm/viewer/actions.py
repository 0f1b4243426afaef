"""What the dialogue page shows of agents that act (tests/test_viewer_tools.py), built from a
:class:`~spasm.dataset.DialogueView` of a run with an ``events`` table.

Pure functions, like :mod:`spasm.viewer.pages`: each turn's tool calls, results and notices
inline before the utterance they belong to, each with who could see it (its actor and
``visible_to``) and what every other participant was shown instead (the notice, or nothing);
the world at the end beside the gold world as a diff of JSON paths. Nothing here produces
markup: the template escapes every value.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from spasm.dataset import DialogueView

__all__ = ["EventView", "WorldDiff", "WorldView", "event_views", "participants_of", "world_view"]


@dataclass(frozen=True)
class EventView:
    """One event as the page shows it."""

    seq: int
    kind: str
    actor: str
    tool: str | None
    call_id: str | None
    #: The arguments or the result, pretty-printed JSON (or the text as stored).
    payload: str | None
    error: str | None
    notice: str | None
    #: Who could see the event (the actor first), and who could not.
    seen_by: list[str]
    hidden_from: list[str]


@dataclass(frozen=True)
class WorldDiff:
    """One JSON path where the final world and the gold world differ."""

    path: str
    final: str
    gold: str


@dataclass
class WorldView:
    """The world at the end and the gold world, with their differences."""

    final: str
    final_sha256: str
    gold: str | None = None
    gold_sha256: str | None = None
    initial_sha256: str | None = None
    changes: int = 0
    diff: list[WorldDiff] = field(default_factory=list)

    @property
    def match(self) -> bool | None:
        """Whether the final world is the gold one (``None``: no gold world)."""
        return None if self.gold_sha256 is None else self.final_sha256 == self.gold_sha256


def _pretty(text: object) -> str | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False, sort_keys=True)
    except json.JSONDecodeError:
        return text


def participants_of(view: DialogueView) -> list[str]:
    """The dialogue's participants: its seats in turn order, else client and responder."""
    if view.participants:
        return [str(p["participant_id"]) for p in sorted(view.participants,
                                                         key=lambda p: int(p["position"]))]
    return ["client", "responder"]


def _visible(row: dict[str, Any]) -> list[str]:
    try:
        visible = json.loads(str(row.get("visible_to") or "[]"))
    except json.JSONDecodeError:
        visible = []
    return [str(v) for v in visible] if isinstance(visible, list) else []


def event_views(view: DialogueView) -> dict[int, list[EventView]]:
    """Each turn's events (by the index of the utterance they come before; one past the last
    utterance for events after it), in order."""
    everyone = participants_of(view)
    out: dict[int, list[EventView]] = {}
    for row in view.events:
        actor = str(row["actor"])
        visible = [actor, *[v for v in _visible(row) if v != actor]]
        payload = row.get("arguments") if row.get("kind") == "tool_call" else row.get("result")
        out.setdefault(int(row["turn_index"]), []).append(EventView(
            seq=int(row["seq"]), kind=str(row["kind"]), actor=actor,
            tool=row.get("tool"), call_id=row.get("call_id"), payload=_pretty(payload),
            error=row.get("error"), notice=row.get("notice"), seen_by=visible,
            hidden_from=[p for p in everyone if p not in visible],
        ))
    return out


def _leaves(value: Any, path: str = "$") -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict) and value:
        for k in sorted(value):
            yield from _leaves(value[k], f"{path}.{k}")
    elif isinstance(value, list) and value:
        for i, v in enumerate(value):
            yield from _leaves(v, f"{path}[{i}]")
    else:
        yield path, value


def _diff(final: Any, gold: Any) -> list[WorldDiff]:
    a, b = dict(_leaves(final)), dict(_leaves(gold))
    missing = object()
    out = []
    for path in sorted(set(a) | set(b)):
        x, y = a.get(path, missing), b.get(path, missing)
        if x != y:
            out.append(WorldDiff(path, "(absent)" if x is missing else json.dumps(x, ensure_ascii=False),
                                 "(absent)" if y is missing else json.dumps(y, ensure_ascii=False)))
    return out


def _state(rows: Sequence[dict[str, Any]], kind: str) -> dict[str, Any] | None:
    found = [r for r in rows if r.get("kind") == kind]
    return found[-1] if found else None


def world_view(view: DialogueView) -> WorldView | None:
    """The final world beside the gold world (``None``: the dialogue has no world)."""
    final = _state(view.worlds, "final") or _state(view.worlds, "change") or _state(
        view.worlds, "initial")
    if final is None:
        return None
    gold, initial = _state(view.worlds, "gold"), _state(view.worlds, "initial")
    final_value = json.loads(str(final["world"]))
    out = WorldView(
        final=json.dumps(final_value, indent=2, ensure_ascii=False, sort_keys=True),
        final_sha256=str(final["world_sha256"]),
        initial_sha256=str(initial["world_sha256"]) if initial else None,
        changes=sum(1 for r in view.worlds if r.get("kind") == "change"),
    )
    if gold is not None:
        gold_value = json.loads(str(gold["world"]))
        out.gold = json.dumps(gold_value, indent=2, ensure_ascii=False, sort_keys=True)
        out.gold_sha256 = str(gold["world_sha256"])
        out.diff = _diff(final_value, gold_value)
    return out
