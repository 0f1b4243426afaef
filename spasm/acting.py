"""A run with tools, the run layer's part: the tools and worlds checked before any
call, each dialogue's :class:`~spasm.tools.ToolBelt`, its events and worlds rows, its reward.

* :func:`check_tools` (at the start of ``spasm generate`` and of the dry run): the config's
  tool modules load, every scenario's world is a JSON object, the tools a scenario names
  exist, its reference actions name tools their actor owns and, replayed on the initial world,
  all run: anything else is a :class:`~spasm.errors.ConfigError` naming the scenario's file
  and line (exit 2 before any call).
* :func:`belt_for`: a dialogue's tools (the scenario's, or all), a deep copy of its world, its
  seats (participant id → role) and ``dialogue.max_tool_steps``.
* :func:`tool_rows`: the ``events`` rows (from the history) and the ``worlds`` rows (initial,
  each change, final, gold).
* :func:`reward`: τ²-bench's reward, the product of the scenario's ``success`` parts.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spasm.config import RunConfig, read_user_text
from spasm.dataset.integrity import file_sha256
from spasm.dataset.rows import EventRow, WorldRow
from spasm.errors import ConfigError
from spasm.history import History
from spasm.scenarios import Scenario, Success
from spasm.simulation import event_row
from spasm.tools import Tool, ToolBelt, canonical_json, load_tools, replay, world_sha256

__all__ = ["Reward", "belt_for", "check_tools", "gold_world", "reward", "run_tools", "tool_changes",
           "tool_rows", "tools_record", "world_of"]

_LOADED: dict[tuple[str, ...], dict[str, Tool]] = {}


def run_tools(config: RunConfig) -> dict[str, Tool]:
    """The run's tools by name, loaded once per process and config (``{}`` without tools)."""
    key = tuple(config.tools)
    if not key:
        return {}
    if key not in _LOADED:
        _LOADED[key] = load_tools(key, "config")
    return _LOADED[key]


def world_of(scenario: Scenario | None) -> dict[str, Any]:
    """A scenario's initial world (a JSON object; ``{}`` without a scenario or a world): inline,
    or read from its ``.json`` file. Anything not a JSON object is a ConfigError naming the
    scenario's line (and the file's line for a file that is not JSON)."""
    if scenario is None or scenario.world is None:
        return {}
    where = scenario.where or f"scenario {scenario.id!r}"
    world: Any = scenario.world
    if isinstance(world, str):
        path = Path(world)
        text = read_user_text(path, "world", kinds="a JSON file")
        try:
            world = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}, line {exc.lineno}: the world of scenario {scenario.id!r} "
                              f"({where}) is not JSON: {exc.msg}.") from None
    if not isinstance(world, dict):
        raise ConfigError(f"{where}: the world is a JSON object (a mapping), not "
                          f"{type(world).__name__}.")
    try:
        canonical_json(world)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: the world is not JSON ({exc}); quote dates and write "
                          "only strings, numbers, booleans, null, lists and mappings.") from None
    return world


def _offered(tools: Mapping[str, Tool], scenario: Scenario | None) -> dict[str, Tool]:
    if scenario is None or scenario.tools is None:
        return dict(tools)
    return {n: tools[n] for n in scenario.tools if n in tools}


def _seats(config: RunConfig) -> dict[str, str]:
    if config.participants is not None:
        return {p.id: p.role for p in config.participants}
    return {"client": "client", "responder": "responder"}


async def gold_world(tools: Mapping[str, Tool], scenario: Scenario) -> dict[str, Any] | None:
    """The world the scenario's reference actions give (``None``: it has none)."""
    if not scenario.reference_actions:
        return None
    gold, problems = await replay(tools, world_of(scenario), scenario.reference_actions)
    if problems:
        where = scenario.where or f"scenario {scenario.id!r}"
        raise ConfigError(f"{where}: the reference actions fail on the initial world: "
                          f"{'; '.join(problems)}. Fix the actions or the world.")
    return dict(gold)


