"""The projection operator Ψ (docs/architecture.md): history + viewer → the chat messages that viewer sees.

Projections are pure functions registered by name; ``ecp``, ``concat`` and ``quoted`` ship with
spasm and others can be added with :func:`register_projection`.

* ``ecp`` (Egocentric Context Projection): the viewer's own turns become ``assistant`` messages
  and the partner's ``user`` messages, after the viewer's system prompt. The two agents see
  mirror-image framings of the same history. When the viewer speaks first (the Client opens),
  the viewer's ``opening`` instruction is sent as the first ``user`` message, since chat models
  need a user turn to answer.
* ``concat`` (the SPASM baseline): both viewers get the same neutral transcript with absolute
  labels ("Client: …", "Responder: …") in one ``user`` message, followed by an instruction to
  continue as their role.
* In a **group** dialogue (``Viewer.group``: the participants' ids, in order) every
  projection names the speakers: under ``ecp`` every other participant's turn is a ``user``
  message of its own, carrying the speaker's id as a "Name: " prefix or the protocol's ``name``
  field (``Viewer.speaker_names``), under ``concat`` the transcript labels each line with the
  speaker's id, under ``quoted`` the viewer's own lines are "You" and the others' their ids.
  Two-party viewers (``group`` unset) get no names: their frames are the two-party ones
  (tests/snapshots and tests/golden pin their bytes).
* ``quoted`` (egocentric labels without chat roles): the history as one quoted transcript in a
  ``user`` message, labelled from the viewer's side — "You: …" for the viewer's own turns, "The
  <responder role>: …" for the Responder's as the Client sees them, "The person: …" for the
  Client's as the Responder sees them — then the instruction to write the next message. With
  ``ecp`` (egocentric, chat roles) and ``concat`` (absolute labels, one transcript) it separates
  which half of ECP changes the agents' behaviour.

**Events** (tool calls, their results and notices: :class:`spasm.history.Event`) are filtered
by who may see them (``visible_to``). ECP and quoted are egocentric: under ``ecp`` the viewer's
own calls are ``assistant`` messages with ``tool_calls`` and their results ``tool`` messages with
matching ids; another participant's event reaches the viewer only when it may see it, and then
only as that event's notice, on a line before that participant's utterance in its ``user``
message, never as a foreign ``tool`` message; ``quoted`` writes the visible events as lines with
the viewer's labels. ``concat`` is the shared transcript: every event, visible or not, as lines
with absolute labels, the same for every viewer. A history without events is projected with no
trace of them (``test_a_history_without_events_projects_as_before``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, cast

from spasm.backends.base import Message, ToolCallMessage
from spasm.errors import ConfigError
from spasm.history import Event, History, Speaker
from spasm.registry import PROJECTIONS

SPEAKER_LABELS: dict[Speaker, str] = {"client": "Client", "responder": "Responder"}


@dataclass(frozen=True, slots=True)
class Viewer:
    """Who looks at the history, and the fixed texts of their frame."""

    speaker: Speaker
    system_prompt: str
    #: First user message when the viewer speaks first (ECP) or the history is empty.
    opening: str = "The conversation starts now. Write your opening message."
    #: Instruction after the transcript (CONCAT); ``{label}`` is the viewer's label.
    continue_instruction: str = (
        "Continue the conversation as the {label}. Write only the {label}'s next message, "
        "without the '{label}:' prefix."
    )
    #: The Responder's role (``dialogue.responder_role``): the Client's label for its partner
    #: under ``quoted`` ("The customer-service agent"); ``None``: "The other person".
    responder_role: str | None = None
    #: A group dialogue: every participant's id, in order (``None``: a two-party dialogue).
    group: tuple[str, ...] | None = None
    #: How a group's ECP names the speaker of a ``user`` message: ``prefix`` ("Ana: …") or
    #: ``name_field`` (the OpenAI ``name`` field, for backends that accept it).
    speaker_names: Literal["prefix", "name_field"] = "prefix"


#: CONCAT's instruction in a group dialogue (``Viewer.continue_instruction``): ``{label}`` is
#: the participant's id.
GROUP_CONTINUE = ("Continue the conversation as {label}. Write only {label}'s next message, "
                  "without the '{label}:' prefix.")


def group_viewer(speaker: Speaker, system_prompt: str, group: tuple[str, ...], *,
                 responder_role: str | None = None,
                 speaker_names: Literal["prefix", "name_field"] = "prefix") -> Viewer:
    """A group participant's viewer (what the run gives it and what a reader rebuilds)."""
    return Viewer(speaker, system_prompt, continue_instruction=GROUP_CONTINUE,
                  responder_role=responder_role, group=group, speaker_names=speaker_names)


def messages_digest(messages: list[Message]) -> str:
    """sha256 of the exact messages an agent saw (to check a reconstruction byte for byte)."""
    return hashlib.sha256(json.dumps(messages, ensure_ascii=False).encode()).hexdigest()


Projection = Callable[[History, Viewer], list[Message]]


