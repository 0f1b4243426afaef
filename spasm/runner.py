"""One planned dialogue of a run: its agents, chain and session chosen, the dialogue run,
its rows built (the run layer around :func:`spasm.simulation.simulate_dialogue`, and around
:func:`spasm.simulation.simulate_group` for a :class:`GroupSpec`).

:func:`build_agents` is the one place that chooses a plain or a harnessed agent for a level
(through :func:`spasm.harness.factory.harness_agents`); the dialogue is handed the agents, the
termination chain and the session, and never sees the config, the plan or the harness.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from spasm.acting import Reward, belt_for, gold_world, reward, tool_rows
from spasm.agents import (
    PlainAgent,
    TurnAgent,
    client_system_prompt,
    group_client_system_prompt,
    group_responder_system_prompt,
    responder_system_prompt,
)
from spasm.bugs import report_bug
from spasm.calls import Caller
from spasm.config import PairingConfig, ParticipantConfig, RunConfig
from spasm.dataset.rows import (
    ActionDialogueRow,
    CallRow,
    DialogueRow,
    ErrorRow,
    EventRow,
    ParticipantRow,
    ScenarioDialogueRow,
    TurnRow,
    WorldRow,
    with_trial_column,
)
from spasm.errors import BudgetExceededError, RunError
from spasm.goals import GOAL_REACHED, GoalDetector, GoalVerdict, judge_goal
from spasm.harness.factory import harness_agents, harness_hooks
from spasm.harness.levels import level_label
from spasm.harness.profile import Presence
from spasm.people import has_people, record_people
from spasm.personas.persona import Persona
from spasm.projection import Viewer, group_viewer
from spasm.scenarios import Scenario, client_card, responder_context
from spasm.session import DialogueSession
from spasm.simulation import Conversation, simulate_dialogue, simulate_group
from spasm.termination import DetectorSetup, TerminationChain, make_detector
from spasm.turn_order import Seat, TurnOrderSetup, make_next_speaker

__all__ = [
    "DialogueResult", "DialogueSpec", "GroupSeat", "GroupSpec", "PlannedDialogue", "build_agents",
    "build_chain", "run_dialogue",
]


@dataclass(frozen=True, kw_only=True)
class PlannedDialogue(ABC):
    """What every planned dialogue has, two-party (:class:`DialogueSpec`) or group
    (:class:`GroupSpec`), and what its rows name: the persona id, the pairing label and the
    client and responder backends of the ``dialogues`` and ``errors`` rows."""

    dialogue_id: str
    conversation_index: int
    condition: str
    seed: int
    #: The scenario of a run with scenarios (its situation and goal go on the Client's card).
    scenario: Scenario | None = None
    #: The trial (0..K-1) of a run with ``trials: K``; ``None`` in a run without trials.
    trial: int | None = None

    @property
    @abstractmethod
    def levels(self) -> tuple[str, ...]:
        """Harness level (A–E, docs/harness.md) of each speaker, in turn order."""

    @property
    @abstractmethod
    def persona_id(self) -> str:
        """The ``persona_id`` of the dialogue's rows."""

    @property
    @abstractmethod
    def client_backend(self) -> str:
        """The ``client_backend`` of the dialogue's row, and the backend its termination and
        goal judges default to."""

    @property
    @abstractmethod
    def responder_backend(self) -> str:
        """The ``responder_backend`` of the dialogue's row."""

    @property
    def pairing_label(self) -> str:
        """The ``pairing`` column of the dialogue's rows: ``client_backend/responder_backend``
        (a person's seat relabels it: :func:`spasm.people.pairing_label`)."""
        return PairingConfig.label_of(self.client_backend, self.responder_backend)


@dataclass(frozen=True, kw_only=True)
class DialogueSpec(PlannedDialogue):
    """A planned two-party dialogue: its persona (the Client's) and its pairing."""

    persona: Persona
    pairing: PairingConfig
    #: Harness level (A–E, docs/harness.md) of the Client and of the Responder.
    levels: tuple[str, ...] = ("A", "A")

    @property
    def persona_id(self) -> str:
        return self.persona.id

    @property
    def client_backend(self) -> str:
        return self.pairing.client

    @property
    def responder_backend(self) -> str:
        return self.pairing.responder


