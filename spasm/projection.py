"""The projection operator Ψ (SPEC §3): history + viewer → the chat messages that viewer sees.

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
  Two-party viewers (``group`` unset) see exactly what they saw before groups existed.
* ``quoted`` (egocentric labels without chat roles): the history as one quoted transcript in a
  ``user`` message, labelled from the viewer's side — "You: …" for the viewer's own turns, "The
  <responder role>: …" for the Responder's as the Client sees them, "The person: …" for the
  Client's as the Responder sees them — then the instruction to write the next message. With
  ``ecp`` (egocentric, chat roles) and ``concat`` (absolute labels, one transcript) it separates
  which half of ECP changes the agents' behaviour.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, cast

from spasm.backends.base import Message
from spasm.errors import ConfigError
from spasm.history import History, Speaker
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


@register_projection("ecp")
def ecp(history: History, viewer: Viewer) -> list[Message]:
    """SELF turns → ``assistant``, PARTNER turns → ``user``; content untouched."""
    messages: list[Message] = [{"role": "system", "content": viewer.system_prompt}]
    if len(history) == 0 or history[0].speaker == viewer.speaker:
        messages.append({"role": "user", "content": viewer.opening})
    for u in history:
        if u.speaker == viewer.speaker:
            messages.append({"role": "assistant", "content": u.content})
        elif viewer.group is None:
            messages.append({"role": "user", "content": u.content})
        elif viewer.speaker_names == "name_field":
            messages.append({"role": "user", "content": u.content, "name": u.speaker})
        else:
            messages.append({"role": "user", "content": f"{u.speaker}: {u.content}"})
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
    """The history as absolutely labelled lines, the same for every viewer."""
    return "\n".join(f"{label(u.speaker, viewer)}: {u.content}" for u in history)


@register_projection("concat")
def concat(history: History, viewer: Viewer) -> list[Message]:
    """The same neutral transcript for both viewers, then 'continue as your role'."""
    instruction = viewer.continue_instruction.format(label=label(viewer.speaker, viewer))
    if len(history) == 0:
        body = f"{viewer.opening}\n\n{instruction}"
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


def quoted_transcript(history: History, viewer: Viewer) -> str:
    """The history as quoted lines (``> ``, continuation lines too) with the viewer's labels."""
    labels = quoted_labels(viewer)
    lines = []
    for u in history:
        text = f"{labels[u.speaker]}: {u.content}"
        lines.append("\n".join(f"> {line}" if line else ">" for line in text.split("\n")))
    return "\n".join(lines)


@register_projection("quoted")
def quoted(history: History, viewer: Viewer) -> list[Message]:
    """The history as one transcript quoted in a ``user`` message, labelled from the viewer's
    side ("You: …", "The <partner>: …"), then 'write your next message'."""
    if len(history) == 0:
        body = f"{viewer.opening}\n\n{QUOTED_INSTRUCTION}"
    else:
        body = f"{QUOTED_HEADER}\n\n{quoted_transcript(history, viewer)}\n\n{QUOTED_INSTRUCTION}"
    return [
        {"role": "system", "content": viewer.system_prompt},
        {"role": "user", "content": body},
    ]
