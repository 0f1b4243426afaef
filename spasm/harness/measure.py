"""Measurements of an agent, outside it: the audit after each turn, the recall probe after the
dialogue.

Neither changes what the agent does next. Each reads only the agent's public surface — its
speaker, backend and (harnessed) policy, the :class:`~spasm.agents.Turn` it returned, and the
prompt it would see for a next turn (:meth:`~spasm.agents.TurnAgent.next_prompt`) — and neither
feeds the cache estimate, which measures the design, not its measurements. The dialogue sees
neither: the audit is a wrapping agent (:class:`AuditedAgent`, itself a
:class:`~spasm.agents.TurnAgent`) and the probes a hook after the dialogue
(:class:`RecallProbes`), both chosen by :func:`spasm.harness.factory.harness_agents`.

* **Audit** (``harness.audit``, levels without verify-and-rewrite): the accepted reply is
  checked like a candidate (role ``audit``) and never rewritten, so the boundary-violation rate
  can be compared across levels. The verdict (``mode: audit``) goes to ``turns.checker_verdict``
  and its violations and advice into the control fields of the stored state.
* **Recall probes** (``harness.recall_probe``, at ``harness.probe_depths``): see
  :mod:`spasm.harness.probe`.
* **Persona probes** (``harness.persona_probes``): the Client is asked a few questions about
  itself, written in code from its persona fields (:data:`PERSONA_QUESTIONS`), for the Q&A
  consistency of ``spasm eval --consistency`` (:class:`PersonaProbes`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from spasm.agents import NextPrompt, Turn, TurnAgent
from spasm.backends.base import ChatRequest, Message
from spasm.dataset.columns import PersonaProbe, dump_probes, load_persona_probes, load_probes
from spasm.dataset.rows import TurnRow
from spasm.errors import BackendError
from spasm.harness.notes import HarnessNotes
from spasm.harness.probe import fact_words, probe_question, probe_targets, recall
from spasm.harness.profile import Presence, Profile, profile_of, resolve_policy
from spasm.harness.runtime import HarnessedAgent
from spasm.harness.verify import check_candidate, with_verdict
from spasm.history import History, Speaker
from spasm.seeds import derive_seed

if TYPE_CHECKING:
    from spasm.config import RunConfig
    from spasm.harness.policy import CharacterPolicy
    from spasm.harness.state import AgentState
    from spasm.personas.persona import Persona
    from spasm.session import DialogueSession

__all__ = [
    "PERSONA_QUESTIONS", "AuditResult", "AuditedAgent", "Auditor", "PersonaProbes", "RecallProbes",
    "persona_probes", "persona_questions", "recall_probes",
]


@dataclass(frozen=True)
class AuditResult:
    """What an audit adds to a turn's row."""

    verdict: dict[str, Any]
    #: 1 when the checker gave no usable answer (plus a policy fallback on the first audit).
    fallbacks: int
    #: The turn's state with the audit's violations and advice noted (``None`` without state).
    state: AgentState | None


class Auditor:
    """Checks one agent's accepted replies in one dialogue (role ``audit``, no rewrite)."""

    def __init__(
        self, agent: TurnAgent, config: RunConfig, persona: Persona | None,
        presence: Presence | None = None,
    ) -> None:
        self.agent = agent
        self.config = config
        self.persona = persona
        self.profile: Profile = profile_of(agent.speaker, agent.backend, config, persona, presence)
        self.policy: CharacterPolicy | None = None
        self._pending_fallbacks = 0

    async def setup(self, session: DialogueSession) -> None:
        """Take the agent's policy, or resolve it as the agent would (after ``agent.setup``)."""
        own = self.agent.policy if isinstance(self.agent, HarnessedAgent) else None
        if own is not None:
            self.policy = own
            return
        self.policy, self._pending_fallbacks = await resolve_policy(
            self.profile, self.persona, self.config, session
        )

    async def audit(self, turn: Turn, history: History, session: DialogueSession) -> AuditResult:
        """Check ``turn``, spoken after ``history``."""
        assert self.policy is not None, "Auditor.setup was not awaited"
        seed = derive_seed(session.turn_seed(len(history), turn.speaker), "audit")
        state = _notes(turn).state
        verdict = await check_candidate(
            self.profile, self.policy, state, history, turn.text, session,
            self.config.harness, seed=seed, role="audit", meter=None,
        )
        fallbacks, self._pending_fallbacks = self._pending_fallbacks, 0
        if verdict is None:
            fallbacks += 1
        noted = {"mode": "audit", **(verdict.as_dict() if verdict else
                                      {"pass": None, "fallback": True})}
        return AuditResult(noted, fallbacks, with_verdict(state, noted) if state is not None else None)