async def check_tools(config: RunConfig, scenarios: Sequence[Scenario] | None) -> None:
    """Check everything a run with tools reads before it makes a call (see the module
    docstring); a run without tools whose scenarios have worlds or actions is told so."""
    tools = run_tools(config)
    seats = _seats(config)
    for s in scenarios or ():
        where = s.where or f"scenario {s.id!r}"
        acts = s.world is not None or s.reference_actions or s.tools is not None
        if not tools:
            if acts:
                raise ConfigError(f"{where}: scenario {s.id!r} has a world, tools or reference "
                                  "actions, but the config names no tools: add tools: [...] "
                                  "(docs/tools.md).")
            continue
        world_of(s)
        unknown = sorted(set(s.tools or ()) - set(tools))
        if unknown:
            raise ConfigError(f"{where}: scenario {s.id!r} names unknown tool(s) {unknown}; the "
                              f"run's tools are {sorted(tools)}.")
        offered = _offered(tools, s)
        for i, action in enumerate(s.reference_actions or (), start=1):
            name = action.get("tool")
            if set(action) - {"tool", "arguments", "actor"} or not isinstance(name, str):
                raise ConfigError(f"{where}: reference action {i} is {{tool, arguments, actor}} "
                                  f"(actor optional), not {action!r}.")
            if name not in offered:
                raise ConfigError(f"{where}: reference action {i} calls {name!r}, which is not "
                                  f"a tool of this scenario ({sorted(offered)}).")
            actor = action.get("actor")
            if actor is not None and not offered[name].owned_by(str(actor), seats.get(str(actor), "")):
                raise ConfigError(f"{where}: reference action {i}: {actor!r} does not own "
                                  f"{name!r} (its owner: {', '.join(offered[name].owner)}).")
            if not isinstance(action.get("arguments", {}), dict):
                raise ConfigError(f"{where}: reference action {i}: arguments are a mapping.")
        success = s.success
        if success is not None and (success.world or success.actions) and not s.reference_actions:
            raise ConfigError(f"{where}: success.world and success.actions compare with the "
                              "reference actions; give reference_actions or drop them.")
        await gold_world(offered, s)
    if tools:
        for t in tools.values():
            if not any(t.owned_by(seat, role) for seat, role in seats.items()):
                raise ConfigError(f"{t.where}: tool {t.name!r} is owned by "
                                  f"{', '.join(t.owner)}, which is no seat of this run "
                                  f"({', '.join(f'{k} ({v})' for k, v in seats.items())}).")


