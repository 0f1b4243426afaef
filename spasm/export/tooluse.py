"""Examples that train tool use (tests/test_export_tools.py): a run with an ``events`` table exported as
each trained role saw it, calls and results included.

An example is one dialogue through one role's (or seat's) ECP frame
(:func:`spasm.projection.ecp`), over the history *with its events*: the role's own tool
calls are ``assistant`` messages with ``tool_calls`` and their results ``tool`` messages
answering the calls' ids; another seat's events reach it only as that event's notice inside a
``user`` message (never as a foreign ``tool`` message). Training the Client therefore keeps the
Client's own calls (dual control), and the Responder's calls never leak into the Client's
examples (the bug areal-project/AReaL#1741 had by stripping messages by role). Every
``assistant`` message of the role carries its weight, the calls of a turn the same as the
turn's utterance; nothing else is trained.

Each example also carries ``tools``: the OpenAI ``tools`` items of the tools the trained role
or seat could call (``owner``) and was offered in that dialogue (the names its calls'
``params`` record: a scenario may offer fewer), read from the tool modules the run's
``config.json`` names (:func:`spasm.tools.load_tools`, the one loader), so the schemas are
those the agent was offered. The formats render them as their trainers document:

* **openai**: ``tools`` beside ``messages``; ``tool_calls`` on assistant messages (no content
  when a step only calls), ``tool`` messages with ``tool_call_id``;
* **sharegpt** (LLaMA-Factory): a step's calls are one ``function_call`` turn whose value is
  ``{"name", "arguments"}`` (a list for parallel calls), its results one ``observation`` turn
  (a JSON list for several), and a ``tools`` column with the schemas as JSON text; the
  ``dataset_info.json`` entries name the column and the ``function_call``/``observation`` tags;
* **hf**: messages with ``tool_calls`` (``{id, type, function: {name, arguments}}``, the
  arguments as JSON text, which chat templates accept) and ``tool_call_id``, and a ``tools``
  column (JSON text; ``json.loads`` it for ``apply_chat_template(messages, tools=...)``).

:func:`tool_problems` is what ``--check`` adds for tool use: every call has an id, unique in
its example; its arguments are a JSON object that the tool's schema accepts (jsonschema, from
the ``export`` extra) and it names a tool of the example's ``tools``, when it has them; every ``tool`` message
answers a call made before it and not yet answered, and every call is answered before the
next message that is not a ``tool`` message.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from spasm.dataset import Run
from spasm.dataset.columns import load_params
from spasm.errors import ConfigError, UserError
from spasm.export.messages import ExampleMessage
from spasm.history import Event, History, Utterance
from spasm.projection import Viewer, get_projection

__all__ = [
    "HF_TOOL_CALLS",
    "SHAREGPT_TOOL_TAGS",
    "has_tool_messages",
    "hf_tool_fields",
    "offered_tools",
    "openai_tool_message",
    "run_tools",
    "sharegpt_tool_turns",
    "tool_perspective",
    "tool_problems",
    "tools_for",
]

#: The hf messages' ``tool_calls`` (arguments as JSON text, as the OpenAI protocol writes them).
HF_TOOL_CALLS = pa.list_(pa.struct([
    ("id", pa.string()), ("type", pa.string()),
    ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())])),
]))
#: The LLaMA-Factory tags a tool export's ShareGPT entries add.
SHAREGPT_TOOL_TAGS = {"function_tag": "function_call", "observation_tag": "observation"}


def run_tools(run: Run) -> dict[str, tuple[dict[str, Any], tuple[str, ...]]]:
    """Each tool of the run by name: its OpenAI ``tools`` item and who owns it, loaded from
    the modules the run's ``config.json`` names (paths as the run was given them, from the
    working directory). A module that does not load here is a :class:`UserError` saying so."""
    from spasm.tools import load_tools

    entries = (run.config or {}).get("tools") or []
    if not entries:
        return {}
    try:
        tools = load_tools([str(e) for e in entries], source=str(run.dir / "config.json"))
    except ConfigError as exc:
        raise UserError(f"{exc}\nThe export gives each example the schemas of the tools its "
                        "role could call, from the run's tool modules: run spasm export from "
                        "the directory the run was generated in, with the modules in place."
                        ) from None
    return {name: (t.spec(), t.owner) for name, t in tools.items()}


def offered_tools(run: Run, only: Collection[str] | None = None) -> dict[tuple[str, str], set[str]]:
    """The tools each speaker was offered in each dialogue, ``(dialogue id, speaker) -> names``:
    the ``tools`` of its calls' ``params`` (a scenario may offer fewer than the role owns); a
    speaker with calls but none offering tools has an empty set, one without calls (a run
    written without its call log) no entry."""
    if not run.has("calls"):
        return {}
    table = run.table("calls", ["dialogue_id", "role", "params"])
    out: dict[tuple[str, str], set[str]] = {}
    for did, role, raw in zip(*(table.column(c).to_pylist() for c in ("dialogue_id", "role",
                                                                        "params")), strict=True):
        if did is None or (only is not None and did not in only):
            continue
        params = load_params(raw)
        names = out.setdefault((str(did), str(role)), set())  # calls, maybe none with tools
        if params is not None and params.tools:
            names.update(params.tools)
    return out


def tools_for(tools: Mapping[str, tuple[dict[str, Any], tuple[str, ...]]], role: str,
              seat: str | None = None, offered: Collection[str] | None = None,
              ) -> list[dict[str, Any]]:
    """The ``tools`` items of the tools ``role`` (or the participant ``seat``) may call; with
    ``offered``, of those it was offered in the dialogue."""
    return [spec for name, (spec, owner) in tools.items()
            if (role in owner or (seat is not None and seat in owner))
            and (offered is None or name in offered)]


def tool_perspective(
    utterances: Sequence[tuple[int, str, str]], events: Sequence[Event], viewer: Viewer,
    untrained: Collection[int] = (),
) -> list[ExampleMessage]:
    """The ECP frame of ``viewer`` over the whole dialogue (``(turn index, speaker, text)``
    utterances and their events), with a weight on each of its assistant messages: 0 when the
    turn it belongs to is in ``untrained``, else 1 (a tool step's turn is its calls' turn)."""
    history = History(tuple(Utterance(s, t) for _, s, t in utterances)).with_events(events)
    projected = get_projection("ecp")(history, viewer)
    turn_of_call = {e.call_id: e.turn_index for e in events
                    if e.kind == "tool_call" and e.actor == viewer.speaker}
    own = iter([i for i, s, _ in utterances if s == viewer.speaker])
    out: list[ExampleMessage] = []
    for m in projected:
        msg: ExampleMessage = {"role": m["role"], "content": m["content"]}
        if "name" in m:
            msg["name"] = m["name"]
        if "tool_calls" in m:
            msg["tool_calls"] = [c.copy() for c in m["tool_calls"]]
            turn = turn_of_call.get(m["tool_calls"][0]["id"], -1)
            msg["weight"] = 0 if turn in untrained else 1
        elif m["role"] == "assistant":
            msg["weight"] = 0 if next(own) in untrained else 1
        if "tool_call_id" in m:
            msg["tool_call_id"] = m["tool_call_id"]
        out.append(msg)
    return out


def has_tool_messages(messages: Iterable[Mapping[str, Any]]) -> bool:
    """Whether a message list holds tool calls or tool results."""
    return any("tool_calls" in m or m.get("role") == "tool" for m in messages)


def openai_tool_message(m: Mapping[str, Any], msg: dict[str, Any]) -> dict[str, Any]:
    """``msg`` (an openai-format message) with ``m``'s tool fields: a step that only calls
    has its ``tool_calls`` and no ``content``; a result its ``tool_call_id``."""
    if "tool_calls" in m:
        msg["tool_calls"] = m["tool_calls"]
        if not msg.get("content"):
            msg.pop("content", None)
    if m.get("tool_call_id") is not None:
        msg["tool_call_id"] = m["tool_call_id"]
    return msg


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def sharegpt_tool_turns(messages: Sequence[Mapping[str, Any]],
                        plain: Mapping[str, str], value: Any) -> list[dict[str, str]]:
    """ShareGPT turns of messages that hold tool use: a step's calls one ``function_call``
    turn, the results after it one ``observation`` turn; other messages as ``plain`` names
    their ``from`` with ``value(message)``."""
    out: list[dict[str, str]] = []
    results: list[str] = []

    def flush() -> None:
        if results:
            text = results[0] if len(results) == 1 else json.dumps(
                [_json_or_text(r) for r in results], ensure_ascii=False)
            out.append({"from": "observation", "value": text})
            results.clear()

    for m in messages:
        if m.get("role") == "tool":
            results.append(str(m["content"]))
            continue
        flush()
        if "tool_calls" in m:
            calls = [{"name": c["function"]["name"],
                      "arguments": _json_or_text(c["function"]["arguments"])}
                     for c in m["tool_calls"]]
            out.append({"from": "function_call", "value": json.dumps(
                calls[0] if len(calls) == 1 else calls, ensure_ascii=False)})
        else:
            out.append({"from": plain[str(m["role"])], "value": value(m)})
    flush()
    return out


def hf_tool_fields(m: Mapping[str, Any]) -> dict[str, Any]:
    """The hf message's tool fields (null where the message has none)."""
    return {"tool_calls": m.get("tool_calls"), "tool_call_id": m.get("tool_call_id")}


