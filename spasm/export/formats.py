"""Training examples from a role's perspective, and the formats they are written in (docs/export.md).

An :class:`Example` is one dialogue seen by one role through the ECP projection
(:func:`spasm.projection.ecp`): that role's system prompt, its own turns as ``assistant`` and
the partner's as ``user`` — exactly the frame the agent generated in, whatever the run's
condition. A format is a small pure function ``(example, options) -> record`` registered by
name with the file layout it is written in::

    @register_format("my_format", layout="jsonl", description="...")
    def my_format(example: Example, options: FormatOptions) -> dict[str, Any]: ...

==========  =======  ======================================================================
format      layout   one record
==========  =======  ======================================================================
openai      jsonl    ``{"messages": [{"role", "content", "weight"?}]}`` (OpenAI fine-tuning)
sharegpt    jsonl    ``{"conversations": [{"from": "system|human|gpt", "value"}]}``; with
                     weights, cut before the first untrained turn (no per-message weight)
hf          parquet  a ``messages`` column (the chat layout TRL's SFT trainer takes; with
                     weights each message has ``weight`` and a parallel ``weights`` column)
                     and the dialogue's metadata columns
==========  =======  ======================================================================

In a **group** run (format 1.7) an example is one dialogue seen by one participant, through
its own ECP frame (:func:`spasm.projection.group_viewer`): its turns are ``assistant``, every
other participant's a ``user`` message carrying the speaker's id as the run named it ("Ana: …"
in the content, or the ``name`` field, kept by openai and hf and written as the prefix by
ShareGPT, which has no such field); the turns of others between two of its own are one ``user``
message (:func:`alternate`), so roles alternate as trainers require. The hf files of a group
export add a ``participant_id`` column (:data:`GROUP_META_COLUMNS`), and a ``name`` in each
message when some speaker is named by the field; two-party exports keep their layout byte for
byte.

A builder may return ``None``: the example has no record in that format (a ShareGPT example
whose first trained turn is flagged). Every example ends on a turn of the role it trains
(:func:`end_on_role`), and the system prompt is kept, merged into the first user message or
dropped (:func:`system_messages`), the same way in every format.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

import pyarrow as pa

from spasm.errors import UserError
from spasm.export.messages import ExampleMessage
from spasm.export.stream import Turn
from spasm.export.tooluse import (
    HF_TOOL_CALLS,
    hf_tool_fields,
    openai_tool_message,
    sharegpt_tool_turns,
    tool_perspective,
)
from spasm.history import Event, History, Utterance
from spasm.projection import Viewer, get_projection
from spasm.registry import FORMATS

__all__ = [
    "GROUP_META_COLUMNS",
    "HF_SCHEMA",
    "HF_WEIGHTED_SCHEMA",
    "META_COLUMNS",
    "SYSTEM_PROMPT_MODES",
    "TURN_SEPARATOR",
    "Example",
    "ExportFormat",
    "FormatOptions",
    "alternate",
    "end_on_role",
    "format_names",
    "get_format",
    "hf_schema",
    "perspective",
    "register_format",
    "sharegpt_cut",
    "system_messages",
]

Layout = Literal["jsonl", "parquet"]
SystemPrompt = Literal["keep", "merge", "drop"]
#: What ``--system-prompt`` can do with the role's system prompt.
SYSTEM_PROMPT_MODES: tuple[SystemPrompt, ...] = ("keep", "merge", "drop")
#: Between the system prompt and the first user message when they are merged.
MERGE_SEPARATOR = "\n\n"

#: Metadata of each example, in the hf format's column order (after ``messages``).
META_COLUMNS: dict[str, pa.DataType] = {
    "dialogue_id": pa.string(),
    "persona_id": pa.string(),
    "role": pa.string(),
    "conversation_index": pa.int32(),
    "condition": pa.string(),
    "pairing": pa.string(),
    "client_model": pa.string(),
    "responder_model": pa.string(),
    "harness_level": pa.string(),
    "termination_reason": pa.string(),
    "n_utterances": pa.int32(),
    "redactions": pa.int32(),
}
#: The metadata a group export adds after :data:`META_COLUMNS`: whose frame the example is.
GROUP_META_COLUMNS: dict[str, pa.DataType] = {"participant_id": pa.string()}
_CHAT = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
_WEIGHTED_CHAT = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string()), ("weight", pa.int8())]))
#: The hf format's schema.
HF_SCHEMA = pa.schema([("messages", _CHAT), *META_COLUMNS.items()])
#: The hf format's schema with weights: ``weight`` in each message (0/1 on assistant messages,
#: null on the others) and ``weights``, one per message (1: trained, 0: not), for a mask.
HF_WEIGHTED_SCHEMA = pa.schema([("messages", _WEIGHTED_CHAT), ("weights", pa.list_(pa.int8())),
                                *META_COLUMNS.items()])


def hf_schema(options: FormatOptions) -> pa.Schema:
    """The hf format's schema under ``options`` (with or without weights; a group export's with
    ``participant_id`` and, with ``options.names``, a ``name`` in each message)."""
    if not options.group and not options.tools:
        return HF_WEIGHTED_SCHEMA if options.weights else HF_SCHEMA
    fields = [("role", pa.string()), ("content", pa.string()),
              *([("name", pa.string())] if options.names else []),
              *([("weight", pa.int8())] if options.weights else []),
              *([("tool_calls", HF_TOOL_CALLS), ("tool_call_id", pa.string())]
                if options.tools else [])]
    return pa.schema([("messages", pa.list_(pa.struct(fields))),
                      *([("weights", pa.list_(pa.int8()))] if options.weights else []),
                      *([("tools", pa.string())] if options.tools else []),
                      *META_COLUMNS.items(),
                      *(GROUP_META_COLUMNS.items() if options.group else [])])


@dataclass(frozen=True, slots=True)
class Example:
    """One dialogue from one role's perspective.

    ``messages`` are :class:`~spasm.export.messages.ExampleMessage` dicts (``role``,
    ``content``, and what the agent's frame had); assistant messages also carry ``weight``
    (1: train on it; 0: a turn the harness flagged or one with a kept, unredactable finding).
    """

    messages: list[ExampleMessage]
    meta: dict[str, Any]


@dataclass(frozen=True, slots=True)
class FormatOptions:
    """How examples are rendered."""

    #: The role's system prompt: kept as the first message, merged into the first user
    #: message (templates without a system role), or dropped.
    system_prompt: SystemPrompt = "keep"
    #: Masks in every format: ``weight`` per message (openai, hf) or the example cut before
    #: its first untrained turn (sharegpt).
    weights: bool = False
    #: A group export: the hf files add :data:`GROUP_META_COLUMNS`.
    group: bool = False
    #: Some speaker is named by the ``name`` field (a group run with ``speaker_names:
    #: name_field``): the hf messages have a ``name``.
    names: bool = False
    #: A run with tools (an ``events`` table): tool calls and results in the messages, and the
    #: schemas of the trained role's tools (:mod:`spasm.export.tooluse`).
    tools: bool = False


def perspective(
    turns: Sequence[Turn], role: str, system_prompt: str, *, untrained: Collection[int] = (),
    viewer: Viewer | None = None, events: Sequence[Event] = (),
) -> list[ExampleMessage]:
    """The messages ``role`` sees of the whole dialogue under ECP, with a weight on each of its
    own (assistant) turns: 0 for the turn indexes in ``untrained``, else 1. When ``role``
    speaks first, ECP's opening instruction is the first user message, as the agent saw it.
    ``viewer`` (a group participant's, whose speaker is its id) replaces ``role`` and
    ``system_prompt``; a message naming its speaker by the field keeps ``name``. ``events``
    (a run with tools): the frame over the history with its events, the role's own calls and
    results included (:func:`spasm.export.tooluse.tool_perspective`)."""
    if events:
        return tool_perspective([(t.index, t.speaker, t.text) for t in turns], events,
                                viewer or Viewer(role, system_prompt), untrained)
    history = History(tuple(Utterance(t.speaker, t.text) for t in turns))
    projected = get_projection("ecp")(history, viewer or Viewer(role, system_prompt))
    offset = len(projected) - len(turns)
    out: list[ExampleMessage] = []
    for k, m in enumerate(projected):
        msg: ExampleMessage = {"role": m["role"], "content": m["content"]}
        if "name" in m:
            msg["name"] = m["name"]
        if m["role"] == "assistant":
            msg["weight"] = 0 if turns[k - offset].index in untrained else 1
        out.append(msg)
    return out


def end_on_role(messages: list[ExampleMessage]) -> tuple[list[ExampleMessage], int]:
    """``messages`` without the partner's turns after the role's last one, and how many were
    trimmed: every example ends on a turn of the role it trains (LLaMA-Factory skips a
    ShareGPT example with an odd number of messages after the system prompt)."""
    end = len(messages)
    # A tool step is no turn on its own: an example never ends on a call without its utterance.
    while end and (messages[end - 1]["role"] != "assistant" or "tool_calls" in messages[end - 1]):
        end -= 1
    return messages[:end], len(messages) - end


#: Between two turns of other participants merged into one ``user`` message (:func:`alternate`).
TURN_SEPARATOR = "\n\n"


def alternate(messages: list[ExampleMessage], opening: str) -> tuple[list[ExampleMessage], int, bool]:
    """A group participant's frame with roles that alternate after the system prompt, as
    LLaMA-Factory's ShareGPT reader and the Llama 2, Mistral and Gemma chat templates require
    (ECP gives every other participant's turn a ``user`` message of its own, so two or more come
    in a row): consecutive ``user`` messages become one, each turn a paragraph with its speaker's
    "Name: " prefix (a turn named by the ``name`` field gets it as the prefix), and a frame whose
    first message after the system prompt is the participant's own gets ``opening`` (the
    instruction ECP opens with) before it. Returns the messages, how many ``user`` messages
    were merged into the one before, and whether the opening was added."""
    out: list[ExampleMessage] = []
    merged = 0
    for m in messages:
        prev = out[-1] if out else None
        if m["role"] == "user" and prev is not None and prev["role"] == "user":
            content = _prefixed(prev) + TURN_SEPARATOR + _prefixed(m)
            out[-1] = cast(ExampleMessage,
                           {k: v for k, v in prev.items() if k != "name"} | {"content": content})
            merged += 1
        else:
            out.append(m)
    start = 1 if out and out[0]["role"] == "system" else 0
    opened = len(out) > start and out[start]["role"] == "assistant"
    if opened:
        out.insert(start, {"role": "user", "content": opening})
    return out, merged, opened


def sharegpt_cut(messages: list[ExampleMessage]) -> list[ExampleMessage] | None:
    """For a format without per-message weights: the messages up to the last trained turn
    before the first untrained (weight 0) one, so that every ``assistant`` turn left is trained;
    ``None`` when the role's first turn is untrained (nothing left to train on)."""
    first = next((k for k, m in enumerate(messages) if m["role"] == "assistant" and m.get("weight") == 0),
                 None)
    if first is None:
        return messages
    kept, _ = end_on_role(messages[:first])
    return kept if any(m["role"] == "assistant" for m in kept) else None


def system_messages(messages: list[ExampleMessage], mode: SystemPrompt) -> list[ExampleMessage]:
    """The messages with the system prompt kept, merged into the first user message (its text,
    :data:`MERGE_SEPARATOR`, the user's text: for chat templates that have no system role,
    such as Gemma's) or dropped. An empty system prompt is dropped in every mode."""
    if not messages or messages[0]["role"] != "system":
        return messages
    system, rest = messages[0], messages[1:]
    if not system["content"] or mode == "drop":
        return rest
    if mode == "keep":
        return messages
    for k, m in enumerate(rest):
        if m["role"] == "user":
            merged: ExampleMessage = {**m, "content": system["content"] + MERGE_SEPARATOR + m["content"]}
            return [*rest[:k], merged, *rest[k + 1:]]
    return [{"role": "user", "content": system["content"]}, *rest]


Build = Callable[[Example, FormatOptions], dict[str, Any] | None]


@dataclass(frozen=True, slots=True)
class ExportFormat:
    """A registered format: its name, file layout and record builder."""

    name: str
    layout: Layout
    build: Build
    description: str


def register_format(name: str, *, layout: Layout, description: str,
                    replace: bool = False) -> Callable[[Build], Build]:
    """Register a format under ``name`` (decorator) in :data:`spasm.registry.FORMATS`; a plugin
    replaces a built-in format only with ``replace=True``."""

    def decorator(fn: Build) -> Build:
        FORMATS.register(name, replace=replace, source=fn)(ExportFormat(name, layout, fn, description))
        return fn

    return decorator


def format_names() -> list[str]:
    """Names of the registered formats (the installed plugins' too)."""
    return FORMATS.names()


def get_format(name: str) -> ExportFormat:
    """A format by name (a plugin's too); an unknown name is a :class:`UserError` listing the
    known ones."""
    found = FORMATS.get(name)
    if not isinstance(found, ExportFormat):
        raise UserError(f"unknown export format {name!r}; choose from {', '.join(format_names())}")
    return found


def _messages(example: Example, options: FormatOptions) -> list[ExampleMessage]:
    return system_messages(example.messages, options.system_prompt)


@register_format("openai", layout="jsonl", description="OpenAI chat fine-tuning JSONL")
def openai_format(example: Example, options: FormatOptions) -> dict[str, Any]:
    """``{"messages": [...]}``; ``weight`` (0/1) on assistant messages with ``options.weights``."""
    out = []
    for m in _messages(example, options):
        msg: dict[str, Any] = {"role": m["role"], "content": m["content"]}
        if m.get("name"):
            msg["name"] = m["name"]
        if options.weights and "weight" in m:
            msg["weight"] = m["weight"]
        out.append(openai_tool_message(m, msg) if options.tools else msg)
    tools = json.loads(example.meta.get("tools") or "[]") if options.tools else []
    return {"messages": out, "tools": tools} if tools else {"messages": out}


_SHAREGPT_FROM = {"system": "system", "user": "human", "assistant": "gpt"}


@register_format("sharegpt", layout="jsonl", description="ShareGPT conversations JSONL")
def sharegpt_format(example: Example, options: FormatOptions) -> dict[str, Any] | None:
    """``{"conversations": [{"from": "system|human|gpt", "value": ...}]}``. ShareGPT has no
    per-message weight: with ``options.weights`` the example is cut before its first
    untrained turn (:func:`sharegpt_cut`), and has no record when that is its first turn."""
    messages = _messages(example, options)
    if options.weights:
        cut = sharegpt_cut(messages)
        if cut is None:
            return None
        messages = cut
    if options.tools:  # LLaMA-Factory's function_call / observation turns and tools column
        return {"conversations": sharegpt_tool_turns(messages, _SHAREGPT_FROM, _prefixed),
                "tools": example.meta.get("tools") or "[]"}
    return {"conversations": [{"from": _SHAREGPT_FROM[m["role"]], "value": _prefixed(m)} for m in messages]}


def _prefixed(message: Mapping[str, Any]) -> str:
    """The content, with the speaker's id as a prefix when the message names it by the field
    (ShareGPT has no ``name``)."""
    name = message.get("name")
    return f"{name}: {message['content']}" if name else str(message["content"])


@register_format("hf", layout="parquet",
                 description="Parquet per split for datasets.load_dataset (messages + metadata)")
def hf_format(example: Example, options: FormatOptions) -> dict[str, Any]:
    """A row of :func:`hf_schema`: with ``options.weights`` each message carries ``weight``
    (null on system and user messages) and ``weights`` lists one per message (1 trained)."""
    msgs = _messages(example, options)
    meta = {k: example.meta.get(k) for k in META_COLUMNS}
    if options.group:
        meta.update({k: example.meta.get(k) for k in GROUP_META_COLUMNS})
    if options.tools:
        meta["tools"] = example.meta.get("tools") or "[]"
    tool = hf_tool_fields if options.tools else (lambda m: {})
    if not options.weights:
        return {"messages": [{"role": m["role"], "content": m["content"], **_name(m, options), **tool(m)}
                             for m in msgs], **meta}
    messages = [{"role": m["role"], "content": m["content"], **_name(m, options), "weight": m.get("weight"),
                 **tool(m)} for m in msgs]
    return {"messages": messages, "weights": [int(m.get("weight") or 0) for m in msgs], **meta}


def _name(message: Mapping[str, Any], options: FormatOptions) -> dict[str, Any]:
    """The hf message's ``name`` (null on the participant's own and prefixed messages), when
    the schema has one."""
    return {"name": message.get("name")} if options.names else {}
