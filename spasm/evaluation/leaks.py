"""``payload_leak``: the simulated user repeats what it could not have seen (offline, every
run with an ``events`` table; tests/test_payload_leak.py).

A Client utterance *leaks* when it repeats a span of a tool event's payload (its arguments, its
result or its error) that the Client's **egocentric** frame of that turn would not show: the
frame ECP gives it (its own calls and results, the notices others' events show it, the
utterances, its system prompt), rebuilt with :func:`spasm.dataset.reader.seen_messages` for
every condition alike. Under CONCAT the Client is shown every event, so it can read the agent's
lookup and recite the order number before the agent says it; ECP and quoted never show it, so a
leak there is a coincidence. Comparing the rate by condition measures what seeing others'
actions does to the simulated user.

Spans: every string and number in a payload's JSON (keys left out; a payload that is not JSON
counts as one string) that is at least :data:`MIN_CHARS` characters long with a letter or digit
in it, whole when it has at most :data:`MAX_WORDS` words, else as every run of
:data:`MAX_WORDS` words; matched case- and space-insensitively on word boundaries. A span also
found anywhere in the egocentric frame is no leak (the Client may know it), nor a bool or a
short number ("2", "yes"). In a group dialogue every client seat's utterances are checked
against its own frame.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from spasm.dataset.reader import Run, seen_messages
from spasm.evaluation.loader import Conversation, clean_cell, condition_groups, seat_role
from spasm.evaluation.metrics import PayloadLeakExample, PayloadLeakMetrics, PayloadLeakRate
from spasm.evaluation.stats import finite, wilson_interval

__all__ = ["MAX_WORDS", "MIN_CHARS", "Leak", "dialogue_leaks", "leak_metrics", "leak_stage",
           "payload_spans"]

#: The shortest span that counts (shorter strings and numbers are too common to mean anything).
MIN_CHARS = 4
#: Longer strings are matched as every run of this many words.
MAX_WORDS = 6
#: The condition whose frame defines what the Client could see.
EGOCENTRIC = "ecp"
_SPACE = re.compile(r"\s+")
_WORD = re.compile(r"\w")


@dataclass(frozen=True)
class Leak:
    """One leaked span: the utterance, the span and the event it came from."""

    turn_index: int
    speaker: str
    span: str
    tool: str | None
    actor: str


def _norm(text: str) -> str:
    return _SPACE.sub(" ", text.casefold()).strip()


def _leaves(value: Any) -> Iterator[str]:
    if isinstance(value, bool) or value is None:
        return
    if isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)
    elif isinstance(value, list):
        for v in value:
            yield from _leaves(v)
    else:
        yield str(value)


def payload_spans(payload: str) -> set[str]:
    """The spans of one payload (normalised), as the module docstring defines them."""
    try:
        leaves = list(_leaves(json.loads(payload)))
    except (json.JSONDecodeError, RecursionError):
        leaves = [payload]
    out: set[str] = set()
    for leaf in leaves:
        text = _norm(leaf)
        if len(text) < MIN_CHARS or not _WORD.search(text):
            continue
        words = text.split(" ")
        if len(words) <= MAX_WORDS:
            out.add(text)
        else:
            out.update(" ".join(words[i:i + MAX_WORDS]) for i in range(len(words) - MAX_WORDS + 1))
    return out


def _contains(text: str, span: str) -> bool:
    """``span`` in ``text`` on word boundaries (both normalised)."""
    return re.search(rf"(?<!\w){re.escape(span)}(?!\w)", text) is not None


def _frame_text(messages: Sequence[Mapping[str, Any]]) -> str:
    parts = []
    for m in messages:
        parts.append(str(m.get("content") or ""))
        for call in m.get("tool_calls") or ():
            parts.append(str(call["function"]["name"]))
            parts.append(str(call["function"]["arguments"]))
    return _norm("\n".join(parts))


def dialogue_leaks(
    row: Mapping[str, Any], turns: Sequence[Mapping[str, Any]], events: Sequence[Mapping[str, Any]],
    participants: Sequence[Mapping[str, Any]] = (),
) -> list[Leak]:
    """Every leaked span of one dialogue's Client utterances (rows as a reader returns them,
    turns and events in order)."""
    clients = {str(p["participant_id"]) for p in participants
               if seat_role(p.get("role"), clean_cell(p.get("persona_id"))) == "client"}
    if not participants:
        clients = {"client"}
    # What the Client is re-shown is its ECP frame, whatever the run's condition: plain turns
    # re-projected (a harnessed turn's stored frame is the run's condition's, so it is left out).
    ego = {**row, "condition": EGOCENTRIC}
    plain = [{k: v for k, v in t.items() if k != "messages"} for t in turns]
    leaks: list[Leak] = []
    for index, turn in enumerate(plain):
        speaker = str(turn["speaker"])
        if speaker not in clients:
            continue
        before = [e for e in events if int(e["turn_index"]) <= index]
        if not before:
            continue
        frame = _frame_text(seen_messages(ego, plain, index, participants, before).messages)
        said = _norm(str(turn["text"]))
        seen_here: set[str] = set()
        for e in before:
            payloads = [p for p in (e.get("arguments"), e.get("result"), e.get("error"))
                        if isinstance(p, str) and p]
            for span in sorted({s for p in payloads for s in payload_spans(p)}):
                if span in seen_here or span in frame or not _contains(said, span):
                    continue
                seen_here.add(span)
                leaks.append(Leak(index, speaker, span, clean_cell(e.get("tool")),
                                  str(e.get("actor"))))
    return leaks


@dataclass
class LeakResult:
    """The leaks of every dialogue checked (those of a run with an events table)."""

    leaks: dict[str, list[Leak]] = field(default_factory=dict)


def _records(run: Run, table: str) -> dict[str, list[dict[str, Any]]]:
    if not run.has(table):
        return {}
    frame = run.df(table)
    frame = frame.astype(object).where(frame.notna(), None)
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in frame.to_dict("records"):
        out[str(r["dialogue_id"])].append({str(k): v for k, v in r.items()})
    return out


def leak_stage(
    run: Run, convs: Sequence[Conversation],
) -> tuple[PayloadLeakMetrics | None, dict[str, dict[str, object]]]:
    """``payload_leak`` of every evaluated dialogue of a run with an events table (``None``
    and no columns for a run without one), and the per-dialogue columns ``payload_leak``
    (1.0 when a Client utterance leaks, else 0.0) and ``payload_leak_spans``."""
    if not run.has("events"):
        return None, {}
    wanted = {c.dialogue_id for c in convs}
    events = _records(run, "events")
    turns = _records(run, "turns")
    participants = _records(run, "participants")
    dialogues = run.df("dialogues")
    dialogues = dialogues.astype(object).where(dialogues.notna(), None)
    result = LeakResult()
    for record in dialogues.to_dict("records"):
        row = {str(k): v for k, v in record.items()}
        did = str(row["dialogue_id"])
        if did not in wanted:
            continue
        mine = sorted(events.get(did, []), key=lambda e: int(e["seq"]))
        ordered = sorted(turns.get(did, []), key=lambda t: int(t["turn_index"]))
        seats = sorted(participants.get(did, []), key=lambda p: int(p["position"]))
        result.leaks[did] = dialogue_leaks(row, ordered, mine, seats) if mine else []
    columns: dict[str, dict[str, object]] = {
        did: {"payload_leak": float(bool(found)), "payload_leak_spans": len(found)}
        for did, found in result.leaks.items()
    }
    return leak_metrics(convs, result), columns


def _rate(pairing: str, condition: str, convs: Sequence[Conversation],
          leaks: Mapping[str, Sequence[Leak]]) -> PayloadLeakRate:
    checked = [c for c in convs if c.dialogue_id in leaks]
    leaking = [c for c in checked if leaks[c.dialogue_id]]
    low, high = wilson_interval(len(leaking), len(checked))
    return PayloadLeakRate(
        pairing=pairing, condition=condition, n=len(checked), n_leaking=len(leaking),
        rate=len(leaking) / len(checked) if checked else None, ci_low=finite(low),
        ci_high=finite(high),
        utterances=sum(len({leak.turn_index for leak in leaks[c.dialogue_id]}) for c in checked),
        spans=sum(len(leaks[c.dialogue_id]) for c in checked),
    )


def leak_metrics(convs: Sequence[Conversation], result: LeakResult) -> PayloadLeakMetrics:
    """The leak rate overall and by condition (and pairing × condition with several
    pairings), with Wilson 95% intervals, and up to 10 examples."""
    by_id = {c.dialogue_id: c for c in convs}
    examples = [
        PayloadLeakExample(dialogue_id=did, condition=by_id[did].condition, turn=leak.turn_index,
                           speaker=leak.speaker, span=leak.span, tool=leak.tool, actor=leak.actor,
                           text=by_id[did].texts[leak.turn_index]
                           if leak.turn_index < len(by_id[did].texts) else "")
        for did, found in result.leaks.items() if did in by_id for leak in found
    ][:10]
    notes = []
    if not any(result.leaks.values()):
        notes.append("No Client utterance repeats a payload its egocentric frame hid.")
    return PayloadLeakMetrics(
        frame=EGOCENTRIC, min_chars=MIN_CHARS, max_words=MAX_WORDS, checked=len(result.leaks),
        rates=[_rate(p, cond, group, result.leaks) for (p, cond), group in condition_groups(convs)],
        examples=examples, notes=notes,
    )