@dataclass(frozen=True)
class GroupSeat:
    """One seat of a planned group dialogue: its participant and, for a client seat, the
    persona that fills it."""

    participant: ParticipantConfig
    persona: Persona | None = None


@dataclass(frozen=True, kw_only=True)
class GroupSpec(PlannedDialogue):
    """A planned group dialogue: its seats, in turn order, each client seat with its persona.
    It has no pairing and no single persona; what the ``dialogues`` row names for one (its
    ``persona_id``, ``pairing``, ``client_backend``, ``responder_backend``) is the first client
    seat's and the first responder seat's (:attr:`first_client`, :attr:`first_responder`)."""

    seats: tuple[GroupSeat, ...]

    @property
    def levels(self) -> tuple[str, ...]:
        """Each seat's level (``participants[].level``), in turn order: what the harness and
        the dialogues row's ``harness_level`` read."""
        return tuple(s.participant.level for s in self.seats)

    @property
    def first_client(self) -> GroupSeat:
        """The first client seat (a group has one at least: ``RunConfig._check_group``)."""
        return next(s for s in self.seats if s.participant.role == "client")

    @property
    def first_responder(self) -> GroupSeat:
        """The first responder seat (a group has one at least)."""
        return next(s for s in self.seats if s.participant.role == "responder")

    @property
    def persona_id(self) -> str:
        """The first client seat's persona's id."""
        persona = self.first_client.persona
        assert persona is not None, "a client seat is filled by a persona (runplan.plan_groups)"
        return persona.id

    @property
    def client_backend(self) -> str:
        """The first client seat's backend."""
        return self.first_client.participant.backend

    @property
    def responder_backend(self) -> str:
        """The first responder seat's backend."""
        return self.first_responder.participant.backend


@dataclass
class DialogueResult:
    """Rows for each table produced by one dialogue."""

    spec: PlannedDialogue
    dialogue: DialogueRow | None = None
    turns: list[TurnRow] = field(default_factory=list)
    calls: list[CallRow] = field(default_factory=list)
    error: ErrorRow | None = None
    #: A group dialogue's participants (the ``participants`` table).
    participants: list[ParticipantRow] = field(default_factory=list)
    #: A run with tools: the dialogue's events and its world's states.
    events: list[EventRow] = field(default_factory=list)
    worlds: list[WorldRow] = field(default_factory=list)


def build_agents(spec: DialogueSpec, config: RunConfig) -> tuple[TurnAgent, TurnAgent]:
    """The Client and the Responder of a dialogue, each with its own frame, each plain or
    harnessed by its level in ``spec.levels`` (the one place that chooses)."""
    d = config.dialogue
    # A scenario's situation and goal go on the Client's card, its context to the Responder.
    card = client_card(spec.persona.card, spec.scenario)
    instructions = responder_context(d.responder_instructions, spec.scenario)
    language = spec.persona.language  # English or none: no language line
    plain = (
        PlainAgent(
            speaker="client",
            backend=spec.pairing.client,
            viewer=Viewer("client", client_system_prompt(card, d.responder_role, language),
                          responder_role=d.responder_role),
            temperature=config.backends[spec.pairing.client].temperatures.client,
            max_tokens=d.max_tokens, tool_mode=tool_mode(config, spec.pairing.client),
        ),
        PlainAgent(
            speaker="responder",
            backend=spec.pairing.responder,
            viewer=Viewer(
                "responder", responder_system_prompt(d.responder_role, instructions, language),
                responder_role=d.responder_role,
            ),
            temperature=config.backends[spec.pairing.responder].temperatures.responder,
            max_tokens=d.max_tokens, tool_mode=tool_mode(config, spec.pairing.responder),
        ),
    )
    # The Responder is handed no persona: it never sees who the Client is.
    client, responder = harness_agents(plain, spec.levels, config, (spec.persona, None))
    return client, responder


#: Backend kinds whose tool steps are prompted under ``tool_mode: auto`` (no native tools).
PROMPTED_KINDS = frozenset({"embedded"})


