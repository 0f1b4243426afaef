"""Tools and a world: what agents can *do*, and the state they act on.

A tool is a Python function of yours, marked with :func:`tool` and called as
``fn(world, **arguments)``::

    import spasm

    @spasm.tool(owner="responder", mutates=True, notice="[The agent is updating your order]")
    def cancel_order(world: dict, order_id: str, reason: str = "") -> dict:
        \"\"\"Cancel an order that has not shipped.

        Args:
            order_id: The order's id, as the customer gives it.
            reason: Why, in the customer's words.
        \"\"\"
        ...

Its JSON schema is built from its type hints and its docstring (the first paragraph describes
the tool, ``Args:`` lines describe the parameters) through pydantic; the first parameter is the
world and is not part of the schema. ``owner`` says which role (``client``, ``responder``) or
participant id may call it (client tools give the simulated user its own actions: dual
control); ``mutates`` whether it may change the world; ``visible_to`` who sees its call and
result (``actor``: the caller alone, the default; ``all``; or a list of roles and ids);
``notice`` a line the others are shown instead of the payload.

The config names the modules that define tools (``tools: [examples/shop/tools.py,
my_pkg.tools]``); a plugin registers tools by importing a module that uses the decorator, and
the config may then name a tool by its name. Every tool lives in :data:`spasm.registry.TOOLS`.

The **world** is a scenario's state, a JSON object, deep-copied for each dialogue and hashed
canonically (sha256 of its sorted, compact JSON) after every change. A :class:`ToolBelt` binds
a dialogue's world, tools and seats: it runs the calls an agent asks for and returns them as
history events (:class:`~spasm.history.Event`). A call whose arguments fail the schema, that
raises, or that runs past its ``timeout_s`` becomes a result with an ``error``, which the agent
sees; it never ends the dialogue. A tool runs on a copy of the world, which becomes the world
only when it returns in time and ``mutates`` is set.

Bad definitions are :class:`~spasm.errors.ConfigError`\\ s naming the file and line of the
function (exit 2 before any call): a parameter without a type hint, a hint that gives no JSON
schema, a module that does not import.
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import inspect
import json
import re
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import anyio
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from spasm.backends.base import ToolCall
from spasm.backends.python import (
    AgentExit,
    describe_error_site,
    exit_text,
    exited_on_import,
    load_module_file,
    off_loop,
)
from spasm.errors import ConfigError
from spasm.history import Event, Speaker
from spasm.registry import TOOLS

__all__ = [
    "Tool",
    "ToolBelt",
    "ToolOutcome",
    "WorldLog",
    "canonical_json",
    "load_tools",
    "replay",
    "tool",
    "tool_specs",
    "world_sha256",
]

#: What a tool's ``visible_to`` may be: the caller alone, everyone, or roles and ids.
Visibility = Literal["actor", "all"] | tuple[str, ...]
#: A tool's name as the OpenAI protocol allows it.
TOOL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")
#: Longest result text an agent is shown (a tool that returns a whole database is cut).
MAX_RESULT_CHARS = 20_000


def canonical_json(value: Any) -> str:
    """The canonical JSON text of a value: sorted keys, compact, non-ASCII kept."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def world_sha256(world: Any) -> str:
    """sha256 of a world's canonical JSON (the same for equal worlds, whatever key order)."""
    return hashlib.sha256(canonical_json(world).encode()).hexdigest()


@dataclass(frozen=True)
class Tool:
    """One tool: the function, its schema and who may call and see it."""

    name: str
    fn: Callable[..., Any]
    description: str
    #: The arguments as a pydantic model (validates a call; its JSON schema is the tool's).
    arguments: type[BaseModel]
    #: Roles (``client``, ``responder``) or participant ids that may call it.
    owner: tuple[str, ...] = ("responder",)
    mutates: bool = False
    visible_to: Visibility = "actor"
    notice: str | None = None
    timeout_s: float = 10.0
    #: ``file:line`` of the function, for messages.
    where: str = ""

    @property
    def parameters(self) -> dict[str, Any]:
        """The JSON schema of the arguments."""
        return _parameters(self.arguments)

    def spec(self) -> dict[str, Any]:
        """The tool as an OpenAI ``tools`` item."""
        return {"type": "function", "function": {
            "name": self.name, "description": self.description, "parameters": self.parameters}}

    def owned_by(self, seat: str, role: str) -> bool:
        """Whether the seat ``seat`` (its role ``role``) may call this tool."""
        return seat in self.owner or role in self.owner

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