def _notes(turn: Turn) -> HarnessNotes:
    """The harness's record of a turn (an empty one for a plain agent's)."""
    return turn.notes if isinstance(turn.notes, HarnessNotes) else HarnessNotes()


class AuditedAgent:
    """An agent whose accepted replies are audited (a :class:`~spasm.agents.TurnAgent`
    around another). The audit is a measurement: its verdict (and the state it annotates)
    replace nothing the agent decided, since audited levels have no checker of their own."""

    def __init__(
        self, agent: TurnAgent, config: RunConfig, persona: Persona | None,
        presence: Presence | None = None,
    ) -> None:
        self.agent = agent
        self.auditor = Auditor(agent, config, persona, presence)

    @property
    def speaker(self) -> Speaker:
        """The audited agent's side."""
        return self.agent.speaker

    @property
    def backend(self) -> str:
        """The audited agent's backend."""
        return self.agent.backend

    @property
    def system_prompt(self) -> str:
        """The audited agent's frame."""
        return self.agent.system_prompt

    async def setup(self, session: DialogueSession) -> None:
        """Set the agent up, then its auditor."""
        await self.agent.setup(session)
        await self.auditor.setup(session)

    async def turn(self, history: History, session: DialogueSession) -> Turn:
        """The agent's turn, with the audit's verdict, state and fallbacks in its notes."""
        turn = await self.agent.turn(history, session)
        audit = await self.auditor.audit(turn, history, session)
        notes = _notes(turn)
        return replace(turn, notes=replace(
            notes, verdict=audit.verdict, state=audit.state,
            fallbacks=notes.fallbacks + audit.fallbacks,
        ))

    def next_prompt(self, history: History, session: DialogueSession) -> NextPrompt:
        """The audited agent's next prompt."""
        return self.agent.next_prompt(history, session)


class RecallProbes:
    """A hook after the dialogue: each agent's recall probes (one per depth), stored on its
    last turn as ``{"probes": [...]}`` (:mod:`spasm.harness.probe`)."""

    def __init__(self, config: RunConfig) -> None:
        self.config = config

    async def after(
        self, agents: Sequence[TurnAgent], history: History, turns: list[TurnRow],
        session: DialogueSession,
    ) -> None:
        """Probe every agent and store the answers on its last turn."""
        for agent in agents:
            probes = await recall_probes(agent, history, session, self.config)
            own = [t for t in turns if t.speaker == agent.speaker]
            if probes and own:
                own[-1].probe = dump_probes(probes, _kept_persona(own[-1].probe))


async def recall_probes(
    agent: TurnAgent, history: History, session: DialogueSession, config: RunConfig
) -> list[dict[str, Any]]:
    """Ask the agent what its partner said at each of ``harness.probe_depths``; score in code.

    Each probe is one call (role ``probe``, temperature 0): the prompt the agent would see for
    a next turn plus the question of :func:`~spasm.harness.probe.probe_question`. Empty when
    the partner never spoke. The first message's probe keeps the seed (and so the request) of
    the single probe that came before depth probes.
    """
    partner = "responder" if agent.speaker == "client" else "client"
    targets = probe_targets([u.speaker for u in history.utterances], partner,
                            config.harness.probe_depths)
    if not targets:
        return []
    prompt = agent.next_prompt(history, session)
    backend = config.harness.backend or agent.backend
    out = []
    for target in targets:
        facts = fact_words(history.utterances[target.index].content)
        record: dict[str, Any] = {
            "depth": target.depth, "index": target.index, "partner_message": target.ordinal,
            "distance": len(history) - 1 - target.index,
            "in_window": target.index >= prompt.verbatim_from, "facts": facts,
        }
        where = () if target.ordinal == 1 else (target.index,)
        messages: list[Message] = [
            *prompt.messages, {"role": "system", "content": probe_question(target)}
        ]
        request = ChatRequest(messages=tuple(messages), temperature=0.0, max_tokens=60,
                              seed=derive_seed(session.seed, "probe", agent.speaker, *where))
        try:
            completion = await session.complete("probe", backend, request)
        except BackendError as exc:
            out.append({**record, "answer": None, "recall": None, "error": type(exc).__name__})
            continue
        answer = completion.text.strip()
        out.append({**record, "answer": answer, "recall": recall(facts, answer)})
    return out


