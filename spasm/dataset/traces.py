"""Exported traces grouped by session into conversations, for ``spasm import``
(:func:`spasm.dataset.importer.import_conversations`, ``--format otlp`` / ``langfuse``).

An application that logs its model calls keeps, per call, what the model was sent and what it
answered; a session (a chat with one person) is several calls. Each call's input ends with the
person's newest line and its output is the model's reply, so a session's calls in time order
give the conversation: per call, its last user message (when it is not the one the call before
ended with) and then its reply. The conversations come out as OpenAI-messages records
(``{"id", "user", "model", "messages"}``) that the importer reads like any other; each names
the line of the file its first call was on.

**OpenTelemetry (OTLP JSON)**: ``{"resourceSpans": [{"scopeSpans": [{"spans": [...]}]}]}``, one
document or one per line (the collector's file exporter). A GenAI span (semantic conventions
``gen_ai.*``) has its messages in ``gen_ai.input.messages`` / ``gen_ai.output.messages`` (JSON:
``[{"role", "parts": [{"type": "text", "content"}]}]``), in the older indexed attributes
``gen_ai.prompt.<i>.role|content`` / ``gen_ai.completion.<i>.content``, or in the events
``gen_ai.user.message`` / ``gen_ai.choice``. The session is ``session.id`` or
``gen_ai.conversation.id`` (on the span or its resource), else the trace id; the person is
``user.id`` or ``enduser.id``; the model ``gen_ai.response.model`` or ``gen_ai.request.model``.

**Langfuse**: an export of traces or observations (JSON array or JSONL). A ``GENERATION``
observation (or, in a file without any, a trace) has ``input`` (a message list, ``{"messages":
[...]}`` or a string: the person's line) and ``output`` (a string, a message, or ``{"content"}``);
the session is ``sessionId`` (else ``traceId``, else ``id``), the person ``userId``, the order
``startTime`` or ``timestamp``. A trace whose observations are ids only (the API's trace list)
is read as its own ``input`` and ``output``.

Nested observations (``parentObservationId``) are one step of the application each: the
generations under one top-level observation (a trace's root span, or each turn's span) answer
one line of the person, and only one of them is the reply; the others (a question rewritten for
retrieval, a tool call before the answer, a moderation check of the reply) are left out and
counted (``left_out.intermediate_generations``). The reply is the generation whose output is the
trace's ``output``; else the one sent the longest conversation (the chat history grows by every
turn; a helper call is sent a prompt of its own), the earliest of equals. Generations without a
parent are each a step of their own, as in a flat export.

Spans and observations that carry no message are left out and counted (``left_out.no_messages``).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from spasm.errors import UserError

__all__ = ["trace_conversations"]


def _otlp_value(value: Any) -> Any:
    """An OTLP ``AnyValue`` as a plain value."""
    if not isinstance(value, dict):
        return value
    for key in ("stringValue", "boolValue", "doubleValue"):
        if key in value:
            return value[key]
    if "intValue" in value:
        try:
            return int(value["intValue"])
        except (TypeError, ValueError):
            return value["intValue"]
    if "arrayValue" in value:
        return [_otlp_value(v) for v in (value["arrayValue"] or {}).get("values") or []]
    if "kvlistValue" in value:
        return _attributes((value["kvlistValue"] or {}).get("values"))
    return None


def _attributes(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, list):
        return {}
    return {str(a["key"]): _otlp_value(a.get("value")) for a in raw
            if isinstance(a, dict) and "key" in a}


def _text(content: Any) -> str:
    """A message's text: a string, or the text of its parts (``content`` or ``text``)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        if "parts" in content:
            return _text(content["parts"])
        return _text(content.get("content", content.get("text")))
    if isinstance(content, list):
        return "\n".join(t for t in (_text(p) if not isinstance(p, dict) or p.get("type") in
                                     (None, "text", "input_text", "output_text") else ""
                                     for p in content) if t)
    return str(content)


def _messages(value: Any) -> list[tuple[str, str]]:
    """(role, text) of a message list, given as a list or as its JSON text."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (json.JSONDecodeError, RecursionError, ValueError):
            return [("user", value)]
    if isinstance(value, dict) and "messages" in value:
        value = value["messages"]
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list):
        return []
    out = []
    for m in value:
        if isinstance(m, dict):
            out.append((str(m.get("role") or "user").lower(),
                        _text(m.get("parts", m.get("content", m.get("text"))))))
        elif isinstance(m, str):
            out.append(("user", m))
    return out


def _indexed(attrs: dict[str, Any], prefix: str) -> list[tuple[str, str]]:
    """OpenLLMetry's ``gen_ai.prompt.<i>.role`` / ``.content`` attributes, in index order."""
    found: dict[int, dict[str, Any]] = {}
    for key, value in attrs.items():
        if key.startswith(prefix):
            index, _, field = key[len(prefix):].partition(".")
            if index.isdigit():
                found.setdefault(int(index), {})[field] = value
    default = "assistant" if "completion" in prefix else "user"
    return [(str(found[i].get("role") or default).lower(), _text(found[i].get("content")))
            for i in sorted(found)]