_SCHEMAS: dict[type[BaseModel], dict[str, Any]] = {}


def _parameters(model: type[BaseModel]) -> dict[str, Any]:
    if model not in _SCHEMAS:
        schema = model.model_json_schema()
        schema.pop("title", None)
        for prop in schema.get("properties", {}).values():
            prop.pop("title", None)
        _SCHEMAS[model] = schema
    return _SCHEMAS[model]


_ARG_LINE = re.compile(r"^\s*(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


def _docstring(fn: Callable[..., Any]) -> tuple[str, dict[str, str]]:
    """The description (the first paragraph) and the ``Args:`` lines of a docstring."""
    doc = inspect.getdoc(fn) or ""
    paragraphs = doc.split("\n\n")
    description = " ".join(paragraphs[0].split()) if paragraphs and paragraphs[0].strip() else ""
    args: dict[str, str] = {}
    current: str | None = None
    inside = False
    for line in doc.splitlines():
        stripped = line.strip()
        if stripped in ("Args:", "Arguments:", "Parameters:"):
            inside, current = True, None
            continue
        if not inside:
            continue
        if not stripped:
            continue
        if re.match(r"^[A-Z]\w*:$", stripped):  # Returns:, Raises: …
            inside = False
            continue
        m = _ARG_LINE.match(line)
        if m and not line.startswith("        "):
            current = m.group(1)
            args[current] = m.group(2).strip()
        elif current is not None:
            args[current] = f"{args[current]} {stripped}".strip()
    return description, args


def _where(fn: Callable[..., Any]) -> str:
    try:
        return f"{inspect.getsourcefile(fn)}:{inspect.getsourcelines(fn)[1]}"
    except (OSError, TypeError):
        return getattr(fn, "__qualname__", repr(fn))


def _arguments_model(fn: Callable[..., Any], name: str, where: str) -> type[BaseModel]:
    """The pydantic model of a tool's arguments (every parameter after the world)."""
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception as exc:
        raise ConfigError(f"{where}: tool {name!r}: its type hints cannot be read "
                          f"({type(exc).__name__}: {exc}).") from None
    params = list(inspect.signature(fn).parameters.values())
    if not params or params[0].kind not in (inspect.Parameter.POSITIONAL_ONLY,
                                           inspect.Parameter.POSITIONAL_OR_KEYWORD):
        raise ConfigError(f"{where}: tool {name!r} is called as fn(world, **arguments): its first "
                          "parameter is the world.")
    _, docs = _docstring(fn)
    fields: dict[str, Any] = {}
    for p in params[1:]:
        if p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise ConfigError(f"{where}: tool {name!r}: *{p.name} gives no JSON schema; name each "
                              "argument with a type hint.")
        if p.name not in hints:
            raise ConfigError(f"{where}: tool {name!r}: parameter {p.name!r} has no type hint, so "
                              "it has no JSON schema; write one (e.g. order_id: str).")
        default = ... if p.default is inspect.Parameter.empty else p.default
        fields[p.name] = (hints[p.name], Field(default, description=docs.get(p.name)))
    try:
        model: type[BaseModel] = create_model(
            f"{name}_arguments", __config__=ConfigDict(extra="forbid"), **fields)
        _parameters(model)
    except Exception as exc:  # pydantic: a hint it cannot validate or describe as JSON schema
        raise ConfigError(f"{where}: tool {name!r}: a type hint gives no JSON schema "
                          f"({type(exc).__name__}: {' '.join(str(exc).split())[:200]}); use "
                          "JSON types (str, int, float, bool, list, dict, Literal, a pydantic "
                          "model).") from None
    return model


def _owners(owner: str | Sequence[str], where: str, name: str) -> tuple[str, ...]:
    out = (owner,) if isinstance(owner, str) else tuple(owner)
    if not out or not all(isinstance(o, str) and o for o in out):
        raise ConfigError(f"{where}: tool {name!r}: owner is a role (client, responder) or a "
                          "participant id, or a list of them.")
    return out


def tool(
    fn: Callable[..., Any] | None = None, *, name: str | None = None,
    owner: str | Sequence[str] = "responder", mutates: bool = False,
    visible_to: str | Sequence[str] = "actor", notice: str | None = None,
    timeout_s: float = 10.0, description: str | None = None,
) -> Any:
    """Mark a function as a tool (a decorator, with or without arguments) and register it in
    :data:`spasm.registry.TOOLS` under its name; returns the :class:`Tool`, which can still be
    called like the function."""

    def decorate(f: Callable[..., Any]) -> Tool:
        where = _where(f)
        tool_name = name or f.__name__
        if not TOOL_NAME.match(tool_name):
            raise ConfigError(f"{where}: tool name {tool_name!r} is not allowed: letters, digits, "
                              "'_' and '-', at most 64, not starting with a digit.")
        if not timeout_s > 0:
            raise ConfigError(f"{where}: tool {tool_name!r}: timeout_s is a positive number of "
                              "seconds.")
        vis: Visibility
        if visible_to in ("actor", "all"):
            vis = visible_to  # type: ignore[assignment]
        elif isinstance(visible_to, str):
            vis = (visible_to,)
        else:
            vis = tuple(visible_to)
        described, _ = _docstring(f)
        t = Tool(
            name=tool_name, fn=f, description=description or described or tool_name,
            arguments=_arguments_model(f, tool_name, where), owner=_owners(owner, where, tool_name),
            mutates=mutates, visible_to=vis, notice=notice, timeout_s=float(timeout_s),
            where=where,
        )
        # The registry tells a plugin's registration from spasm's own by the module: the
        # function's, so a plugin's tool cannot shadow another plugin's name silently.
        object.__setattr__(t, "__module__", getattr(f, "__module__", None) or "")
        TOOLS.register(tool_name)(t)
        return t

    return decorate(fn) if fn is not None else decorate


# -- loading the tools a config names --------------------------------------------------------
def _module_tools(module: Any) -> list[Tool]:
    return [v for v in vars(module).values() if isinstance(v, Tool)]


def load_tools(entries: Iterable[str], source: str = "config") -> dict[str, Tool]:
    """The tools a config's ``tools:`` names: ``.py`` files, importable modules, or names a
    plugin registered; by name. Anything that keeps one from loading, a name two entries
    define, or an entry that defines no tool is a ConfigError naming it."""
    out: dict[str, Tool] = {}
    for entry in entries:
        what = f"{source}: tools entry {entry!r}"
        if entry.endswith(".py"):
            found = _module_tools(load_module_file(Path(entry), what))
        elif isinstance(registered := TOOLS.get(entry), Tool):
            found = [registered]
        else:
            try:
                module = importlib.import_module(entry)
            except ConfigError:
                raise
            except SystemExit as exc:  # a script's sys.exit() at import: exit 2, not spasm's exit
                raise exited_on_import(what, repr(entry), exc) from None
            except ModuleNotFoundError as exc:
                raise ConfigError(f"{what}: cannot import it ({exc}); name a .py file, an "
                                  "importable module, or a tool a plugin registers "
                                  f"(known: {', '.join(TOOLS.names()) or 'none'}).") from None
            except Exception as exc:
                raise ConfigError(f"{what}: importing it failed: {type(exc).__name__}: {exc}"
                                  f"{describe_error_site(exc)}") from None
            found = _module_tools(module)
        if not found:
            raise ConfigError(f"{what} defines no tool: mark its functions with @spasm.tool.")
        for t in found:
            if t.name in out and out[t.name].fn is not t.fn:
                raise ConfigError(f"{what}: tool {t.name!r} is defined twice ({out[t.name].where} "
                                  f"and {t.where}); give one another name (@spasm.tool(name=...)).")
            out[t.name] = t
    return out


def tool_specs(tools: Iterable[Tool]) -> tuple[dict[str, Any], ...]:
    """The OpenAI ``tools`` items of ``tools``, in the order given."""
    return tuple(t.spec() for t in tools)


# -- running calls ---------------------------------------------------------------------------
@dataclass(frozen=True)
class ToolOutcome:
    """What one call gave: its result as JSON text, or why it failed; the world after it."""

    result: str | None
    error: str | None
    world: Any
    changed: bool


def _result_text(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=_not_json)
    return text if len(text) <= MAX_RESULT_CHARS else text[: MAX_RESULT_CHARS - 1] + "…"


def _not_json(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    raise TypeError(f"a {type(value).__name__} is not JSON")


def _validation_error(exc: ValidationError) -> str:
    parts = [f"{'.'.join(str(x) for x in e['loc']) or 'arguments'}: {e['msg']}"
             for e in exc.errors()]
    return "arguments do not follow the schema: " + "; ".join(parts[:5])


async def invoke(t: Tool, world: Any, arguments: str) -> ToolOutcome:
    """Call ``t`` on a copy of ``world`` with ``arguments`` (JSON text as a model wrote it).
    Never raises for the tool's sake: a schema failure, an exception, a return that is not
    JSON or a call past ``timeout_s`` is an outcome with an ``error``."""
    try:
        raw = json.loads(arguments) if arguments.strip() else {}
    except (json.JSONDecodeError, RecursionError) as exc:
        return ToolOutcome(None, f"arguments are not valid JSON: {exc}", world, False)
    if not isinstance(raw, dict):
        return ToolOutcome(None, "arguments are a JSON object of named values", world, False)
    try:
        parsed = t.arguments.model_validate(raw)
    except ValidationError as exc:
        return ToolOutcome(None, _validation_error(exc), world, False)
    kwargs = {k: getattr(parsed, k) for k in type(parsed).model_fields}
    scratch = copy.deepcopy(world)
    try:
        # Off spasm's loop (a thread, or a loop of its own when async): a tool that blocks is
        # abandoned at its timeout and never keeps the process alive (backends.python).
        with anyio.move_on_after(t.timeout_s) as scope:
            value = await off_loop(t.fn, scratch, name_=f"spasm-tool-{t.name}", **kwargs)
    except AgentExit as exc:  # sys.exit() in a tool: the tool's failure, never spasm's exit
        return ToolOutcome(None, f"the tool {exit_text(exc)}", world, False)
    except Exception as exc:  # the tool's own failure is a result the agent sees
        return ToolOutcome(None, f"{type(exc).__name__}: {exc}", world, False)
    if scope.cancelled_caught:
        return ToolOutcome(None, f"the tool did not return within timeout_s={t.timeout_s:g}s",
                           world, False)
    try:
        text = _result_text(value)
    except (TypeError, ValueError) as exc:
        return ToolOutcome(None, f"the tool returned something that is not JSON ({exc})",
                           world, False)
    if not t.mutates:
        return ToolOutcome(text, None, world, False)
    try:
        changed = canonical_json(scratch) != canonical_json(world)
    except (TypeError, ValueError) as exc:
        return ToolOutcome(None, f"the tool left the world not JSON ({exc})", world, False)
    return ToolOutcome(text, None, scratch if changed else world, changed)


@dataclass
class WorldLog:
    """A dialogue's world and every state it went through (the ``worlds`` table)."""

    state: Any
    #: ``(kind, event seq, canonical JSON, sha256)``: ``initial``, then each ``change``.
    states: list[tuple[str, int | None, str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.state = copy.deepcopy(self.state)
        text = canonical_json(self.state)
        self.states.append(("initial", None, text, _sha(text)))

    @property
    def sha256(self) -> str:
        """The current state's hash."""
        return self.states[-1][3]

    def change(self, state: Any, seq: int) -> None:
        """The world after event ``seq`` changed it."""
        self.state = state
        text = canonical_json(state)
        self.states.append(("change", seq, text, _sha(text)))


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class ToolBelt:
    """One dialogue's tools, world and seats: runs the calls an agent asks for and returns
    them as events (see the module docstring)."""

    def __init__(self, tools: Mapping[str, Tool], world: Any, seats: Mapping[Speaker, str], *,
                 max_steps: int = 8) -> None:
        #: The tools by name.
        self.tools = dict(tools)
        #: Tool steps an agent may take within one turn before it must write its utterance
        #: (``dialogue.max_tool_steps``).
        self.max_steps = max_steps
        #: Prompted tool steps whose reply never parsed (the turn then writes plain text).
        self.fallbacks = 0
        #: Turns that used every step and were asked for their utterance without tools.
        self.capped = 0
        self.world = WorldLog(world)
        #: Participant id → role (two-party: ``client`` → ``client``, ``responder`` → ``responder``).
        self.seats = dict(seats)
        #: Events made so far (the next event's seq).
        self.n_events = 0
        #: Calls that failed (schema, exception, timeout), for the summary.
        self.errors = 0

    def offered(self, speaker: Speaker) -> list[Tool]:
        """The tools ``speaker`` may call, in name order."""
        role = self.seats.get(speaker, speaker)
        return [t for _, t in sorted(self.tools.items()) if t.owned_by(speaker, role)]

    def _visible(self, t: Tool, actor: Speaker) -> tuple[Speaker, ...]:
        if t.visible_to == "all":
            return tuple(self.seats)
        if t.visible_to == "actor":
            return (actor,)
        return tuple(s for s, role in self.seats.items()
                     if s == actor or s in t.visible_to or role in t.visible_to)

    def _event(self, **fields: Any) -> Event:
        self.n_events += 1
        return Event(world_sha256=self.world.sha256, **fields)

    async def run(self, actor: Speaker, turn_index: int, calls: Sequence[ToolCall]) -> list[Event]:
        """One step: every call's ``tool_call`` event (and its notice), then each result, in
        order; a tool ``actor`` may not call is a result with an error too."""
        events: list[Event] = []
        for c in calls:
            t = self.tools.get(c.name)
            vis = self._visible(t, actor) if t is not None else (actor,)
            events.append(self._event(kind="tool_call", actor=actor, turn_index=turn_index,
                                      visible_to=vis, call_id=c.id, tool=c.name,
                                      arguments=c.arguments))
            if t is not None and t.notice:
                others = tuple(s for s in self.seats if s not in vis)
                if others:
                    events.append(self._event(kind="notice", actor=actor, turn_index=turn_index,
                                              visible_to=others, call_id=c.id, tool=c.name,
                                              notice=t.notice))
        for c in calls:
            t = self.tools.get(c.name)
            role = self.seats.get(actor, actor)
            if t is None or not t.owned_by(actor, role):
                offered = ", ".join(x.name for x in self.offered(actor)) or "none"
                outcome = ToolOutcome(None, f"no tool {c.name!r} for you (yours: {offered})",
                                      self.world.state, False)
            else:
                outcome = await invoke(t, self.world.state, c.arguments)
            if outcome.error is not None:
                self.errors += 1
            seq = self.n_events
            if outcome.changed:
                self.world.change(outcome.world, seq)
            vis = self._visible(t, actor) if t is not None else (actor,)
            events.append(self._event(kind="tool_result", actor=actor, turn_index=turn_index,
                                      visible_to=vis, call_id=c.id, tool=c.name,
                                      result=outcome.result, error=outcome.error))
        return events


async def replay(tools: Mapping[str, Tool], world: Any,
                 actions: Sequence[Mapping[str, Any]]) -> tuple[Any, list[str]]:
    """Replay reference actions (``{"tool", "arguments"}``) on a copy of ``world``; returns
    the world they give and, for each action that failed, why (an empty list: all ran)."""
    state = copy.deepcopy(world)
    problems: list[str] = []
    for i, action in enumerate(actions):
        t = tools.get(str(action.get("tool")))
        if t is None:
            problems.append(f"action {i + 1}: no tool {action.get('tool')!r}")
            continue
        outcome = await invoke(t, state, json.dumps(action.get("arguments") or {}))
        if outcome.error is not None:
            problems.append(f"action {i + 1} ({t.name}): {outcome.error}")
        state = outcome.world
    return state, problems