def tool_mode(config: RunConfig, backend: str) -> Literal["native", "prompted"]:
    """How ``backend`` is asked for a tool step (``backends.*.tool_mode``; ``auto``: prompted
    for the embedded model, native otherwise)."""
    cfg = config.backends[backend]
    if cfg.tool_mode == "auto":
        return "prompted" if cfg.kind in PROMPTED_KINDS else "native"
    return cfg.tool_mode


def build_chain(
    config: RunConfig, caller: Caller, spec: PlannedDialogue,
    participants: tuple[str, ...] | None = None,
) -> TerminationChain:
    """The termination chain configured for the run: the rules, the judge, then the detectors
    ``termination.detectors`` names (registered ones: :func:`spasm.termination.register_detector`)."""
    t = config.termination
    names = [*(["rules"] if t.rules else []), *(["judge"] if t.judge else []), *t.detectors]
    judge_backend = t.judge_backend or spec.client_backend
    setup = DetectorSetup(caller, judge_backend, config.backends[judge_backend].temperatures.judge,
                          spec.seed, t.window, participants)
    return TerminationChain([make_detector(n, setup) for n in names], t.min_utterances)


def goal_detector(spec: PlannedDialogue, config: RunConfig, caller: Caller) -> GoalDetector | None:
    """The goal judge as a termination detector (``scenarios_judge.termination``), or ``None``."""
    sj = config.scenarios_judge
    if spec.scenario is None or not sj.enabled or not sj.termination:
        return None
    return GoalDetector(caller, sj.backend or spec.client_backend, spec.scenario.goal,
                        spec.scenario.expected_outcome, temperature=sj.temperature,
                        max_tokens=sj.max_tokens, seed=spec.seed, seats=judge_seats(spec))


def judge_seats(spec: PlannedDialogue) -> tuple[tuple[str, str], ...] | None:
    """A group dialogue's ``(participant id, role)`` seats, for the goal judge's transcript
    (``None`` for a two-party dialogue: its judge reads the Client and the Responder)."""
    if not isinstance(spec, GroupSpec):
        return None
    return tuple((s.participant.id, s.participant.role) for s in spec.seats)


async def goal_verdict(
    spec: PlannedDialogue, config: RunConfig, caller: Caller, convo: Conversation,
    session: DialogueSession, detector: GoalDetector | None,
) -> GoalVerdict | None:
    """The goal judge's decision after the dialogue (run-layer code, not in the dialogue loop):
    the detector's verdict when it ended the dialogue, else one ``goal_judge`` call."""
    sj = config.scenarios_judge
    if spec.scenario is None or not sj.enabled:
        return None
    if detector is not None and detector.reached is not None and convo.reason == GOAL_REACHED:
        return detector.reached
    return await judge_goal(
        caller, sj.backend or spec.client_backend, convo.history, spec.scenario.goal,
        spec.scenario.expected_outcome, session.scope, temperature=sj.temperature,
        max_tokens=sj.max_tokens, seed=spec.seed, seats=judge_seats(spec),
    )


async def settle(
    spec: PlannedDialogue, config: RunConfig, caller: Caller, convo: Conversation,
    session: DialogueSession, detector: GoalDetector | None,
) -> tuple[DialogueResult, GoalVerdict | None]:
    """What a finished dialogue (two-party or group) leaves: its calls, then either the error
    row that quarantines it — the dialogue failed, or the goal judge's backend failed its
    retries — or its turns and the goal verdict (:func:`goal_verdict`; ``None`` without
    scenarios). The caller adds the dialogue row when there is no error."""
    result = DialogueResult(spec, calls=session.scope.records)
    if convo.error is not None:
        result.error = _error_row(spec, convo, convo.error)
        return result, None
    try:
        verdict = await goal_verdict(spec, config, caller, convo, session, detector)
    except BudgetExceededError:
        raise
    except RunError as exc:
        result.error = _error_row(spec, convo, exc)
        return result, None
    result.turns = convo.turns
    return result, verdict