def _span_messages(span: dict[str, Any], attrs: dict[str, Any]) -> tuple[list[tuple[str, str]],
                                                                          list[tuple[str, str]]]:
    """A GenAI span's input and output messages."""
    inputs = _messages(attrs["gen_ai.input.messages"]) if "gen_ai.input.messages" in attrs \
        else _indexed(attrs, "gen_ai.prompt.")
    outputs = _messages(attrs["gen_ai.output.messages"]) if "gen_ai.output.messages" in attrs \
        else _indexed(attrs, "gen_ai.completion.")
    for event in span.get("events") or []:
        if not isinstance(event, dict):
            continue
        name, ev = str(event.get("name") or ""), _attributes(event.get("attributes"))
        body = _otlp_value(event.get("body")) if "body" in event else ev
        if name in ("gen_ai.user.message", "gen_ai.system.message", "gen_ai.assistant.message"):
            role = name.split(".")[1]
            inputs.append((role, _text(body.get("content") if isinstance(body, dict) else body)))
        elif name == "gen_ai.choice":
            message = body.get("message", body) if isinstance(body, dict) else body
            outputs.append(("assistant", _text(message)))
    return inputs, [("assistant", t) for r, t in outputs if r in ("assistant", "model") and t]


class _Call:
    """One model call of a session: when, who, the model, the person's line and the reply."""

    def __init__(self, line: int, when: Any, user: str | None, model: str | None,
                 inputs: list[tuple[str, str]], reply: str) -> None:
        self.line, self.when, self.user, self.model = line, when, user, model
        self.inputs, self.reply = inputs, reply


def _otlp_calls(src: Path, records: Iterable[tuple[int, dict[str, Any]]],
                skipped: Counter[str]) -> Iterator[tuple[str, _Call]]:
    for line_no, doc in records:
        resource_spans = doc.get("resourceSpans")
        if not isinstance(resource_spans, list):
            raise UserError(f"{src}:{line_no} has no 'resourceSpans' list; is this OTLP JSON "
                            "(an ExportTraceServiceRequest)?")
        for rs in resource_spans:
            resource = _attributes(((rs or {}).get("resource") or {}).get("attributes"))
            for ss in (rs or {}).get("scopeSpans") or (rs or {}).get("instrumentationLibrarySpans") or []:
                for span in (ss or {}).get("spans") or []:
                    if not isinstance(span, dict):
                        raise UserError(f"{src}:{line_no}: a span is not a JSON object.")
                    attrs = {**resource, **_attributes(span.get("attributes"))}
                    inputs, outputs = _span_messages(span, attrs)
                    if not any(t for _, t in inputs) and not outputs:
                        skipped["no_messages"] += 1  # not a model call (a tool, an HTTP span)
                        continue
                    session = (attrs.get("session.id") or attrs.get("gen_ai.conversation.id")
                               or span.get("traceId"))
                    if not session:
                        raise UserError(f"{src}:{line_no}: a GenAI span has no session.id, "
                                        "gen_ai.conversation.id or traceId to group it by.")
                    when = span.get("startTimeUnixNano")
                    try:
                        when = int(when) if when is not None else 0
                    except (TypeError, ValueError):
                        raise UserError(f"{src}:{line_no}: startTimeUnixNano {str(when)[:40]!r} "
                                        "is not a number.") from None
                    user = attrs.get("user.id") or attrs.get("enduser.id")
                    model = attrs.get("gen_ai.response.model") or attrs.get("gen_ai.request.model")
                    yield str(session), _Call(line_no, when, None if user is None else str(user),
                                              None if model is None else str(model), inputs,
                                              "\n".join(t for _, t in outputs))


def _reply(output: Any) -> str:
    """A Langfuse ``output`` as the reply's text."""
    if isinstance(output, list):
        return "\n".join(t for r, t in _messages(output) if r in ("assistant", "model"))
    return _text(output)


def _top(o: dict[str, Any], parents: dict[str, Any]) -> str | None:
    """The top-level observation ``o`` is nested in (its own id when it has no parent in the
    file); ``None`` for an observation without an id."""
    oid = o.get("id")
    if not isinstance(oid, str):
        return None
    seen = {oid}
    while isinstance(parents.get(oid), str) and parents[oid] in parents and parents[oid] not in seen:
        oid = parents[oid]
        seen.add(oid)
    return oid


def _conversation_length(inputs: list[tuple[str, str]]) -> int:
    return sum(1 for r, _ in inputs if r != "system")


