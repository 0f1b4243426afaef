"""Training examples from a role's perspective, and the formats they are written in (SPEC §10).

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
sharegpt    jsonl    ``{"conversations": [{"from": "system|human|gpt", "value"}]}``
hf          parquet  a ``messages`` column (the chat layout TRL's SFT trainer takes) and the
                     dialogue's metadata columns
==========  =======  ======================================================================
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

import pyarrow as pa

from spasm.errors import UserError
from spasm.export.stream import Turn
from spasm.history import History, Speaker, Utterance
from spasm.projection import Viewer, get_projection

__all__ = [
    "HF_SCHEMA",
    "META_COLUMNS",
    "Example",
    "ExportFormat",
    "FormatOptions",
    "format_names",
    "get_format",
    "perspective",
    "register_format",
]

Layout = Literal["jsonl", "parquet"]

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
_CHAT = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
#: The hf format's schema.
HF_SCHEMA = pa.schema([("messages", _CHAT), *META_COLUMNS.items()])


@dataclass(frozen=True, slots=True)
class Example:
    """One dialogue from one role's perspective.

    ``messages`` are ``{"role", "content"}`` dicts; assistant messages also carry ``weight``
    (1: train on it; 0: a turn the harness flagged or one with a kept, unredactable finding).
    """

    messages: list[dict[str, Any]]
    meta: dict[str, Any]


@dataclass(frozen=True, slots=True)
class FormatOptions:
    """How examples are rendered."""

    #: Keep the role's system prompt as the first message.
    system_prompt: bool = True
    #: Write per-message ``weight`` where the format has it (openai).
    weights: bool = False


def perspective(
    turns: Sequence[Turn], role: str, system_prompt: str, *, untrained: Collection[int] = ()
) -> list[dict[str, Any]]:
    """The messages ``role`` sees of the whole dialogue under ECP, with a weight on each of its
    own (assistant) turns: 0 for the turn indexes in ``untrained``, else 1. When ``role``
    speaks first, ECP's opening instruction is the first user message, as the agent saw it."""
    history = History(tuple(Utterance(cast(Speaker, t.speaker), t.text) for t in turns))
    projected = get_projection("ecp")(history, Viewer(cast(Speaker, role), system_prompt))
    offset = len(projected) - len(turns)
    out: list[dict[str, Any]] = []
    for k, m in enumerate(projected):
        msg: dict[str, Any] = {"role": m["role"], "content": m["content"]}
        if m["role"] == "assistant":
            msg["weight"] = 0 if turns[k - offset].index in untrained else 1
        out.append(msg)
    return out


Build = Callable[[Example, FormatOptions], dict[str, Any]]


@dataclass(frozen=True, slots=True)
class ExportFormat:
    """A registered format: its name, file layout and record builder."""

    name: str
    layout: Layout
    build: Build
    description: str


_REGISTRY: dict[str, ExportFormat] = {}


def register_format(name: str, *, layout: Layout, description: str) -> Callable[[Build], Build]:
    """Register a format under ``name`` (decorator)."""

    def decorator(fn: Build) -> Build:
        _REGISTRY[name] = ExportFormat(name, layout, fn, description)
        return fn

    return decorator


def format_names() -> list[str]:
    """Names of the registered formats."""
    return sorted(_REGISTRY)


def get_format(name: str) -> ExportFormat:
    """A format by name; an unknown name is a :class:`UserError` listing the known ones."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UserError(f"unknown export format {name!r}; choose from {', '.join(format_names())}") from None


def _messages(example: Example, options: FormatOptions) -> list[dict[str, Any]]:
    msgs = example.messages
    if not options.system_prompt or (msgs and msgs[0]["role"] == "system" and not msgs[0]["content"]):
        msgs = [m for m in msgs if m["role"] != "system"]
    return msgs


@register_format("openai", layout="jsonl", description="OpenAI chat fine-tuning JSONL")
def openai_format(example: Example, options: FormatOptions) -> dict[str, Any]:
    """``{"messages": [...]}``; ``weight`` (0/1) on assistant messages with ``options.weights``."""
    out = []
    for m in _messages(example, options):
        msg = {"role": m["role"], "content": m["content"]}
        if options.weights and "weight" in m:
            msg["weight"] = m["weight"]
        out.append(msg)
    return {"messages": out}


_SHAREGPT_FROM = {"system": "system", "user": "human", "assistant": "gpt"}


@register_format("sharegpt", layout="jsonl", description="ShareGPT conversations JSONL")
def sharegpt_format(example: Example, options: FormatOptions) -> dict[str, Any]:
    """``{"conversations": [{"from": "system|human|gpt", "value": ...}]}``."""
    return {"conversations": [{"from": _SHAREGPT_FROM[m["role"]], "value": m["content"]}
                              for m in _messages(example, options)]}


@register_format("hf", layout="parquet",
                 description="Parquet per split for datasets.load_dataset (messages + metadata)")
def hf_format(example: Example, options: FormatOptions) -> dict[str, Any]:
    """A row of :data:`HF_SCHEMA`."""
    messages = [{"role": m["role"], "content": m["content"]} for m in _messages(example, options)]
    return {"messages": messages, **{k: example.meta.get(k) for k in META_COLUMNS}}