def with_goal(row: DialogueRow, spec: PlannedDialogue, verdict: GoalVerdict | None,
              acted: Reward | None = None) -> DialogueRow:
    """The dialogue's row with its scenario and the goal judge's verdict (a run with
    scenarios) and its reward (a run with tools: ``acted``), then its trial (a run with
    trials), else the row as it is."""
    if spec.scenario is not None or acted is not None:
        goal = {"scenario_id": spec.scenario.id if spec.scenario is not None else None,
                "goal_met": None if verdict is None else verdict.goal_met,
                "goal_reason": None if verdict is None else verdict.reason}
        if acted is None:
            row = ScenarioDialogueRow(**row.as_record(), **goal)
        else:
            row = ActionDialogueRow(**row.as_record(), **goal, reward=acted.reward,
                                    world_match=acted.world_match, reward_detail=acted.detail)
    if spec.trial is not None:
        fields: dict[str, Any] = {**row.as_record(), "trial": spec.trial}
        row = with_trial_column(type(row))(**fields)
    return row


def open_session(spec: PlannedDialogue, config: RunConfig, caller: Caller) -> DialogueSession:
    """The session of one planned dialogue (the cache estimate only in harness runs)."""
    return DialogueSession.open(
        caller, spec.dialogue_id, spec.persona_id, spec.condition, spec.seed,
        estimate_cache=config.harness.active or any(lv != "A" for lv in spec.levels),
        scenario_id=spec.scenario.id if spec.scenario is not None else None,
        belt=belt_for(config, spec.scenario),
    )


async def acted(spec: PlannedDialogue, session: DialogueSession, convo: Conversation,
                result: DialogueResult, verdict: GoalVerdict | None,
                responders: Sequence[str]) -> Reward | None:
    """A run with tools: the dialogue's events and worlds rows into ``result``, and its reward
    (``None`` in a run without tools)."""
    belt = session.belt
    if belt is None:
        return None
    gold = await gold_world(belt.tools, spec.scenario) if spec.scenario is not None else None
    result.events, result.worlds = tool_rows(spec.dialogue_id, convo.history, belt, gold)
    return reward(spec.scenario, convo.history, belt, gold,
                  None if verdict is None else verdict.goal_met, responders)


async def run_dialogue(spec: PlannedDialogue, config: RunConfig, caller: Caller) -> DialogueResult:
    """Run one planned dialogue to its end; a failure is returned as an error row, never
    raised (except a budget stop, which ends the whole run)."""
    if isinstance(spec, GroupSpec):
        return await run_group(spec, config, caller)
    if not isinstance(spec, DialogueSpec):
        raise TypeError(f"run_dialogue runs a DialogueSpec or a GroupSpec, not {type(spec).__name__}")
    session = open_session(spec, config, caller)
    agents = build_agents(spec, config)
    chain = build_chain(config, caller, spec)
    goal = goal_detector(spec, config, caller)
    if goal is not None:
        chain.detectors.append(goal)
    convo = await simulate_dialogue(
        spec.dialogue_id, agents, chain, session,
        max_turns_per_agent=config.dialogue.max_turns_per_agent,
        hooks=harness_hooks(config, {"client": spec.persona}),
    )
    result, verdict = await settle(spec, config, caller, convo, session, goal)
    if result.error is None:
        rewarded = await acted(spec, session, convo, result, verdict, ("responder",))
        result.dialogue = with_goal(
            _dialogue_row(spec, config, agents, convo, session.scope.records), spec, verdict,
            rewarded)
    if has_people(config):  # a person in a seat: the seats' kinds, the typing (1.10)
        await record_people(result, config, caller, spec.dialogue_id,
                            (spec.client_backend, spec.responder_backend),
                            {"client": spec.client_backend, "responder": spec.responder_backend},
                            spec.scenario.goal if spec.scenario is not None else None)
    return result


def _error_row(spec: PlannedDialogue, convo: Conversation, exc: BaseException) -> ErrorRow:
    if convo.traceback is not None:
        report_bug(spec.dialogue_id, exc, convo.traceback)
    return ErrorRow(
        dialogue_id=spec.dialogue_id,
        persona_id=spec.persona_id,
        condition=spec.condition,
        pairing=spec.pairing_label,
        error_type=type(exc).__name__,
        error=str(exc),
        n_utterances=len(convo.history),
        partial_transcript=json.dumps([[u.speaker, u.content] for u in convo.history]),
        failed_at=datetime.now(UTC),
        traceback=convo.traceback,
    )


