"""Scenarios with goals (README, "Scenarios with goals"): what the Client comes for, and
what should happen.

A scenario has an ``id``, a ``situation`` and the Client's ``goal`` (both added to the Client's
card), an ``expected_outcome`` (never shown to either agent: only the goal judge reads it) and
an optional ``context`` for the Responder (added to its instructions). A run's ``scenarios`` is
a file (YAML: a list, or ``{scenarios: [...]}``; JSONL: one object a line; CSV: a header row)
or an inline list in the config. Scenarios are crossed with the personas; a persona with a
``scenario`` field or column (personas from a data file) runs only that scenario (1:1).

Every way a scenario file can be wrong is a :class:`~spasm.errors.ConfigError` naming the file
and the line (and the field), never a traceback. A definitions module: no model calls.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from spasm.config import RunConfig, read_user_text
from spasm.errors import ConfigError
from spasm.jsontext import JSONProblem, read_json
from spasm.personas.persona import Persona

__all__ = [
    "SCENARIO_COLUMN",
    "SCENARIO_ID",
    "Scenario",
    "client_card",
    "load_scenarios",
    "own_scenario",
    "parse_scenarios",
    "persona_scenarios",
    "responder_context",
    "run_scenarios",
    "scenario_changes",
    "scenarios_record",
]

#: A scenario id stands in dialogue ids and viewer URLs: letters, digits, ``.``, ``_``, ``-``.
SCENARIO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class Success(BaseModel):
    """A scenario's ``success:`` parts (τ²-bench's reward): ``world`` (the final world's hash
    equals the gold world's), ``actions`` (every reference call was made, with its arguments),
    ``must_say`` (strings the Responder must say, case ignored), ``judge`` (the goal judge's
    verdict). The reward is the product of the parts asked for."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    world: bool = False
    actions: bool = False
    must_say: list[str] = []
    judge: bool = False


class Scenario(BaseModel):
    """One scenario (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True)

    id: str = Field(min_length=1, max_length=64)
    situation: str = Field(min_length=1, max_length=4000)
    goal: str = Field(min_length=1, max_length=2000)
    expected_outcome: str = Field(min_length=1, max_length=2000)
    #: What the Responder knows for this scenario (a policy, an account's state); optional.
    context: str | None = Field(None, max_length=4000)
    #: A run with tools (docs/tools.md): the scenario's world, a JSON object inline or a
    #: ``.json`` file (read from the working directory), deep-copied for each dialogue.
    world: dict[str, Any] | str | None = None
    #: Tool calls (``{tool, arguments}``, optionally ``actor``) that, replayed on the initial
    #: world, give the gold world; checked when the run starts.
    reference_actions: list[dict[str, Any]] | None = None
    #: How success is measured; the reward is the product of the parts asked for.
    success: Success | None = None
    #: The tools this scenario offers (default: every tool of the run).
    tools: list[str] | None = None
    #: Where the scenario was written (``file, line N``), for messages.
    _where: str = PrivateAttr(default="")

    @property
    def where(self) -> str:
        """``file, line N`` (or ``file, scenario N``) the scenario was read from."""
        return self._where

    def __eq__(self, other: object) -> bool:
        # Two scenarios are equal by their fields, wherever they were read from.
        return isinstance(other, Scenario) and self.model_dump() == other.model_dump()

    def __hash__(self) -> int:
        return hash(self.id)


def client_card(card: str, scenario: Scenario | None) -> str:
    """The Client's card with the scenario's situation and goal (never the expected outcome)."""
    if scenario is None:
        return card
    return (f"{card}\n\nYour situation: {scenario.situation}\n"
            f"What you want from this conversation: {scenario.goal}")


def responder_context(instructions: str | None, scenario: Scenario | None) -> str | None:
    """The Responder's instructions with the scenario's context (it never sees the card, the
    situation, the goal or the expected outcome)."""
    if scenario is None or not scenario.context:
        return instructions
    context = f"What you know for this conversation: {scenario.context}"
    return f"{instructions}\n\n{context}" if instructions else context


def _problem(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(the record)"
        msg = "unknown field (typo?)" if err["type"] == "extra_forbidden" else err["msg"]
        parts.append(f"{loc}: {msg}")
    return "; ".join(parts)


def parse_scenarios(records: Sequence[tuple[int | None, Any]], source: str) -> list[Scenario]:
    """Validate ``(line, record)`` pairs from ``source`` into scenarios.

    Raises:
        ConfigError: a record is not a mapping, misses or misspells a field, has a bad id, or
            repeats an id — naming ``source`` and the line.
    """
    out: list[Scenario] = []
    seen: dict[str, int | None] = {}
    for i, (line, record) in enumerate(records):
        where = f"{source}, line {line}" if line is not None else f"{source}, scenario {i + 1}"
        if not isinstance(record, Mapping):
            raise ConfigError(f"{where}: a scenario is a mapping with id, situation, goal and "
                              f"expected_outcome (and optional context), not {type(record).__name__}.")
        data = {str(k): v for k, v in record.items()}
        if isinstance(data.get("id"), int) and not isinstance(data["id"], bool):
            data["id"] = str(data["id"])  # an id written as a number (YAML: id: 7)
        try:
            scenario = Scenario.model_validate(data)
        except ValidationError as exc:
            raise ConfigError(f"{where}: not a valid scenario: {_problem(exc)}") from None
        if not SCENARIO_ID.match(scenario.id) or ".." in scenario.id:
            raise ConfigError(f"{where}: scenario id {scenario.id!r} is not allowed: letters, digits, "
                              "'.', '_' and '-' only (no '..'), at most 64, e.g. refund-late-order.")
        if scenario.id in seen:
            first = seen[scenario.id]
            at = f"line {first}" if first is not None else "an earlier scenario"
            raise ConfigError(f"{where}: scenario id {scenario.id!r} repeats {at}; ids are unique.")
        seen[scenario.id] = line
        scenario._where = where
        out.append(scenario)
    if not out:
        raise ConfigError(f"{source}: no scenarios (write at least one, or leave scenarios out).")
    return out


def _read_text(path: Path) -> str:
    return read_user_text(path, "scenarios", kinds="a YAML, JSONL or CSV file")


def _yaml_records(text: str, source: str) -> list[tuple[int | None, Any]]:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f", line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{source}{line}: not valid YAML: {exc.problem or exc}") from None
    except (yaml.YAMLError, ValueError, TypeError, RecursionError) as exc:
        raise ConfigError(f"{source}: not valid YAML ({type(exc).__name__}: {exc})") from None
    if isinstance(data, dict) and set(data) == {"scenarios"}:
        data = data["scenarios"]
        assert isinstance(node, yaml.MappingNode)
        node = node.value[0][1]
    if not isinstance(data, list):
        raise ConfigError(f"{source}: a scenario file is a list of scenarios (or a mapping with one "
                          "key, scenarios:, holding the list).")
    items = node.value if isinstance(node, yaml.SequenceNode) else [None] * len(data)
    return [(n.start_mark.line + 1 if n is not None else None, r)
            for n, r in zip(items, data, strict=True)]


def _jsonl_records(text: str, source: str) -> list[tuple[int | None, Any]]:
    out: list[tuple[int | None, Any]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            out.append((number, read_json(line)))
        except JSONProblem as problem:
            if problem.kind == "syntax":
                raise ConfigError(f"{source}, line {number}, column {problem.column}: "
                                  f"{problem.reason}.") from None
            raise ConfigError(f"{source}, line {number}: {problem.reason}; write such a value "
                              "as a string, or flatten it.") from None
    return out


def _csv_records(text: str, source: str) -> list[tuple[int | None, Any]]:
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""), restkey="\0extra")
        if not reader.fieldnames:
            return []
        out: list[tuple[int | None, Any]] = []
        start = 2
        for row in reader:
            if "\0extra" in row:
                raise ConfigError(f"{source}, line {start}: more values than the header has columns.")
            record = {k: v for k, v in row.items() if k is not None and v not in (None, "")}
            if record:
                out.append((start, record))
            start = reader.line_num + 1
        return out
    except csv.Error as exc:
        raise ConfigError(f"{source}: not valid CSV ({exc}).") from None


def load_scenarios(path: str | Path) -> list[Scenario]:
    """Read a scenario file: ``.jsonl``/``.ndjson``, ``.csv``, else YAML (or JSON)."""
    p = Path(path)
    text = _read_text(p)
    suffix = p.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        records = _jsonl_records(text, str(p))
    elif suffix == ".csv":
        records = _csv_records(text, str(p))
    else:
        records = _yaml_records(text, str(p))
    return parse_scenarios(records, str(p))


def run_scenarios(config: RunConfig) -> list[Scenario] | None:
    """The run's scenarios (``None``: a run without scenarios)."""
    source = config.scenarios
    if source is None:
        return None
    if isinstance(source, str):
        return load_scenarios(source)
    return parse_scenarios([(None, dict(s)) for s in source], "config scenarios")


#: The column of a persona file (``personas.source``) that names a persona's own scenario
#: (matched like the schema's fields: case and surrounding spaces do not count).
SCENARIO_COLUMN = "scenario"


def _scenario_id(value: Any) -> str | None:
    """A cell as a scenario id (``None``: empty or null)."""
    if value is None:
        return None
    if isinstance(value, float) and not isinstance(value, bool):
        if math.isnan(value):
            return None  # a null cell (Parquet, pandas)
        return str(int(value)) if value.is_integer() else str(value)
    text = str(value).strip()
    return text or None


def own_scenario(persona: Persona) -> str | None:
    """The scenario id a persona names, or ``None``: a persona field ``scenario`` (a schema
    that has one), else the ``scenario`` column of the data-file row it came from (kept
    verbatim in ``persona_fields``, so a resumed run reads it from its personas table)."""
    wanted = _scenario_id(persona.fields.get("scenario"))
    if wanted is not None:
        return wanted
    raw = persona.source_fields
    if not isinstance(raw, str) or not raw:
        return None
    try:
        row = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(row, dict):
        return None
    for column, value in row.items():
        if str(column).strip().lower() == SCENARIO_COLUMN:
            return _scenario_id(value)
    return None


def persona_scenarios(persona: Persona, scenarios: list[Scenario]) -> list[Scenario]:
    """The scenarios a persona runs: all of them, or the one it names (:func:`own_scenario`)."""
    wanted = own_scenario(persona)
    if wanted is None:
        return scenarios
    for s in scenarios:
        if s.id == wanted:
            return [s]
    raise ConfigError(f"persona {persona.id!r} names scenario {wanted!r}, which the "
                      f"run's scenarios do not have (ids: {', '.join(s.id for s in scenarios[:10])}).")


#: Up to this many scenarios the manifest records each one's digest (``by_id``), so a changed
#: file can be told by id; a larger set records only the whole set's digest.
MAX_RECORDED_IDS = 10_000


def _digest(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def scenarios_record(config: RunConfig) -> dict[str, Any] | None:
    """What a run's manifest records of its scenarios (``None``: a run without scenarios):
    ``source`` (the file, or ``config`` for an inline list), ``count``, ``sha256`` of the set
    as parsed (every field of every scenario, by id: comments, layout and order do not count)
    and ``by_id``, each scenario's digest (first 16 hex digits; up to
    :data:`MAX_RECORDED_IDS` scenarios)."""
    scenarios = run_scenarios(config)
    if scenarios is None:
        return None
    return digest_record(config.scenarios if isinstance(config.scenarios, str) else "config",
                         {s.id: _recorded(s) for s in scenarios})


def digest_record(source: str, items: Mapping[str, Any]) -> dict[str, Any]:
    """What a manifest records of a set of items by id, so a resume can tell an edit of the
    file they came from (the scenarios: :func:`scenarios_record`; the rows of a persona file):
    ``source``, ``count``, ``sha256`` of the whole set and ``by_id``, each item's digest (first
    16 hex digits; up to :data:`MAX_RECORDED_IDS` items). :func:`scenario_changes` says what
    differs between two."""
    by_id = {k: _digest(v) for k, v in items.items()}
    record: dict[str, Any] = {"source": source, "count": len(by_id),
                              "sha256": _digest(sorted(by_id.items()))}
    if len(by_id) <= MAX_RECORDED_IDS:
        record["by_id"] = {k: v[:16] for k, v in sorted(by_id.items())}
    return record


#: Fields of a scenario with tools: left out of its digest while unset, so a scenario that
#: sets none of them is digested by its other fields alone (and matches older runs' records).
_ADDED_FIELDS = ("world", "reference_actions", "success", "tools")


def _recorded(s: Scenario) -> dict[str, Any]:
    data = s.model_dump(mode="json")
    for key in _ADDED_FIELDS:
        if data.get(key) is None:
            data.pop(key, None)
    return data


def _listed(ids: Sequence[str], limit: int = 8) -> str:
    more = f" and {len(ids) - limit:,} more" if len(ids) > limit else ""
    return ", ".join(ids[:limit]) + more


def scenario_changes(old: Mapping[str, Any], new: Mapping[str, Any], noun: str = "scenarios") -> str:
    """What differs between two :func:`digest_record` s, for messages: the ids changed,
    added and removed (or, without ``by_id``, the counts of ``noun``)."""
    before, after = old.get("by_id"), new.get("by_id")
    if not isinstance(before, Mapping) or not isinstance(after, Mapping):
        return (f"{old.get('count', '?')} {noun} before, {new.get('count', '?')} now; "
                "their content differs")
    changed = sorted(k for k in before.keys() & after.keys() if before[k] != after[k])
    added = sorted(after.keys() - before.keys())
    removed = sorted(before.keys() - after.keys())
    parts = [f"{what}: {_listed(ids)}" for what, ids in
             (("changed", changed), ("added", added), ("removed", removed)) if ids]
    return "; ".join(parts) or f"the digest of the {noun} differs"