def _step_reply(group: list[dict[str, Any]], trace_output: str) -> dict[str, Any]:
    """The generation of one step that answers the person (see the module's docstring)."""
    replies = [o for o in group if _reply(o.get("output"))] or group
    final = [o for o in replies if trace_output and _reply(o.get("output")) == trace_output]
    if final:
        return final[0]
    longest = max(_conversation_length(_messages(o.get("input"))) for o in replies)
    return next(o for o in replies if _conversation_length(_messages(o.get("input"))) == longest)


def _langfuse_calls(src: Path, records: Iterable[tuple[int, dict[str, Any]]],
                    skipped: Counter[str]) -> Iterator[tuple[str, _Call]]:
    items: list[tuple[int, dict[str, Any]]] = []
    outputs: dict[str, str] = {}  # each trace's own output: the reply it gave the person
    whole: set[int] = set()  # traces listed with their observations' ids only: read as calls
    for line_no, rec in records:
        observations = rec.get("observations")
        inlined = [o for o in observations if isinstance(o, dict)] if isinstance(observations, list) else []
        if inlined:  # a trace with its observations inlined
            if isinstance(rec.get("id"), str):
                outputs[rec["id"]] = _reply(rec.get("output"))
            for o in inlined:
                items.append((line_no, {"sessionId": rec.get("sessionId"), "userId": rec.get("userId"),
                                        "traceId": rec.get("id"), **o}))
        else:  # observations, or a trace without them inlined (its own input and output)
            if isinstance(observations, list):
                whole.add(id(rec))
            items.append((line_no, rec))
    generations = any(str(o.get("type") or "").upper() == "GENERATION" for _, o in items)
    parents = {o["id"]: o.get("parentObservationId") for _, o in items if isinstance(o.get("id"), str)}
    steps: dict[tuple[Any, str], list[tuple[int, dict[str, Any]]]] = {}
    order: list[tuple[int, dict[str, Any]] | tuple[Any, str]] = []
    for line_no, o in items:
        if generations and str(o.get("type") or "").upper() != "GENERATION" and id(o) not in whole:
            skipped["not_a_generation"] += 1  # a span or event around the model calls
            continue
        top = None if id(o) in whole else _top(o, parents)
        if generations and top is not None and top != o.get("id"):  # nested: one step's call
            key = (o.get("traceId"), top)
            if key not in steps:
                order.append(key)
            steps.setdefault(key, []).append((line_no, o))
        else:
            order.append((line_no, o))
    for entry in order:
        if isinstance(entry[1], dict):
            line_no, o = entry[0], entry[1]
        else:
            group = steps[entry]
            trace_id = entry[0]
            chosen = _step_reply([o for _, o in group], outputs.get(trace_id, "")
                                 if isinstance(trace_id, str) else "")
            line_no, o = next(x for x in group if x[1] is chosen)
            skipped["intermediate_generations"] += len(group) - 1
        inputs = _messages(o.get("input"))
        reply = _reply(o.get("output"))
        if not any(t for _, t in inputs) and not reply:
            skipped["no_messages"] += 1
            continue
        session = o.get("sessionId") or o.get("traceId") or o.get("id")
        if not session:
            raise UserError(f"{src}:{line_no}: a Langfuse record has no sessionId, traceId or "
                            "id to group it by.")
        user, model = o.get("userId"), o.get("model")
        yield str(session), _Call(line_no, str(o.get("startTime") or o.get("timestamp") or ""),
                                  None if user is None else str(user),
                                  None if model is None else str(model), inputs, reply)


def trace_conversations(src: Path, fmt: str, records: Iterable[tuple[int, dict[str, Any]]],
                        skipped: Counter[str]) -> list[tuple[int, dict[str, Any]]]:
    """Each session's conversation as an OpenAI-messages record, with the line its first call
    is on, in the order the sessions first appear. ``skipped`` counts what was left out."""
    calls = (_otlp_calls if fmt == "otlp" else _langfuse_calls)(src, records, skipped)
    sessions: dict[str, list[_Call]] = {}
    for session, call in calls:
        sessions.setdefault(session, []).append(call)
    out = []
    for session, group in sessions.items():
        group.sort(key=lambda c: c.when)  # a stable sort: calls at one time keep file order
        messages: list[dict[str, str]] = []
        last_user: str | None = None
        for call in group:
            users = [t for r, t in call.inputs if r in ("user", "human") and t]
            if not messages:  # the first call: the history it was sent, system prompt left out
                for role, text in call.inputs:
                    if role in ("user", "human", "assistant", "model") and text:
                        messages.append({"role": "user" if role in ("user", "human")
                                         else "assistant", "content": text})
            elif users and users[-1] != last_user:
                messages.append({"role": "user", "content": users[-1]})
            last_user = users[-1] if users else last_user
            if call.reply:
                messages.append({"role": "assistant", "content": call.reply})
        user = next((c.user for c in group if c.user), None)
        model = next((c.model for c in group if c.model), None)
        record: dict[str, Any] = {"id": session, "messages": messages}
        if user is not None:
            record["user"] = user
        if model is not None:
            record["model"] = model
        out.append((group[0].line, record))
    return out
