"""Dry-run cost estimates by construction (docs/engine.md, "Cost control"): calls, tokens and
cost before spending.

The dry run does not model the run with a formula of its own: it *runs* the planned dialogues
through the same code (:func:`spasm.simulation.simulate_dialogue`, the harness at each level,
the projection of each condition, the termination chain, the persona pipeline) against
:class:`~spasm.backends.scripted.ScriptedBackend`\\ s that answer at once and count tokens, and
adds up the call rows that come back, priced with each backend's ``prices``. So every call of
every harness level and projection is priced, and a new layer or projection needs no change here.

What the code cannot know is how long dialogues run and how long replies are. Without data we
assume the worst: every dialogue reaches the cap and every free-text reply is ``max_tokens``
long (structured replies are the smallest valid JSON; calibrate to price real ones). With data
(a pilot of a few real dialogues, ``--pilot N``, or the dialogues a run already finished) we
use the observed mean length and reply size, and the ratios of the API's token counts to what
the scripted simulation of those same dialogues counted.

A large plan is estimated from a sample: up to :data:`SAMPLE_PER_GROUP` dialogues of each
(pairing, condition, harness level), each standing for its share of the group.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from spasm.backends.scripted import ScriptedBackend
from spasm.calls import Caller
from spasm.config import RunConfig
from spasm.dataset.columns import load_params
from spasm.errors import RunError
from spasm.harness.levels import level_label
from spasm.runner import PlannedDialogue, run_dialogue

#: Plans up to this many dialogues are simulated in full.
SIMULATE_ALL_UP_TO = 32
#: Larger plans: dialogues simulated per (pairing, condition, harness level).
SAMPLE_PER_GROUP = 4
#: Finished dialogues re-simulated to measure the API-to-count token ratios.
CALIBRATION_DIALOGUES = 8

UPPER_BOUND = (
    "upper bound: every dialogue to the cap, every free-text reply max_tokens; structured "
    "replies at their smallest valid JSON"
)
_LANDED = ("ok", "cache_hit", "invalid_output")  # calls that returned a completion


class TableSource(Protocol):
    """Where finished tables are read from (the run's store)."""

    def read(self, table: str, columns: list[str] | None = None) -> pa.Table | None: ...


@dataclass(frozen=True)
class Calibration:
    """What a pilot (or finished dialogues) tells about the run."""

    utterances: float | None  # mean utterances per dialogue; None: the cap
    reply_tokens: float | None  # mean completion tokens per free-text reply; None: max_tokens
    prompt_scale: float = 1.0  # API-reported prompt tokens / the simulation's count
    structured_scale: float = 1.0  # the same for completion tokens of structured replies
    dialogues: int = 0
    source: str = UPPER_BOUND


@dataclass
class Estimate:
    """Estimated usage of a group of dialogues (a pairing, or a condition and harness level)."""

    label: str
    #: What the row groups by: ``(pairing,)`` or ``(condition, harness level)``.
    key: tuple[str, ...] = ()
    dialogues: int = 0
    calls: float = 0.0
    prompt_tokens: float = 0.0
    completion_tokens: float = 0.0
    cost: float = 0.0

    @property
    def total_tokens(self) -> float:
        return self.prompt_tokens + self.completion_tokens

    def add(self, other: Estimate) -> None:
        """Add ``other``'s usage (not its dialogue count) to this one."""
        self.calls += other.calls
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.cost += other.cost


@dataclass
class DryRun:
    """The whole estimate: by pairing, by condition and harness level, and the persona calls."""

    pairings: list[Estimate]
    levels: list[Estimate]
    #: Calls outside any dialogue (validator, crafter, policy extraction at persona time).
    personas: Estimate
    calibration: Calibration | None
    planned: int
    simulated: int
    #: Calls per role (``client``, ``reducer``, ``checker``, ``judge``, ``validator``, …).
    roles: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> Estimate:
        total = Estimate("TOTAL", dialogues=self.planned)
        for e in [*self.pairings, self.personas]:
            total.add(e)
        return total


@dataclass(frozen=True)
class _Call:
    """The part of a call row an estimate needs."""

    dialogue_id: str | None
    role: str
    backend: str
    prompt_tokens: int
    completion_tokens: int
    structured: bool


def _as_call(row: Any) -> _Call:
    """A call row (a typed row or a plain mapping) as a :class:`_Call`."""
    get = row.get if isinstance(row, Mapping) else lambda k: getattr(row, k)
    params = load_params(get("params"))
    return _Call(get("dialogue_id"), str(get("role")), str(get("backend")),
                 int(get("prompt_tokens") or 0), int(get("completion_tokens") or 0),
                 bool(params and params.structured))


def _price(calls: Iterable[_Call], config: RunConfig, cal: Calibration, weight: float,
           into: Iterable[Estimate], roles: dict[str, float]) -> None:
    """Add ``calls`` (simulated, so scaled by ``cal``) times ``weight`` to every target."""
    one = Estimate("")
    for c in calls:
        # A policy is extracted once per run, by whichever dialogue asks first: never scaled.
        w = 1.0 if c.role == "policy" else weight
        roles[c.role] = roles.get(c.role, 0.0) + w
        prompt = c.prompt_tokens * cal.prompt_scale * w
        completion = c.completion_tokens * (cal.structured_scale if c.structured else 1.0) * w
        prices = config.backends[c.backend].prices
        one.calls += w
        one.prompt_tokens += prompt
        one.completion_tokens += completion
        one.cost += prices.cost(prompt, completion)
    for target in into:
        target.add(one)


def scripted_caller(config: RunConfig, reply_tokens: float | None = None) -> Caller:
    """A :class:`Caller` whose backends are scripted stand-ins for the config's: same names,
    models and prices; no cache, no rate limits, no budget cap, nothing sent anywhere."""
    backends = {
        name: ScriptedBackend(name, cfg, reply_tokens=reply_tokens, overrides={"finished": False})
        for name, cfg in config.backends.items()
    }
    configs = {
        name: cfg.model_copy(update={"rpm": None, "tpm": None})
        for name, cfg in config.backends.items()
    }
    return Caller(dict(backends), configs, cache=None,
                  reask_attempts=config.engine.reask_attempts, sleep_scale=0.0)


def _with_exchanges(config: RunConfig, exchanges: int) -> RunConfig:
    """The config with its cap at ``exchanges`` turns per agent (where the simulation stops)."""
    dialogue = config.dialogue.model_copy(update={"max_turns_per_agent": exchanges})
    return config.model_copy(update={"dialogue": dialogue})


def _lengths(config: RunConfig, cal: Calibration) -> list[tuple[int, float]]:
    """(turns per agent, weight) to simulate: the cap, or the calibrated mean between the two
    whole lengths around it (a dialogue stops after an exchange)."""
    cap = config.dialogue.max_turns_per_agent
    if cal.utterances is None:
        return [(cap, 1.0)]
    mean = min(float(cap), max(1.0, cal.utterances / 2))
    lo, hi = math.floor(mean), math.ceil(mean)
    if lo == hi:
        return [(lo, 1.0)]
    return [(lo, hi - mean), (hi, mean - lo)]


def _group(spec: PlannedDialogue) -> tuple[str, str, str]:
    return spec.pairing_label, spec.condition, level_label(*spec.levels)


def sample(specs: Sequence[PlannedDialogue]) -> list[tuple[PlannedDialogue, float]]:
    """The dialogues to simulate, each with how many planned dialogues it stands for: all of
    them for a small plan, else up to :data:`SAMPLE_PER_GROUP` per (pairing, condition,
    level), spread over the group (different personas and seeds)."""
    if len(specs) <= SIMULATE_ALL_UP_TO:
        return [(s, 1.0) for s in specs]
    groups: dict[tuple[str, str, str], list[PlannedDialogue]] = {}
    for s in specs:
        groups.setdefault(_group(s), []).append(s)
    out: list[tuple[PlannedDialogue, float]] = []
    for members in groups.values():
        k = min(SAMPLE_PER_GROUP, len(members))
        picks = sorted({round(i * (len(members) - 1) / max(1, k - 1)) for i in range(k)})
        if k == 1:
            picks = [len(members) // 2]
        out += [(members[i], len(members) / len(picks)) for i in picks]
    return out


async def _simulate(
    spec: PlannedDialogue, config: RunConfig, caller: Caller, exchanges: int
) -> list[_Call]:
    result = await run_dialogue(spec, _with_exchanges(config, exchanges), caller)
    if result.error is not None:
        error = result.error
        why = error.get("error") if isinstance(error, Mapping) else getattr(error, "error", error)
        raise RunError(f"the dry run could not simulate dialogue {spec.dialogue_id}: {why}")
    return [_as_call(r) for r in result.calls]


async def estimate(
    config: RunConfig,
    specs: Sequence[PlannedDialogue],
    calibration: Calibration | None = None,
    *,
    persona_calls: Sequence[Any] = (),
    persona_calls_measured: bool = False,
) -> DryRun:
    """Simulate ``specs`` (or a sample) with scripted backends and add up their call rows.

    ``persona_calls`` are the call rows of the persona pipeline: measured (a real run's, taken
    as they are) or simulated (scaled like the dialogues' calls).
    """
    cal = calibration or Calibration(None, None)
    caller = scripted_caller(config, cal.reply_tokens)
    pairings: dict[str, Estimate] = {}
    levels: dict[tuple[str, str], Estimate] = {}
    roles: dict[str, float] = {}
    for s in specs:
        label = s.pairing_label
        pairings.setdefault(label, Estimate(label, (label,))).dialogues += 1
        key = (s.condition, level_label(*s.levels))
        levels.setdefault(key, Estimate(f"{key[0]}, level {key[1]}", key)).dialogues += 1
    chosen = sample(specs)
    for spec, weight in chosen:
        targets = [pairings[spec.pairing_label], levels[(spec.condition, level_label(*spec.levels))]]
        for exchanges, share in _lengths(config, cal):
            calls = await _simulate(spec, config, caller, exchanges)
            _price(calls, config, cal, weight * share, targets, roles)
    personas = Estimate("personas")
    rows = [_as_call(r) for r in persona_calls]
    _price(rows, config, cal if not persona_calls_measured else Calibration(None, None), 1.0,
           [personas], roles)
    return DryRun(list(pairings.values()), list(levels.values()), personas, calibration,
                  len(specs), len(chosen), roles)


def stored_persona_calls(store: TableSource) -> list[dict[str, Any]]:
    """The call rows a run made outside any dialogue (its persona pipeline), as recorded."""
    calls = store.read("calls")
    if calls is None:
        return []
    landed = calls.filter(pc.is_in(calls.column("outcome"), pa.array(_LANDED)))
    return [r for r in landed.to_pylist() if r.get("dialogue_id") is None]


@dataclass
class _Observed:
    """Prompt and structured-completion tokens of a set of dialogues."""

    prompt: float = 0.0
    structured: float = 0.0
    free_text: list[int] = field(default_factory=list)

    def add(self, c: _Call) -> None:
        self.prompt += c.prompt_tokens
        if c.structured:
            self.structured += c.completion_tokens
        else:
            self.free_text.append(c.completion_tokens)


async def calibrate(
    store: TableSource, config: RunConfig, specs: Sequence[PlannedDialogue]
) -> Calibration | None:
    """Learn length, reply size and token-count ratios from the run's finished dialogues.

    Up to :data:`CALIBRATION_DIALOGUES` of them are simulated again, at their real length and
    the observed reply size; the ratios are what the API reported over what that counted.
    """
    dialogues = store.read("dialogues", columns=["dialogue_id", "n_utterances", "status"])
    calls = store.read("calls")
    if dialogues is None or calls is None:
        return None
    rows = dialogues.filter(pc.equal(dialogues.column("status"), "ok")).to_pylist()
    by_id = {s.dialogue_id: s for s in specs}
    rows = [r for r in rows if r["dialogue_id"] in by_id]
    if not rows:
        return None
    landed = calls.filter(pc.is_in(calls.column("outcome"), pa.array(_LANDED))).to_pylist()
    actual: dict[str, _Observed] = {r["dialogue_id"]: _Observed() for r in rows}
    for row in landed:
        if row.get("dialogue_id") in actual:
            actual[row["dialogue_id"]].add(_as_call(row))
    replies = [t for o in actual.values() for t in o.free_text]
    mean_reply = sum(replies) / len(replies) if replies else float(config.dialogue.max_tokens)
    mean_utt = sum(r["n_utterances"] for r in rows) / len(rows)
    step = max(1, len(rows) // CALIBRATION_DIALOGUES)
    measured, simulated = _Observed(), _Observed()
    caller = scripted_caller(config, mean_reply)
    for r in rows[::step][:CALIBRATION_DIALOGUES]:
        seen = actual[r["dialogue_id"]]
        measured.prompt += seen.prompt
        measured.structured += seen.structured
        exchanges = max(1, r["n_utterances"] // 2)
        for c in await _simulate(by_id[r["dialogue_id"]], config, caller, exchanges):
            simulated.add(c)
    prompt_scale = measured.prompt / simulated.prompt if simulated.prompt else 1.0
    structured_scale = (
        measured.structured / simulated.structured if simulated.structured and measured.structured
        else 1.0
    )
    return Calibration(
        mean_utt, mean_reply, prompt_scale, structured_scale, len(rows),
        f"calibrated on {len(rows)} finished dialogue(s): {mean_utt:.1f} utterances, "
        f"{mean_reply:.1f} tokens per reply, token-count ratios {prompt_scale:.2f} (prompts) "
        f"and {structured_scale:.2f} (structured replies)",
    )


_HEADER = (f"{'':<28}{'dialogues':>10}{'calls':>10}{'prompt tok':>14}{'compl. tok':>12}"
           f"{'cost':>12}")


def _line(e: Estimate) -> str:
    return (f"{e.label:<28}{e.dialogues or '':>10}{e.calls:>10,.0f}{e.prompt_tokens:>14,.0f}"
            f"{e.completion_tokens:>12,.0f}{e.cost:>12.4f}")


def format_estimates(dry: DryRun) -> str:
    """The estimate as a table for the terminal: by pairing with the total, then by condition
    and harness level when the run has more than one of them."""
    cal = dry.calibration or Calibration(None, None)
    if dry.simulated == dry.planned:
        how = f"all {dry.planned} planned dialogues simulated"
    else:
        how = (f"{dry.simulated} of {dry.planned} planned dialogues simulated (up to "
               f"{SAMPLE_PER_GROUP} per pairing, condition and harness level, each scaled up to "
               "its group)")
    lines = [f"Dry run ({cal.source}).",
             f"{how[0].upper()}{how[1:]} with scripted backends (the estimate itself sends and "
             "writes nothing).",
             "pairing" + _HEADER[7:]]
    lines += [_line(e) for e in dry.pairings]
    if dry.personas.calls:
        lines.append(_line(dry.personas))
    lines.append(_line(dry.total))
    lines.append("calls by role: " + ", ".join(
        f"{role} {n:,.0f}" for role, n in sorted(dry.roles.items(), key=lambda kv: -kv[1])))
    if len(dry.levels) > 1:
        lines += ["", "condition, level" + _HEADER[16:]]
        lines += [_line(e) for e in dry.levels]
    return "\n".join(lines)