def register_projection(name: str, *, replace: bool = False) -> Callable[[Projection], Projection]:
    """Register a projection under ``name`` (decorator; the names live in
    :data:`spasm.registry.PROJECTIONS`, where the config checks them; a plugin replaces a
    built-in only with ``replace=True``)."""

    def decorator(fn: Projection) -> Projection:
        PROJECTIONS.register(name, replace=replace)(fn)
        return fn

    return decorator


def get_projection(name: str) -> Projection:
    """Look a projection up by name; unknown names are a :class:`ConfigError`."""
    fn = PROJECTIONS.get(name)
    if fn is None:
        raise ConfigError(
            f"Unknown condition (projection) {name!r}; known: {', '.join(PROJECTIONS.names())}"
        )
    return cast(Projection, fn)


def projection_names() -> list[str]:
    """Names of the registered projections."""
    return PROJECTIONS.names()


def project(history: History, viewer: Viewer, condition: str) -> list[Message]:
    """Apply the projection named ``condition``."""
    return get_projection(condition)(history, viewer)


def _by_turn(history: History) -> dict[int, list[Event]]:
    turns: dict[int, list[Event]] = {}
    for e in history.events:
        turns.setdefault(e.turn_index, []).append(e)
    return turns


def notice_text(event: Event, actor_label: str) -> str:
    """What a participant other than the actor is shown of an event it may see: the tool's
    notice, else the event rendered as a bracketed line (``actor_label`` names the actor)."""
    if event.notice:
        return event.notice
    if event.kind == "tool_call":
        return f"[{actor_label} used {event.tool}: {event.arguments}]"
    if event.kind == "tool_result":
        outcome = f"error: {event.error}" if event.error else event.result
        return f"[{event.tool} returned to {actor_label}: {outcome}]"
    return f"[{actor_label}: {event.kind}]"


def tool_result_content(event: Event) -> str:
    """A ``tool_result`` event as the content of its ``tool`` message (its result, or its
    error as ``{"error": …}``)."""
    if event.error:
        return json.dumps({"error": event.error}, ensure_ascii=False)
    return event.result or "null"