def _dialogue_row(
    spec: PlannedDialogue, config: RunConfig, agents: tuple[TurnAgent, TurnAgent],
    convo: Conversation, records: list[CallRow],
) -> DialogueRow:
    backends = config.backends
    client, responder = agents
    return DialogueRow(
        dialogue_id=spec.dialogue_id,
        persona_id=spec.persona_id,
        conversation_index=spec.conversation_index,
        condition=spec.condition,
        harness_level=level_label(*spec.levels),
        pairing=spec.pairing_label,
        client_backend=spec.client_backend,
        client_model=backends[spec.client_backend].model,
        responder_backend=spec.responder_backend,
        responder_model=backends[spec.responder_backend].model,
        seed=spec.seed,
        responder_role=config.dialogue.responder_role,
        client_system_prompt=client.system_prompt,
        responder_system_prompt=responder.system_prompt,
        n_utterances=len(convo.history),
        termination_reason=convo.reason,
        termination_detail=convo.detail,
        prompt_tokens=sum(r.prompt_tokens for r in records),
        completion_tokens=sum(r.completion_tokens for r in records),
        n_calls=len(records),
        harness_fallbacks=sum(t.harness_fallbacks for t in convo.turns),
        status="ok",
    )


# -- group dialogues ------------------------------------------------------------------------
def role_label(participant: ParticipantConfig, config: RunConfig) -> str:
    """A seat's helping role as its frames name it: the participant's ``responder_role``, else
    ``dialogue.responder_role`` (``participants.responder_role`` of a responder seat)."""
    return participant.responder_role or config.dialogue.responder_role


def group_role(spec: GroupSpec, config: RunConfig) -> str:
    """The group's helping role (the first responder seat's): ``dialogues.responder_role``."""
    return role_label(spec.first_responder.participant, config)


def group_agents(spec: GroupSpec, config: RunConfig) -> list[PlainAgent]:
    """Every participant of a group dialogue, each with its own frame: who else is present,
    its persona card (client seats) or role (responder seats), and its projection of the
    history naming each speaker (level A)."""
    d = config.dialogue
    ids = tuple(s.participant.id for s in spec.seats)
    present = [(s.participant.id, s.participant.role, role_label(s.participant, config))
               for s in spec.seats]
    out = []
    for seat in spec.seats:
        p = seat.participant
        temps = config.backends[p.backend].temperatures
        if p.role == "client":
            assert seat.persona is not None
            card = client_card(seat.persona.card, spec.scenario)  # + situation and goal
            prompt = group_client_system_prompt(card, p.id, present, p.instructions)
            temperature = temps.client
        else:
            instructions = responder_context(p.instructions or d.responder_instructions,
                                             spec.scenario)  # + the scenario's context
            prompt = group_responder_system_prompt(role_label(p, config), p.id, present,
                                                   instructions)
            temperature = temps.responder
        viewer = group_viewer(p.id, prompt, ids, responder_role=group_role(spec, config),
                              speaker_names=seat_speaker_names(config, p))
        out.append(PlainAgent(speaker=p.id, backend=p.backend, viewer=viewer,
                              temperature=temperature, max_tokens=d.max_tokens,
                              tool_mode=tool_mode(config, p.backend)))
    return out


def group_presences(spec: GroupSpec, config: RunConfig) -> list[Presence]:
    """Each seat's view of its group, for its harness (its level's layers and the audit)."""
    seats = tuple((s.participant.id, s.participant.role, role_label(s.participant, config))
                  for s in spec.seats)
    helping = group_role(spec, config)
    return [
        Presence(role=p.role, seats=seats,
                 responder_role=role_label(p, config) if p.role == "responder" else helping,
                 instructions=p.instructions, max_utterances=config.group.max_utterances)
        for p in (s.participant for s in spec.seats)
    ]


#: Backend kinds whose chat template drops the ``name`` field of a message: their seats always
#: see other speakers' names as a "Name: " prefix (the embedded SmolLM2's template renders
#: only role and content, so a name field would leave every other speaker anonymous).
NAMELESS_KINDS = frozenset({"embedded"})