def _digest(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


def tools_record(config: RunConfig, scenarios: Sequence[Scenario] | None) -> dict[str, Any] | None:
    """What a run's manifest records of its tools and worlds, so a resume can tell an edit the
    config's fingerprint cannot see (it names files): each tool's definition (schema, owner,
    visibility, notice, timeout) and its module file's sha256, each scenario's initial world;
    ``sha256`` of it all. ``None`` in a run without tools."""
    tools = run_tools(config)
    if not tools:
        return None
    defined = {t.name: _digest({"spec": t.spec(), "owner": list(t.owner), "mutates": t.mutates,
                                "visible_to": t.visible_to, "notice": t.notice,
                                "timeout_s": t.timeout_s}) for t in tools.values()}
    sources: dict[str, str] = {}
    for t in tools.values():
        where = t.where.rpartition(":")[0]
        if where and Path(where).is_file():
            sources[t.name] = file_sha256(Path(where))
    worlds = {s.id: world_sha256(world_of(s)) for s in scenarios or ()}
    record = {"tools": defined, "sources": sources, "worlds": worlds}
    return {**record, "sha256": _digest(record)}


def tool_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    """What differs between two :func:`tools_record` s, for messages."""
    parts = []
    for key, what in (("tools", "tool definitions"), ("sources", "tool code"),
                      ("worlds", "scenario worlds")):
        a, b = old.get(key) or {}, new.get(key) or {}
        changed = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        if changed:
            parts.append(f"{what}: {', '.join(changed[:8])}")
    return "; ".join(parts) or "their digest differs"


def belt_for(config: RunConfig, scenario: Scenario | None) -> ToolBelt | None:
    """A dialogue's tools, world and seats (``None`` in a run without tools)."""
    tools = run_tools(config)
    if not tools:
        return None
    return ToolBelt(_offered(tools, scenario), world_of(scenario), _seats(config),
                    max_steps=config.dialogue.max_tool_steps)


def tool_rows(dialogue_id: str, history: History, belt: ToolBelt,
              gold: Mapping[str, Any] | None) -> tuple[list[EventRow], list[WorldRow]]:
    """The dialogue's ``events`` rows and ``worlds`` rows (initial, changes, final, gold)."""
    events = [event_row(dialogue_id, i, e) for i, e in enumerate(history.events)]
    states = [*belt.world.states, ("final", None, *belt.world.states[-1][2:])]
    if gold is not None:
        text = canonical_json(gold)
        states.append(("gold", None, text, world_sha256(gold)))
    worlds = [WorldRow(dialogue_id=dialogue_id, seq=i, kind=kind, event_seq=seq,
                       world_sha256=sha, world=text)
              for i, (kind, seq, text, sha) in enumerate(states)]
    return events, worlds


@dataclass(frozen=True)
class Reward:
    """A dialogue's reward: the product of the parts asked for, each part, and what it saw."""

    reward: float | None
    world_match: bool | None
    detail: str


def _same_call(t: Tool | None, made: str | None, wanted: Mapping[str, Any]) -> bool:
    try:
        got = json.loads(made or "{}")
    except json.JSONDecodeError:
        return False
    if t is not None:  # compare as the tool reads them (defaults filled in)
        try:
            return bool(t.arguments.model_validate(got) == t.arguments.model_validate(dict(wanted)))
        except ValueError:
            return False
    return bool(got == dict(wanted))


def reward(scenario: Scenario | None, history: History, belt: ToolBelt,
           gold: Mapping[str, Any] | None, goal_met: bool | None,
           responders: Sequence[str]) -> Reward:
    """τ²-bench's reward of one dialogue (see :class:`~spasm.scenarios.Success`); without a
    ``success:`` the world part is asked when the scenario has reference actions."""
    success = scenario.success if scenario is not None else None
    actions = (scenario.reference_actions or []) if scenario is not None else []
    if success is None:
        success = Success(world=bool(actions))
    final = belt.world.sha256
    gold_sha = world_sha256(gold) if gold is not None else None
    match = None if gold_sha is None else final == gold_sha
    parts: dict[str, float] = {}
    missing: list[dict[str, Any]] = []
    if success.world:
        parts["world"] = float(bool(match))
    if success.actions:
        done = [e for e in history.events if e.kind == "tool_result" and e.error is None]
        calls = {e.call_id: e for e in history.events if e.kind == "tool_call"}
        for a in actions:
            name, wanted = str(a.get("tool")), a.get("arguments") or {}
            if not any(r.tool == name and _same_call(belt.tools.get(name),
                                                     calls[r.call_id].arguments if r.call_id in calls
                                                     else None, wanted) for r in done):
                missing.append({"tool": name, "arguments": wanted})
        parts["actions"] = float(not missing)
    absent: list[str] = []
    if success.must_say:
        said = " ".join(u.content for u in history if u.speaker in responders).lower()
        absent = [s for s in success.must_say if s.lower() not in said]
        parts["must_say"] = float(not absent)
    if success.judge:
        parts["judge"] = float(goal_met is True)
    value: float | None = None
    if parts:
        value = 1.0
        for v in parts.values():
            value *= v
    detail = {"parts": parts, "final_sha256": final, "gold_sha256": gold_sha,
              "missing_actions": missing, "not_said": absent,
              "tool_errors": belt.errors, "prompted_fallbacks": belt.fallbacks,
              "turns_at_step_cap": belt.capped}
    return Reward(value, match, json.dumps(detail, ensure_ascii=False, sort_keys=True))
