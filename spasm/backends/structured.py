"""Structured-output modes: how a request with a JSON schema is sent, and how its JSON is read.

Servers differ (docs/engine.md): OpenAI, vLLM and SGLang take ``response_format`` ``json_schema``;
llama.cpp's server takes ``json_object`` with a ``schema`` field (a grammar); DeepSeek takes
``json_object`` without one and wants the word "json" and an example in the prompt; anything
else gets the schema in the prompt and its reply parsed. A mode is a transport detail: the
:class:`~spasm.backends.base.ChatRequest` (and so its cache key) is the same in every mode; the
backend shapes the body when it sends.

A backend walks a *ladder* of transports, strictest first, and steps down when the server
rejects one (:func:`names_format` tells a rejection from other failures). ``auto`` walks the
whole ladder; a pinned mode only its own rung(s).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, create_model, model_validator

from spasm.backends.base import Message

__all__ = [
    "PromptedStep",
    "Transport",
    "extract_json",
    "instruction",
    "ladder",
    "names_format",
    "prompted_step_model",
    "prompted_tool_messages",
    "response_format",
    "schema_example",
    "with_instruction",
]

Mode = Literal["json_schema", "json_object", "text"]


@dataclass(frozen=True, slots=True)
class Transport:
    """One way to send a structured request."""

    mode: Mode
    #: ``json_object`` only: send the schema in ``response_format`` too (llama.cpp uses it).
    schema_field: bool = False

    @property
    def label(self) -> str:
        """How the manifest names it."""
        if self.mode == "json_object" and not self.schema_field:
            return "json_object (no schema field)"
        return self.mode


_JSON_SCHEMA = Transport("json_schema")
_OBJECT_WITH_SCHEMA = Transport("json_object", schema_field=True)
_OBJECT = Transport("json_object")
_TEXT = Transport("text")


def ladder(configured: str) -> tuple[Transport, ...]:
    """The transports a backend configured with ``configured`` may use, strictest first."""
    return {
        "auto": (_JSON_SCHEMA, _OBJECT_WITH_SCHEMA, _OBJECT, _TEXT),
        "json_schema": (_JSON_SCHEMA,),
        # A server that refuses the schema field may still take json_object (DeepSeek).
        "json_object": (_OBJECT_WITH_SCHEMA, _OBJECT),
        "text": (_TEXT,),
    }[configured]


def response_format(transport: Transport, schema: dict[str, Any]) -> dict[str, Any] | None:
    """The ``response_format`` for this transport (``None``: send none)."""
    if transport.mode == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}}
    if transport.mode == "json_object":
        return {"type": "json_object", "schema": schema} if transport.schema_field else {
            "type": "json_object"
        }
    return None


def schema_example(schema: dict[str, Any], root: dict[str, Any] | None = None, depth: int = 0) -> Any:
    """A small instance of ``schema`` to show the model (DeepSeek asks for an example).

    Strings are ``"..."``, numbers their minimum or 0, booleans ``true``, arrays one item; enums
    take their first value; local ``$ref`` and ``anyOf``/``oneOf`` (first non-null) are followed.
    """
    root = schema if root is None else root
    if depth > 16:
        return None
    if "$ref" in schema:
        node: Any = root
        for part in str(schema["$ref"]).lstrip("#").split("/"):
            if part:
                node = node.get(part, {}) if isinstance(node, dict) else {}
        return schema_example(node, root, depth + 1)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf"):
        if key in schema:
            branches = [b for b in schema[key] if b.get("type") != "null"]
            return schema_example(branches[0], root, depth + 1) if branches else None
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), None)
    if kind == "object" or (kind is None and "properties" in schema):
        props: dict[str, Any] = schema.get("properties") or {}
        return {name: schema_example(sub, root, depth + 1) for name, sub in props.items()}
    if kind == "array":
        return [schema_example(schema.get("items") or {}, root, depth + 1)]
    if kind in ("integer", "number"):
        low = schema.get("minimum", 0)
        return int(low) if kind == "integer" else float(low)
    if kind == "boolean":
        return True
    return "..."


def instruction(schema: dict[str, Any]) -> str:
    """What the prompt says when the server does not enforce the schema itself.

    It has the word "json" (DeepSeek refuses ``json_object`` requests without it), the schema
    and an example.
    """
    return (
        "Answer in json: reply with one JSON object and nothing else (no prose, no Markdown "
        f"fences). It must follow this JSON schema:\n{json.dumps(schema, ensure_ascii=False)}\n"
        f"For example:\n{json.dumps(schema_example(schema), ensure_ascii=False)}"
    )


def with_instruction(messages: list[Message], schema: dict[str, Any]) -> list[Message]:
    """``messages`` with :func:`instruction` appended to the last user or system message (a new
    user message when the conversation ends otherwise), so it is the last thing the model reads."""
    note = instruction(schema)
    out = list(messages)
    if out and out[-1]["role"] in ("user", "system"):
        last = out[-1]
        out[-1] = {"role": last["role"], "content": f"{last['content']}\n\n{note}"}
    else:
        out.append({"role": "user", "content": note})
    return out


#: Words in a server's error that say it is about the structured-output request.
_FORMAT_WORDS = re.compile(r"response_format|json_schema|json_object|\bschema\b|grammar", re.I)


def names_format(message: str | None) -> bool:
    """Whether a server's error message is about the structured-output part of the request."""
    return bool(message and _FORMAT_WORDS.search(message))