def seat_speaker_names(config: RunConfig, seat: ParticipantConfig) -> Literal["prefix", "name_field"]:
    """How this seat's ECP frame names other speakers (recorded per seat in the participants
    table): ``group.speaker_names``, except ``prefix`` on backends that drop the name field."""
    if config.backends[seat.backend].kind in NAMELESS_KINDS:
        return "prefix"
    return config.group.speaker_names


def group_order_setup(spec: GroupSpec, config: RunConfig) -> TurnOrderSetup:
    """The turn order's view of a group dialogue: its seats, and the moderator's backend."""
    g = config.group
    moderator = g.moderator_backend or spec.responder_backend
    return TurnOrderSetup(
        seats=tuple(Seat(s.participant.id, s.participant.role) for s in spec.seats),
        allow_repeat=g.allow_repeat, moderator_backend=moderator,
        moderator_temperature=config.backends[moderator].temperatures.judge,
    )


async def run_group(spec: GroupSpec, config: RunConfig, caller: Caller) -> DialogueResult:
    """Run one planned group dialogue: ``group.opener`` (default: the first participant)
    speaks first, ``group.next_speaker`` picks each next speaker, the chain (its rules over all
    participants) or ``group.max_utterances`` ends it."""
    session = open_session(spec, config, caller)
    agents = harness_agents(group_agents(spec, config), spec.levels, config,
                            [s.persona for s in spec.seats], group_presences(spec, config))
    setup = group_order_setup(spec, config)
    order = make_next_speaker(config.group.next_speaker, setup)
    chain = build_chain(config, caller, spec, participants=tuple(s.id for s in setup.seats))
    goal = goal_detector(spec, config, caller)
    if goal is not None:
        chain.detectors.append(goal)
    convo = await simulate_group(
        spec.dialogue_id, agents, setup.seats, order, chain, session,
        opener=config.group.opener or setup.seats[0].id,
        max_utterances=config.group.max_utterances,
        hooks=harness_hooks(config, {s.participant.id: s.persona for s in spec.seats
                                     if s.persona is not None}),
    )
    # A run with scenarios: one goal_judge call over the whole group transcript.
    result, verdict = await settle(spec, config, caller, convo, session, goal)
    if result.error is None:
        rewarded = await acted(spec, session, convo, result, verdict,
                               [s.participant.id for s in spec.seats
                                if s.participant.role == "responder"])
        _group_rows(result, spec, config, agents, convo, session, verdict, rewarded)
    if has_people(config):  # a person in a seat: the seats' kinds, the typing (1.10)
        await record_people(result, config, caller, spec.dialogue_id,
                            (spec.client_backend, spec.responder_backend),
                            {s.participant.id: s.participant.backend for s in spec.seats},
                            spec.scenario.goal if spec.scenario is not None else None)
    return result


def _group_rows(result: DialogueResult, spec: GroupSpec, config: RunConfig,
                agents: list[TurnAgent], convo: Conversation, session: DialogueSession,
                verdict: GoalVerdict | None, rewarded: Reward | None = None) -> None:
    """A finished group dialogue's dialogues row and participants rows (and its reward, a run
    with tools: ``rewarded``)."""
    client = next(a for a, s in zip(agents, spec.seats, strict=True) if s.participant.role == "client")
    helper = next(a for a, s in zip(agents, spec.seats, strict=True)
                  if s.participant.role == "responder")
    row = _dialogue_row(spec, config, (client, helper), convo, session.scope.records)
    result.dialogue = with_goal(
        DialogueRow(**{**row.as_record(), "responder_role": group_role(spec, config)}), spec,
        verdict, rewarded)
    result.participants = [
        ParticipantRow(
            dialogue_id=spec.dialogue_id, position=i, participant_id=s.participant.id,
            role=s.participant.role,
            persona_id=s.persona.id if s.persona is not None else None,
            backend=s.participant.backend, model=config.backends[s.participant.backend].model,
            level=s.participant.level,
            responder_role=role_label(s.participant, config) if s.participant.role == "responder"
            else None,
            speaker_names=seat_speaker_names(config, s.participant),
            system_prompt=agent.system_prompt,
        )
        for i, (s, agent) in enumerate(zip(spec.seats, agents, strict=True))
    ]
