"""The plan of a run: every dialogue it holds, in a stable order, the backends it uses, and
its shards (``spasm generate --shard I/N``).

Kept apart from the engine so that the dry run, shards and merge reason about the same plan.

A shard is one of N parts of the plan, split by persona: shard I runs every dialogue of the
personas whose ``persona_index % N == I`` — all their conversations, conditions, pairings and
harness levels — with exactly the seeds and dialogue ids of the unsharded run (both depend on
the persona and the conversation only). The split is round-robin over the persona index, so
the shards differ by at most one persona, and it needs nothing but the index: any scheduler
(a SLURM array, a Kubernetes job index) can run the shards in any order, on any machine.
Every shard draws the whole persona set with the run's seed and records ``shard`` (index,
count and a digest of the whole persona set) in its manifest, so a merge can tell shards of
one run from shards that drew different personas, and a shard directory cannot be resumed
as another shard or as an unsharded run (:mod:`spasm.executors.shards` sizes shards for an
executor).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spasm.backends import Backend, make_backend
from spasm.config import RunConfig
from spasm.dataset.persona_rows import persona_record
from spasm.errors import ConfigError, RunError, UserError
from spasm.personas.persona import Persona
from spasm.runner import DialogueSpec, GroupSeat, GroupSpec, PlannedDialogue
from spasm.scenarios import Scenario, own_scenario, persona_scenarios, run_scenarios
from spasm.seeds import derive_seed

__all__ = [
    "Shard",
    "dialogue_id",
    "id_part",
    "legacy_dialogue_id",
    "make_backends",
    "personas_digest",
    "plan",
    "resume_check",
]


def id_part(name: str) -> str:
    """A backend or condition name as it stands in a dialogue id: ``-`` (the separator) and
    ``%`` (the escape) percent-encoded, so ids are unique by construction
    (``gpt``/``4o-mini`` and ``gpt-4o``/``mini`` give two ids). A name without either character
    is unchanged (``test_ids_of_plain_names_are_byte_identical_to_earlier_versions``)."""
    return name.replace("%", "%25").replace("-", "%2D")


def dialogue_id(persona_id: str, k: int, client: str, responder: str, condition: str,
                level: str | None = None, scenario: str | None = None) -> str:
    """The id of one planned dialogue: ``<persona>-k<k>-<client>-<responder>-<condition>``,
    then ``-<level>`` in a harness sweep; in a run with scenarios ``-s<scenario>`` follows
    ``k<k>``. Every part after the persona id is free of ``-`` (:func:`id_part`; a level is one
    letter), so reading from the right recovers each part: different dialogues of a run never
    share an id, whatever their names (tests/test_hardening_ids.py). Without scenarios there
    is no ``-s`` part, so the ids of such runs never change (tests/test_golden_run.py)."""
    sid = "" if scenario is None else f"-s{id_part(scenario)}"
    did = f"{persona_id}-k{k}{sid}-{id_part(client)}-{id_part(responder)}-{id_part(condition)}"
    return did if level is None else f"{did}-{level}"


def legacy_dialogue_id(persona_id: str, k: int, client: str, responder: str, condition: str,
                       level: str | None = None, scenario: str | None = None) -> str:
    """The id an older spasm gave the same dialogue (names joined unescaped), to recognise a
    run with unescaped ids (a run with scenarios always has escaped ones)."""
    if scenario is not None:
        return dialogue_id(persona_id, k, client, responder, condition, level, scenario)
    did = f"{persona_id}-k{k}-{client}-{responder}-{condition}"
    return did if level is None else f"{did}-{level}"


def plan(
    config: RunConfig, personas: list[Persona], shard: Shard | None = None,
    *, ids: Callable[..., str] = dialogue_id,
) -> Iterator[PlannedDialogue]:
    """Every dialogue of the run, in a stable order (a group run's: :func:`plan_groups`). The
    seed depends on the persona and the conversation index only, so every pairing, condition
    and harness level of a conversation shares it. A harness sweep (``harness.levels``) adds
    one dialogue per level, with the level at the end of its id; without a sweep ids are
    unchanged and both agents take their configured level.

    Two planned dialogues with one id would store one and lose the other: that is a bug (or a
    personas table with a repeated persona id), and a :class:`~spasm.errors.RunError` stops the
    plan before any dialogue is run. ``ids`` builds the ids (:func:`legacy_dialogue_id` to list
    an older version's; no check then)."""
    if config.participants is not None:
        yield from plan_groups(config, personas, shard)
        return
    h = config.harness
    sweep: list[tuple[str | None, tuple[str, str]]] = (
        [(level, (level, level)) for level in h.levels] if h.levels else
        [(None, (h.client, h.responder))]
    )
    seen: set[str] | None = set() if ids is dialogue_id else None
    scenarios = run_scenarios(config)
    chosen_personas = only_ids(config, personas)
    for persona in shard.select(chosen_personas) if shard is not None else chosen_personas:
        # A run with scenarios crosses them with the personas (or runs the persona's own).
        chosen: list[Scenario | None] = (
            [None] if scenarios is None else list(persona_scenarios(persona, scenarios)))
        for scenario, k in ((s, k) for s in chosen for k in range(config.conversations_per_persona)):
            seed = (derive_seed(config.seed, persona.id, k) if scenario is None
                    else derive_seed(config.seed, persona.id, k, scenario.id))
            for pairing in config.pairing_list:
                for condition in config.conditions:
                    for level, levels in sweep:
                        extra = {} if scenario is None else {"scenario": scenario.id}
                        did = ids(persona.id, k, pairing.client,
                                  pairing.responder, condition, level, **extra)
                        if seen is not None:
                            if did in seen:
                                raise RunError(
                                    f"two planned dialogues share the id {did!r} (persona "
                                    f"{persona.id!r}, conversation {k}, pairing "
                                    f"{pairing.label}, condition {condition}): one would be lost. "
                                    "Nothing was run. This is a bug in spasm, or the run's "
                                    "personas table repeats a persona id; please report it."
                                )
                            seen.add(did)
                        for trial, trial_seed, tid in trials_of(config, did, seed):
                            yield DialogueSpec(
                                dialogue_id=tid, persona=persona, conversation_index=k,
                                condition=condition, pairing=pairing, seed=trial_seed,
                                levels=levels, scenario=scenario, trial=trial)



def trials_of(config: RunConfig, did: str, seed: int) -> list[tuple[int | None, int, str]]:
    """``(trial, seed, dialogue id)`` of each trial of one planned dialogue: the dialogue itself
    (trial ``None``) in a run without trials, so its ids and seeds are those of a plain
    plan (``test_a_run_without_trials_plans_the_same_ids_and_seeds_as_before``); with
    ``trials: K`` (``--trials K``), trials 0..K-1, each with its own seed derived
    from the dialogue's (``derive_seed(seed, "trial", t)``: every condition, pairing and level
    of a trial shares it, so conditions stay paired trial by trial) and ``-t<trial>`` at the
    end of its id (after the level: every id of a trial run ends so, so ids stay unique)."""
    if config.trials <= 1:
        return [(None, seed, did)]
    return [(t, derive_seed(seed, "trial", t), f"{did}-t{t}") for t in range(config.trials)]


def group_dialogue_id(index: int, condition: str, scenario: str | None = None) -> str:
    """A group dialogue's id: ``g<index>-<condition>``; in a run with scenarios
    ``g<index>-s<scenario>-<condition>`` (as :func:`dialogue_id` puts ``-s<scenario>`` after
    the conversation). Unique by construction: the index is the dialogue's place in the plan,
    the scenario and the condition escaped like every id part. Without scenarios there is no
    ``-s`` part."""
    sid = "" if scenario is None else f"-s{id_part(scenario)}"
    return f"g{index:04d}{sid}-{id_part(condition)}"


def only_ids(config: RunConfig, personas: list[Persona]) -> list[Persona]:
    """The personas the plan holds dialogues for: those ``personas.ids`` names (in the drawn
    order), else all; an id that was not drawn is a :class:`~spasm.errors.UserError`."""
    wanted = config.personas.ids
    if wanted is None:
        return personas
    drawn = {p.id for p in personas}
    missing = [i for i in wanted if i not in drawn]
    if missing and drawn != {"p"}:  # {"p"}: the engine's check of the ids, before any draw
        raise UserError(f"personas.ids names {', '.join(map(repr, missing))}, which the run did "
                        f"not draw (its personas: {', '.join(sorted(drawn)[:5])}"
                        f"{', ...' if len(drawn) > 5 else ''})")
    return [p for p in personas if p.id in set(wanted)]


def plan_groups(
    config: RunConfig, personas: list[Persona], shard: Shard | None = None
) -> Iterator[GroupSpec]:
    """Every group dialogue of the run, in a stable order: ``group.dialogues`` of them (default
    personas ÷ client seats), each in every condition with one seed, so conditions are paired.
    Each dialogue's client seats are filled by a seeded draw of distinct personas (never the
    same persona twice in one dialogue). A shard takes every N-th group dialogue (group ``g``
    belongs to shard ``g % N``): every shard draws the whole persona set, so the draws, seeds
    and ids are the unsharded run's.

    A run with scenarios crosses every group dialogue with every scenario: group ``g`` keeps
    its draw (the same people meet every scenario, paired across scenarios and conditions) and
    each scenario adds its id to the dialogue's seed, as :func:`plan` does; a shard holds
    every scenario of its groups. A persona's own ``scenario`` (1:1, personas from data) has
    no seat to take in a group run: a :class:`~spasm.errors.ConfigError` says so."""
    assert config.participants is not None
    seats = config.participants
    scenarios = run_scenarios(config)
    if scenarios is not None:
        own = next((p for p in personas if own_scenario(p) is not None), None)
        if own is not None:
            raise ConfigError(
                f"persona {own.id!r} names its own scenario "
                f"({own_scenario(own)!r}), but a group run crosses every group dialogue with "
                "every scenario (its seats are drawn from all personas): drop the personas' "
                "scenario column, or run those personas in a two-party run (pairings:), where "
                "a persona's scenario runs 1:1.")
    clients = sum(1 for s in seats if s.role == "client")
    if len(personas) < clients:
        raise UserError(f"a group dialogue has {clients} client seats but the run has "
                        f"{len(personas)} personas: raise personas.n to at least {clients}")
    n = config.group.dialogues or max(1, len(personas) // clients)
    for g in range(n):
        if shard is not None and g % shard.count != shard.index:
            continue
        seed = derive_seed(config.seed, "group", g)
        drawn = iter(random.Random(seed).sample(personas, clients))
        filled = tuple(GroupSeat(s, next(drawn) if s.role == "client" else None) for s in seats)
        for scenario in [None] if scenarios is None else scenarios:
            did_seed = seed if scenario is None else derive_seed(config.seed, "group", g,
                                                                 scenario.id)
            sid = None if scenario is None else scenario.id
            for condition in config.conditions:
                did = group_dialogue_id(g, condition, sid)
                for trial, trial_seed, tid in trials_of(config, did, did_seed):
                    yield GroupSpec(dialogue_id=tid, conversation_index=g, condition=condition,
                                    seed=trial_seed, scenario=scenario, trial=trial,
                                    seats=filled)


def make_backends(config: RunConfig) -> dict[str, Backend]:
    """Build every backend the config uses (:attr:`~spasm.config.RunConfig.used_backends`; a
    missing key env var fails here, before any I/O)."""
    return {name: make_backend(name, config.backends[name]) for name in config.used_backends}


# -- shards ---------------------------------------------------------------------------------
_SPEC = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` of ``count`` (0-based: ``0/3``, ``1/3``, ``2/3``)."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if self.count < 1 or not 0 <= self.index < self.count:
            raise UserError(
                f"shard {self.index}/{self.count} does not exist: write --shard I/N with "
                "0 <= I < N (a SLURM array --array=0-(N-1) gives I as $SLURM_ARRAY_TASK_ID)."
            )

    @classmethod
    def parse(cls, text: str) -> Shard:
        """Parse ``"I/N"`` (raises :class:`UserError` saying how to write it)."""
        match = _SPEC.match(text)
        if not match:
            raise UserError(f"--shard {text!r}: write it as I/N, e.g. --shard 0/3 for the first "
                            "of three shards.")
        return cls(int(match.group(1)), int(match.group(2)))

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    @property
    def dirname(self) -> str:
        """The directory name the Ray executor gives this shard (``1-of-3``)."""
        return f"{self.index}-of-{self.count}"

    def owns(self, persona: Persona) -> bool:
        """Whether the persona's dialogues belong to this shard."""
        return persona.index % self.count == self.index

    def select(self, personas: Sequence[Persona]) -> list[Persona]:
        """This shard's personas, in their order (already selected ones pass unchanged)."""
        return [p for p in personas if self.owns(p)]

    def record(self, personas: Sequence[Persona] | None = None) -> dict[str, Any]:
        """What the manifest records of the shard; with the whole persona set, its digest."""
        out: dict[str, Any] = {"spec": str(self), "index": self.index, "count": self.count}
        if personas is not None:
            out["personas"] = len(personas)
            out["personas_sha256"] = personas_digest(personas)
        return out


def personas_digest(personas: Sequence[Persona]) -> str:
    """sha256 of a persona set (every column of every persona's record, in index order)."""
    rows = sorted(personas, key=lambda p: p.index)
    blob = json.dumps([persona_record(p) for p in rows], sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()


def stored_shard(run_dir: Path) -> tuple[bool, dict[str, Any] | None]:
    """(whether ``run_dir`` has a readable manifest, the shard it records or ``None``)."""
    try:
        manifest = json.loads((Path(run_dir) / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False, None
    if not isinstance(manifest, dict):
        return False, None
    shard = manifest.get("shard")
    return True, shard if isinstance(shard, dict) else None


def resume_check(run_dir: Path, shard: Shard | None) -> dict[str, Any] | None:
    """Refuse to resume ``run_dir`` as another shard than it holds; returns its shard record
    (with the persona digest of the first pass) to carry on, or ``None``."""
    readable, old = stored_shard(run_dir)
    if not readable:
        return shard.record() if shard is not None else None
    held = old.get("spec") if old else None
    wanted = str(shard) if shard is not None else None
    if held == wanted:
        return old
    if held is None:
        raise UserError(
            f"{run_dir} holds an unsharded run, so it cannot be resumed as shard {wanted}. "
            "Give the shard its own --out, or drop --shard to resume the run."
        )
    if wanted is None:
        raise UserError(
            f"{run_dir} holds shard {held} of a sharded run; resume it with --shard {held}, "
            "merge the shards with `spasm merge`, or use another --out."
        )
    raise UserError(
        f"{run_dir} holds shard {held}, so it cannot be resumed as shard {wanted}. Give each "
        "shard its own --out (e.g. runs/<name>/shards/I-of-N)."
    )