#: The persona probes' questions, one per persona field (a field the persona lacks is not
#: asked about); ``city`` and ``location`` are the same question, asked once.
PERSONA_QUESTIONS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("age",), "How old are you?"),
    (("occupation",), "What do you do for a living?"),
    (("city", "location"), "Which city do you live in?"),
    (("concern",), "What did you come to talk about today?"),
)
_PERSONA_PREAMBLE = (
    "Pause the conversation for a moment. Answer as yourself, in one short sentence: "
)


def persona_questions(persona: Persona) -> list[tuple[str, str, str]]:
    """``(field, question, expected value)`` for each :data:`PERSONA_QUESTIONS` field the
    persona has (the first present of alternatives), in that order."""
    out = []
    for names, question in PERSONA_QUESTIONS:
        for name in names:
            value = persona.fields.get(name)
            if value is not None and str(value).strip():
                out.append((name, question, str(value).strip()))
                break
    return out


def _kept_persona(raw: str | None) -> list[PersonaProbe] | None:
    """The persona probes already in a ``turns.probe`` cell (``None``: none there)."""
    return load_persona_probes(raw) or None


class PersonaProbes:
    """A hook after the dialogue: each client's persona probes, stored on its last turn beside
    any recall probes, as ``{"probes": [...], "persona": [...]}`` (``personas``: the persona of
    each client speaker, ``{"client": ...}`` in a two-party dialogue)."""

    def __init__(self, config: RunConfig, personas: Mapping[Speaker, Persona]) -> None:
        self.config = config
        self.personas = personas

    async def after(
        self, agents: Sequence[TurnAgent], history: History, turns: list[TurnRow],
        session: DialogueSession,
    ) -> None:
        """Ask each client and store the answers on its last turn."""
        for agent in agents:
            persona = self.personas.get(agent.speaker)
            if persona is None:
                continue
            own = [t for t in turns if t.speaker == agent.speaker]
            if not own:
                continue
            asked = await persona_probes(agent, persona, history, session)
            if asked:
                own[-1].probe = dump_probes(load_probes(own[-1].probe), asked)


async def persona_probes(
    agent: TurnAgent, persona: Persona, history: History, session: DialogueSession
) -> list[PersonaProbe]:
    """Put each of :func:`persona_questions` to the agent: one call each (role
    ``persona_probe``, temperature 0, on the agent's own backend, since what is measured is
    its model) on the prompt it would see for a next turn plus the question."""
    prompt = agent.next_prompt(history, session)
    out = []
    for name, question, expected in persona_questions(persona):
        messages: list[Message] = [
            *prompt.messages, {"role": "system", "content": _PERSONA_PREAMBLE + question}
        ]
        request = ChatRequest(messages=tuple(messages), temperature=0.0, max_tokens=60,
                              seed=derive_seed(session.seed, "persona_probe", agent.speaker, name))
        record = {"field": name, "question": question, "expected": expected}
        try:
            completion = await session.complete("persona_probe", agent.backend, request)
        except BackendError as exc:
            out.append(PersonaProbe(**record, answer=None, error=type(exc).__name__))
            continue
        out.append(PersonaProbe(**record, answer=completion.text.strip()))
    return out
