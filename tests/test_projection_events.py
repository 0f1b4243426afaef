"""Visibility is data, and the projections obey it.

The property: over many random histories with events, two-party and group, no ECP or quoted
frame ever contains the payload of an event whose ``visible_to`` lacks its viewer, and every
CONCAT frame holds every event. Each payload is a unique marker, so "contains" is a substring
test that cannot pass by accident. Plus the shape of what a viewer sees of its own events
under ECP (assistant ``tool_calls`` and ``tool`` messages with matching ids) and of others'
(their notice inside a ``user`` message, never a ``tool`` message).
"""

from __future__ import annotations

import json
import random

import pytest

from spasm.history import Event, History
from spasm.projection import Viewer, group_viewer, project

TWO = ("client", "responder")
GROUP = ("Ana", "Ben", "Helper")


def _viewer(me: str, seats: tuple[str, ...], names: str = "prefix") -> Viewer:
    if seats == TWO:
        return Viewer(me, f"frame of {me}", responder_role="agent")
    return group_viewer(me, f"frame of {me}", seats, responder_role="agent",
                        speaker_names="name_field" if names == "name_field" else "prefix")


def _random_history(rng: random.Random, seats: tuple[str, ...]) -> tuple[History, list[Event]]:
    """Utterances and, in some turns, steps of calls with results and notices; every payload
    and notice is a unique marker."""
    h = History()
    events: list[Event] = []
    n = rng.randint(0, 7)
    marker = iter(range(10**6))
    for k in range(n + 1):
        speaker = seats[k % len(seats)] if seats == TWO else rng.choice(seats)
        for _step in range(rng.choice((0, 0, 1, 2))):
            calls = []
            for _ in range(rng.randint(1, 2)):
                cid = f"call_{k}_{next(marker)}"
                choice = rng.random()
                if choice < 0.4:
                    vis: tuple[str, ...] = (speaker,)
                elif choice < 0.7:
                    vis = seats
                else:
                    vis = (speaker, *rng.sample([s for s in seats if s != speaker], 1))
                calls.append((cid, vis))
                events.append(Event("tool_call", speaker, k, vis, cid, "lookup",
                                    json.dumps({"q": f"ARG{next(marker)}X"})))
                if rng.random() < 0.5:
                    others = tuple(s for s in seats if s not in vis)
                    if others:
                        events.append(Event("notice", speaker, k, others, cid, "lookup",
                                            notice=f"[NOTICE{next(marker)}X]"))
            for cid, vis in calls:
                if rng.random() < 0.3:
                    events.append(Event("tool_result", speaker, k, vis, cid, "lookup",
                                        error=f"ERR{next(marker)}X"))
                else:
                    events.append(Event("tool_result", speaker, k, vis, cid, "lookup",
                                        result=json.dumps({"r": f"RES{next(marker)}X"})))
        if k < n:
            h = h.append(speaker, f"utterance {k}")
    return h.with_events(events), events


def _text(messages: list[dict[str, object]]) -> str:
    return json.dumps(messages, ensure_ascii=False)


def _shown(e: Event) -> list[str]:
    return [*e.payload, *([e.notice] if e.notice else [])]


@pytest.mark.parametrize(("seats", "names"), [(TWO, "prefix"), (GROUP, "prefix"),
                                               (GROUP, "name_field")],
                         ids=["two-party", "group", "group-name-field"])
def test_no_egocentric_frame_holds_an_invisible_payload_and_concat_holds_every_event(
    seats: tuple[str, ...], names: str,
) -> None:
    rng = random.Random(31)
    checked = 0
    for _ in range(400):
        history, events = _random_history(rng, seats)
        for me in seats:
            viewer = _viewer(me, seats, names)
            for condition in ("ecp", "quoted"):
                frame = _text(project(history, viewer, condition))  # type: ignore[arg-type]
                assert '"role": "tool"' not in frame or condition == "ecp"
                for m in project(history, viewer, condition):
                    if m["role"] == "tool":  # only ever the viewer's own results
                        assert any(e.call_id == m["tool_call_id"] and e.actor == me
                                   for e in events)
                for e in events:
                    if not e.visible(me):
                        for secret in _shown(e):
                            assert secret not in frame, (condition, me, e)
                        checked += 1
            concat = _text(project(history, viewer, "concat"))  # type: ignore[arg-type]
            for e in events:
                for part in _shown(e):
                    assert json.dumps(part)[1:-1] in concat or part in concat, (me, e)
    assert checked > 1000  # the property was exercised, not vacuous


def test_ecp_gives_the_viewer_its_own_calls_as_tool_calls_and_results_as_tool_messages() -> None:
    h = History().append("client", "Where is my order?").with_events([
        Event("tool_call", "responder", 1, ("responder",), "c1", "lookup", '{"id": "A1"}'),
        Event("tool_call", "responder", 1, ("responder",), "c2", "track", '{"id": "A1"}'),
        Event("notice", "responder", 1, ("client",), "c1", "lookup", notice="[Looking it up]"),
        Event("tool_result", "responder", 1, ("responder",), "c1", "lookup", result='{"s": 1}'),
        Event("tool_result", "responder", 1, ("responder",), "c2", "track", error="boom"),
    ])
    mine = project(h, _viewer("responder", TWO), "ecp")
    assert [m["role"] for m in mine] == ["system", "user", "assistant", "tool", "tool"]
    calls = mine[2]["tool_calls"]
    assert [c["id"] for c in calls] == ["c1", "c2"]
    assert [m["tool_call_id"] for m in mine[3:]] == ["c1", "c2"]
    assert json.loads(mine[4]["content"]) == {"error": "boom"}
    # The client sees the notice inside the user message of the responder's utterance.
    done = h.append("responder", "It shipped.")
    theirs = project(done, _viewer("client", TWO), "ecp")
    assert [m["role"] for m in theirs] == ["system", "user", "assistant", "user"]
    assert theirs[-1]["content"] == "[Looking it up]\nIt shipped."
    assert "A1" not in _text(theirs)  # type: ignore[arg-type]


def test_a_history_without_events_projects_as_before() -> None:
    h = History().append("client", "Hi").append("responder", "Hello")
    for condition in ("ecp", "concat", "quoted"):
        for me in TWO:
            v = _viewer(me, TWO)
            assert project(h.with_events([]), v, condition) == project(h, v, condition)