# -- the check --------------------------------------------------------------------------------
def _schemas(example: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    problems: list[str] = []
    tools = example.get("tools")
    if tools is None:
        return {}, problems
    if not isinstance(tools, list):
        return {}, ["tools_not_a_list"]
    out: dict[str, Any] = {}
    for t in tools:
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            problems.append("bad_tool_spec")
            continue
        out[fn["name"]] = fn.get("parameters") or {"type": "object"}
    return out, problems


def _argument_problems(arguments: Any, schema: Mapping[str, Any] | None) -> list[str]:
    if not isinstance(arguments, str):
        return ["tool_arguments_not_json"]
    try:
        parsed = json.loads(arguments)
    except json.JSONDecodeError:
        return ["tool_arguments_not_json"]
    if not isinstance(parsed, dict):
        return ["tool_arguments_not_an_object"]
    if schema is None:
        return []
    try:
        import jsonschema
    except ImportError:  # the export extra is not installed: the schema check is skipped
        return []
    try:
        jsonschema.validate(parsed, dict(schema))
    except jsonschema.ValidationError as exc:
        return [f"tool_arguments_off_schema ({exc.message})"]
    except jsonschema.SchemaError:
        return ["bad_tool_spec"]
    return []


def tool_problems(example: Mapping[str, Any]) -> list[str]:
    """The tool-use problems of one openai-format example (empty: none, or no tool use)."""
    messages = example.get("messages")
    if not isinstance(messages, list):
        return []
    schemas, problems = _schemas(example)
    seen: set[str] = set()
    open_calls: list[str] = []
    for m in messages:
        if not isinstance(m, dict):
            continue
        if m.get("role") == "tool":
            cid = m.get("tool_call_id")
            if not isinstance(cid, str) or cid not in open_calls:
                problems.append("tool_result_without_call")
            else:
                open_calls.remove(cid)
            continue
        if open_calls:
            problems.append("tool_call_without_result")
            open_calls.clear()
        for call in m.get("tool_calls") or ():
            cid = call.get("id") if isinstance(call, dict) else None
            if not isinstance(cid, str) or not cid:
                problems.append("tool_call_without_id")
            elif cid in seen:
                problems.append("duplicate_tool_call_id")
            else:
                seen.add(cid)
                open_calls.append(cid)
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict):
                problems.append("tool_call_without_function")
                continue
            name = fn.get("name")
            if "tools" in example and name not in schemas:  # a file without tools: unchecked
                problems.append(f"unknown_tool ({name})")
            problems += _argument_problems(fn.get("arguments"), schemas.get(str(name)))
    if open_calls:
        problems.append("tool_call_without_result")
    return problems