def _own_steps(events: Sequence[Event]) -> list[Message]:
    """The viewer's own calls and results: each step's calls in one ``assistant`` message,
    each result a ``tool`` message answering its call's id."""
    out: list[Message] = []
    for e in events:
        if e.kind == "tool_call":
            call: ToolCallMessage = {
                "id": e.call_id or "", "type": "function",
                "function": {"name": e.tool or "", "arguments": e.arguments or "{}"}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif e.kind == "tool_result":
            out.append({"role": "tool", "content": tool_result_content(e),
                        "tool_call_id": e.call_id or ""})
    return out


@register_projection("ecp")
def ecp(history: History, viewer: Viewer) -> list[Message]:
    """SELF turns → ``assistant``, PARTNER turns → ``user``; content untouched. The viewer's
    own events are its ``tool_calls`` and ``tool`` messages; others' events it may see are
    their notices, on lines before that participant's utterance."""
    messages: list[Message] = [{"role": "system", "content": viewer.system_prompt}]
    me = viewer.speaker
    if len(history) == 0 or history[0].speaker == me:
        messages.append({"role": "user", "content": viewer.opening})
    turns = _by_turn(history) if history.events else {}
    labels = quoted_labels(viewer) if turns else {}
    for k, u in enumerate([*history, None]):
        events = turns.get(k, ())
        own = [e for e in events if e.actor == me]
        notes = [notice_text(e, labels.get(e.actor, e.actor)) for e in events
                 if e.actor != me and e.visible(me)]
        messages.extend(_own_steps(own))
        if u is None:
            if notes:  # another participant's events with no utterance after them
                messages.append({"role": "user", "content": "\n".join(notes)})
            break
        content = "\n".join([*notes, u.content]) if notes else u.content
        if u.speaker == me:
            messages.append({"role": "assistant", "content": u.content})
        elif viewer.group is None:
            messages.append({"role": "user", "content": content})
        elif viewer.speaker_names == "name_field":
            messages.append({"role": "user", "content": content, "name": u.speaker})
        else:
            messages.append({"role": "user", "content": f"{u.speaker}: {content}"})
    return messages


def label(speaker: Speaker, viewer: Viewer | None = None) -> str:
    """A speaker's absolute label: "Client"/"Responder" in a two-party dialogue, the
    participant's id in a group (also for readers without a viewer, such as the judge)."""
    if viewer is not None and viewer.group is not None:
        return speaker
    return SPEAKER_LABELS.get(speaker, speaker)


def name_list(ids: Sequence[str]) -> str:
    """Participants named in prose: ``Ana``, ``Ana and Ben``, ``Ana, Ben and Carla``."""
    return ids[0] if len(ids) == 1 else f"{', '.join(ids[:-1])} and {ids[-1]}"


def transcript(history: History, viewer: Viewer | None = None) -> str:
    """The history as absolutely labelled lines, the same for every viewer (its utterances;
    :func:`event_lines` writes its events)."""
    return "\n".join(f"{label(u.speaker, viewer)}: {u.content}" for u in history)


def event_line(event: Event, who: str, notice: str | None = None) -> str:
    """One event as a transcript line: ``who (calls tool): {arguments}``, ``who (result of
    tool): …``, ``who (notice): …``; ``notice`` replaces the payload (another participant's
    event under ``quoted``)."""
    if notice is not None:
        return f"{who} (action): {notice}"
    if event.kind == "tool_call":
        return f"{who} (calls {event.tool}): {event.arguments}"
    if event.kind == "tool_result":
        if event.error:
            return f"{who} (error from {event.tool}): {event.error}"
        return f"{who} (result of {event.tool}): {event.result}"
    return f"{who} (notice): {event.notice}"


def event_transcript(history: History, line: Callable[[Event], str | None],
                     utterance: Callable[[Speaker, str], str]) -> list[str]:
    """The history's utterances and events as lines, in the order they happened: each turn's
    events (``line`` returns ``None`` for one a viewer may not see) before its utterance."""
    turns = _by_turn(history)
    out: list[str] = []
    for k, u in enumerate([*history, None]):
        out.extend(x for x in (line(e) for e in turns.get(k, ())) if x is not None)
        if u is not None:
            out.append(utterance(u.speaker, u.content))
    return out


@register_projection("concat")
def concat(history: History, viewer: Viewer) -> list[Message]:
    """The same neutral transcript for both viewers, then 'continue as your role'; every event
    is in it, whoever it was visible to, with absolute labels."""
    instruction = viewer.continue_instruction.format(label=label(viewer.speaker, viewer))
    if len(history) == 0 and not history.events:
        body = f"{viewer.opening}\n\n{instruction}"
    elif history.events:
        lines = event_transcript(history, lambda e: event_line(e, label(e.actor, viewer)),
                                 lambda s, c: f"{label(s, viewer)}: {c}")
        body = "Conversation so far:\n" + "\n".join(lines) + f"\n\n{instruction}"
    else:
        body = f"Conversation so far:\n{transcript(history, viewer)}\n\n{instruction}"
    return [
        {"role": "system", "content": viewer.system_prompt},
        {"role": "user", "content": body},
    ]


#: ``quoted``: the viewer's own label, and the Client's label as the Responder sees it.
QUOTED_SELF = "You"
QUOTED_CLIENT = "The person"
QUOTED_HEADER = 'The conversation so far, quoted ("You" is you):'
QUOTED_INSTRUCTION = (
    "Write your next message in this conversation. Write only the message itself, without a "
    "label or quotation marks."
)


def quoted_labels(viewer: Viewer) -> dict[Speaker, str]:
    """The labels ``quoted`` gives each speaker, from ``viewer``'s side (in a group: "You" and
    the other participants' ids)."""
    if viewer.group is not None:
        return {p: QUOTED_SELF if p == viewer.speaker else p for p in viewer.group}
    if viewer.speaker == "client":
        partner = f"The {viewer.responder_role}" if viewer.responder_role else "The other person"
        return {"client": QUOTED_SELF, "responder": partner}
    return {"client": QUOTED_CLIENT, "responder": QUOTED_SELF}


def _quote(text: str) -> str:
    return "\n".join(f"> {line}" if line else ">" for line in text.split("\n"))


def quoted_transcript(history: History, viewer: Viewer) -> str:
    """The history as quoted lines (``> ``, continuation lines too) with the viewer's labels;
    the events the viewer may see are lines too (its own with their payload, another
    participant's as its notice)."""
    labels = quoted_labels(viewer)
    if not history.events:
        return "\n".join(_quote(f"{labels[u.speaker]}: {u.content}") for u in history)
    me = viewer.speaker

    def line(e: Event) -> str | None:
        who = labels.get(e.actor, e.actor)
        if e.actor == me:
            return None if e.kind == "notice" else _quote(event_line(e, who))
        if not e.visible(me):
            return None
        return _quote(event_line(e, who, notice_text(e, who)))

    return "\n".join(event_transcript(history, line,
                                       lambda s, c: _quote(f"{labels.get(s, s)}: {c}")))


@register_projection("quoted")
def quoted(history: History, viewer: Viewer) -> list[Message]:
    """The history as one transcript quoted in a ``user`` message, labelled from the viewer's
    side ("You: …", "The <partner>: …"), then 'write your next message'."""
    shown = quoted_transcript(history, viewer) if history.events else None
    if len(history) == 0 and not shown:
        body = f"{viewer.opening}\n\n{QUOTED_INSTRUCTION}"
    else:
        body = (f"{QUOTED_HEADER}\n\n{shown or quoted_transcript(history, viewer)}\n\n"
                f"{QUOTED_INSTRUCTION}")
    return [
        {"role": "system", "content": viewer.system_prompt},
        {"role": "user", "content": body},
    ]