_FENCE = re.compile(r"```[ \t]*(?:json|JSON)?[ \t]*\n?(.*?)```", re.S)
_DECODER = json.JSONDecoder(strict=False)
#: Where to look for an object inside prose: the first so many opening braces.
_MAX_STARTS = 64


def extract_json(text: str) -> Any:
    """The JSON object in a model's reply: bare, in a Markdown fence, or inside prose.

    ``strict=False`` because llama.cpp grammars let raw newlines into JSON strings. Raises
    :class:`json.JSONDecodeError` (with the most useful position) when there is none.
    """
    stripped = text.strip()
    candidates = [m.group(1).strip() for m in _FENCE.finditer(stripped)] + [stripped]
    first_error: json.JSONDecodeError | None = None
    for candidate in candidates:
        start = candidate.find("{")
        tries = 0
        while start != -1 and tries < _MAX_STARTS:
            try:
                value, _ = _DECODER.raw_decode(candidate, start)
            except json.JSONDecodeError as exc:
                first_error = first_error or exc
            else:
                if isinstance(value, dict):
                    return value
            start = candidate.find("{", start + 1)
            tries += 1
    if first_error is not None:
        raise first_error
    return _DECODER.decode(stripped)  # raises with the position; or a non-object to validate


# -- tools in prompted mode ---------------------------------------------------------------------
#: The instruction a prompted tool step adds (after the tools' descriptions).
TOOL_STEP_INSTRUCTION = (
    "You can act before you answer. To use tools, reply with JSON "
    '{"tool_calls": [{"name": "<tool>", "arguments": {...}}]}; you will then see their results. '
    'To write your message instead, reply with JSON {"message": "<your message>"}.'
)


class PromptedCall(BaseModel):
    """One call in a prompted tool step."""

    model_config = ConfigDict(extra="forbid")

    name: str
    arguments: dict[str, Any] = {}


class PromptedStep(BaseModel):
    """A prompted tool step's reply: a message, or tool calls (one of the two)."""

    model_config = ConfigDict(extra="forbid")

    message: str | None = None
    tool_calls: list[PromptedCall] | None = None

    @model_validator(mode="after")
    def _one(self) -> PromptedStep:
        if not (self.message or "").strip() and not self.tool_calls:
            raise ValueError("reply with a non-empty message or at least one tool call")
        return self


@functools.cache
def prompted_step_model(names: tuple[str, ...]) -> type[PromptedStep]:
    """:class:`PromptedStep` with the call names restricted to ``names`` (so the embedded
    model's grammar can only name a tool it was offered); one class per set of names."""
    allowed: Any = Literal[names]
    call: Any = create_model(f"PromptedCall_{len(names)}", __base__=PromptedCall,
                             name=(allowed, ...))
    model: type[PromptedStep] = create_model(
        f"PromptedStep_{len(names)}", __base__=PromptedStep, tool_calls=(list[call] | None, None))
    return model


def prompted_tool_messages(messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> list[Message]:
    """A tool step's frame for a model without native tools: the tools described after the
    system prompt, each ``assistant`` message with ``tool_calls`` as the JSON it would have
    written, each ``tool`` message as a ``user`` line with the result (no role the chat
    template may not know)."""
    listing = "\n".join(
        f"- {t['function']['name']}: {t['function'].get('description', '')} Arguments (JSON "
        f"schema): {json.dumps(t['function'].get('parameters', {}), ensure_ascii=False)}"
        for t in tools)
    names: dict[str, str] = {}
    out: list[Message] = []
    for m in messages:
        if m["role"] == "system" and not out:
            out.append({"role": "system", "content": f"{m['content']}\n\nYour tools:\n{listing}\n\n"
                        f"{TOOL_STEP_INSTRUCTION}"})
        elif m["role"] == "assistant" and m.get("tool_calls"):
            calls = m.get("tool_calls") or []
            names.update({c["id"]: c["function"]["name"] for c in calls})
            shown = [{"name": c["function"]["name"],
                      "arguments": json.loads(c["function"]["arguments"] or "{}")} for c in calls]
            out.append({"role": "assistant",
                        "content": json.dumps({"tool_calls": shown}, ensure_ascii=False)})
        elif m["role"] == "tool":
            name = names.get(m.get("tool_call_id", ""), "the tool")
            out.append({"role": "user", "content": f"Result of {name}: {m['content']}"})
        else:
            out.append(m)
    return out
