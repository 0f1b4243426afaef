"""One play session: a person takes a seat of a config's dialogue, the config's agents the rest.

:func:`play_config` turns a run config into the config of one played dialogue: the chosen seat
goes to a ``kind: human`` backend (level A: a person needs no harness), every other seat keeps
its backend and level, and whatever defaulted to the seat's backend (the termination judge, the
goal judge, the persona pipeline, the moderator, an audit) is pinned to that
model, so no judge or harness call ever reaches the person. The plan holds exactly one
dialogue: one persona (``personas.ids``), one condition, one scenario, one conversation; so a
play run is a complete run like any other (resume, eval, export, the viewer).

:func:`play` runs it through the :class:`~spasm.engine.Engine`: the same caller, cache, limits
and harness as ``spasm generate``.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from spasm.backends import Backend, ChatRequest, Completion
from spasm.backends.human import HumanBackend, Person
from spasm.config import RunConfig, parse_config
from spasm.engine import Engine
from spasm.errors import UserError
from spasm.personas.persona import Persona
from spasm.run_summary import RunSummary
from spasm.runplan import make_backends
from spasm.scenarios import run_scenarios
from spasm.tokens import count_tokens

__all__ = ["PlaySetup", "new_operator", "pick_persona", "play", "play_config", "seat_of"]

#: The human backend's name in a play config (a number is added if the config has one).
HUMAN = "human"


def new_operator() -> str:
    """A fresh pseudonym for the person (``op-`` and 6 hex digits): never a real name."""
    return f"op-{secrets.token_hex(3)}"


@dataclass(frozen=True)
class PlaySetup:
    """A config made into one played dialogue."""

    config: RunConfig
    #: The human backend's name, and the seat it takes (``client``, ``responder`` or a
    #: participant id).
    backend: str
    seat: str
    #: The backend the seat had (the judges and harness calls stay on it).
    replaced: str
    notes: tuple[str, ...] = ()


def seat_of(config: RunConfig, seat: str) -> str:
    """The seat ``--seat`` names: ``client`` or ``responder`` in a two-party config; in a
    group config a participant id (or ``client``/``responder``: the first seat of that role)."""
    if config.participants is None:
        if seat not in ("client", "responder"):
            raise UserError(f"--seat {seat!r}: a two-party config has the seats client and "
                            "responder")
        return seat
    ids = [p.id for p in config.participants]
    if seat in ids:
        return seat
    for p in config.participants:
        if p.role == seat:
            return p.id
    raise UserError(f"--seat {seat!r}: this group config's seats are {', '.join(ids)} "
                    "(or client / responder: the first seat of that role)")


def play_config(
    config: RunConfig, seat: str, *, persona_id: str | None, scenario: str | None = None,
    condition: str | None = None, operator: str, interface: str = "terminal",
) -> PlaySetup:
    """The config of one played dialogue (see the module's docstring); ``persona_id`` is the
    drawn persona a two-party client seat plays (``None`` in a group: the first group's draw)."""
    seat = seat_of(config, seat)
    data = config.model_dump(mode="json")
    name = HUMAN
    while name in config.backends:
        name = f"{name}_"
    data["backends"][name] = {"kind": "human", "operator": operator, "interface": interface}
    notes: list[str] = []
    if config.participants is None:
        pairing = config.pairing_list[0]
        if len(config.pairing_list) > 1:
            notes.append(f"the config has {len(config.pairing_list)} pairings; the first "
                         f"({pairing.label}) is played")
        replaced = pairing.client if seat == "client" else pairing.responder
        data["pairings"] = [{"client": name if seat == "client" else pairing.client,
                             "responder": name if seat == "responder" else pairing.responder}]
        h = data["harness"]
        if h.get("levels"):  # a sweep: the simulated seat takes its first level
            h["client"] = h["responder"] = h["levels"][0]
            h["levels"] = None
        h[seat] = "A"  # a person needs no harness
        data["personas"]["ids"] = [persona_id] if persona_id is not None else None
    else:
        group = data["group"]
        group["dialogues"] = 1
        for p in data["participants"]:
            if p["id"] == seat:
                replaced = p["backend"]
                p["backend"], p["level"] = name, "A"
        if group.get("moderator_backend") is None:
            group["moderator_backend"] = config.seat_backend("responder")
    # What defaults to the seat's backend stays on a model (never asks the person): the
    # config's helper backend from before the person took a seat.
    judges_default = config.helper_backend
    for section, key in (("termination", "judge_backend"), ("scenarios_judge", "backend"),
                         ("personas", "backend")):
        if data[section].get(key) is None:
            data[section][key] = judges_default
    if data["harness"].get("backend") is None and data["harness"].get("audit"):
        # An audit checks every seat with the seat's own backend unless told: not the person's.
        # (Otherwise the simulated seats' harness calls stay on their own backends.)
        data["harness"]["backend"] = replaced
        notes.append(f"harness.backend is {replaced} (the audit would otherwise ask the person)")
    for probe in ("recall_probe", "persona_probes"):
        if data["harness"].get(probe):
            data["harness"][probe] = False
            notes.append(f"harness.{probe} is off: its questions would go to the person")
    if condition is not None:
        data["conditions"] = [condition]
    elif len(config.conditions) > 1:
        data["conditions"] = config.conditions[:1]
        notes.append(f"condition {config.conditions[0]} (the config's first; --condition to choose)")
    data["conversations_per_persona"] = 1
    scenarios = run_scenarios(config)
    if scenarios:
        chosen = next((s for s in scenarios if s.id == scenario), None) if scenario else scenarios[0]
        if chosen is None:
            raise UserError(f"--scenario {scenario!r}: the config's scenarios are "
                            f"{', '.join(s.id for s in scenarios[:10])}")
        data["scenarios"] = [chosen.model_dump(mode="json", exclude_none=True)]
    elif scenario is not None:
        raise UserError(f"--scenario {scenario!r}: this config has no scenarios")
    return PlaySetup(parse_config(data, "the play config"), name, seat, replaced, tuple(notes))


def pick_persona(ids: list[str], wanted: str | None) -> str:
    """The persona id ``--persona`` names among ``ids`` (the run's, in order): an id, a unique
    start of one, or a 0-based index."""
    if not ids:
        raise UserError("the config draws no persona")
    if wanted is None:
        return ids[0]
    if wanted in ids:
        return wanted
    if wanted.isdigit() and int(wanted) < len(ids):
        return ids[int(wanted)]
    starts = [i for i in ids if i.startswith(wanted)]
    if len(starts) == 1:
        return starts[0]
    raise UserError(f"--persona {wanted!r} names {'several' if starts else 'no'} persona of the "
                    f"config; its personas: {', '.join(ids[:8])}{', ...' if len(ids) > 8 else ''}")


class PrefixBackend(Backend):
    """A simulated seat of a forked dialogue: its utterances before the fork are the original
    dialogue's (``prefix``: turn index -> text), later ones its model's (``inner``)."""

    def __init__(self, inner: Backend, speaker: str, prefix: Mapping[int, str]) -> None:
        self.inner, self.speaker, self.prefix = inner, speaker, dict(prefix)
        self.name, self.model = inner.name, inner.model
        self.max_concurrency, self.cacheable = inner.max_concurrency, inner.cacheable

    @property
    def identity(self) -> str:
        # Its own cache entries: a prefix turn's request is answered from the original.
        digest = hashlib.sha256(json.dumps(sorted(self.prefix.items())).encode()).hexdigest()[:12]
        return f"prefix-{digest}:{self.inner.identity}"

    async def complete(self, request: ChatRequest) -> Completion:
        ctx = request.context
        if (ctx is not None and ctx.speaker == self.speaker and ctx.turn_index in self.prefix
                and request.json_schema is None):
            text = self.prefix[ctx.turn_index]
            return Completion(text=text, prompt_tokens=0, completion_tokens=count_tokens(text),
                              resolved_model=f"{self.model} (the original's turn)")
        return await self.inner.complete(request)

    async def preflight(self) -> None:
        await self.inner.preflight()

    async def aclose(self) -> None:
        await self.inner.aclose()


def play_backends(setup: PlaySetup, person: Person,
                  prefix: Mapping[str, Mapping[int, str]] | None = None) -> dict[str, Backend]:
    """The run's backends, the human one answered by ``person``; with ``prefix`` (a fork: each
    simulated speaker's utterances before the fork), those seats replay them first."""
    backends = make_backends(setup.config)
    backends[setup.backend] = HumanBackend(setup.backend, setup.config.backends[setup.backend],
                                           person)
    for speaker, turns in (prefix or {}).items():
        if speaker == setup.seat or not turns:
            continue
        name = _seat_backend(setup.config, speaker)
        backends[name] = PrefixBackend(backends[name], speaker, turns)
    return backends


def _seat_backend(config: RunConfig, speaker: str) -> str:
    if config.participants is not None:
        return next(p.backend for p in config.participants if p.id == speaker)
    pairing = config.pairing_list[0]
    return pairing.client if speaker == "client" else pairing.responder


async def personas_of(config: RunConfig, out: Path) -> list[Persona]:
    """The personas a config draws (stored ones when ``out`` holds the run), without a model
    call: their ids are a function of the schema, seed and fields."""
    engine = Engine(config, out, progress=False)
    drawn = await engine._dry_personas()
    return drawn.accepted


async def play(setup: PlaySetup, person: Person, out: Path, *, overwrite: bool = False,
               prefix: Mapping[str, Mapping[int, str]] | None = None) -> RunSummary:
    """Run the played dialogue into ``out`` (resumed when ``out`` holds it unfinished); a fork
    replays ``prefix`` (each simulated speaker's original utterances before the fork)."""
    engine = Engine(setup.config, out, overwrite=overwrite, progress=False,
                    backends=play_backends(setup, person, prefix))
    return await engine.run()
