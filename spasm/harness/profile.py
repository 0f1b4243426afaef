"""Who an agent is to its harness and to the measurements of it, and its resolved policy.

A :class:`Profile` is built in code from the speaker, the run config and the persona (no model
call): the names and labels the harness prompts use and the backend of the harness's own calls.
The harnessed agent and the audit both build one, so a measurement never reaches into the
agent for them. In a group dialogue a seat's :class:`Presence` (who else is there) goes in
too: the speaker is then a participant id, its seat's role says whether it is a client, and
every other participant is labelled by its id.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from spasm.agents import responder_system_prompt
from spasm.errors import BackendError
from spasm.harness.policy import (
    CharacterPolicy,
    PolicyBook,
    baseline_client_policy,
    baseline_responder_policy,
    client_policy,
    parse_stored_policy,
)
from spasm.history import History, Role, Speaker, Utterance
from spasm.seeds import derive_seed

if TYPE_CHECKING:
    from spasm.config import RunConfig
    from spasm.personas.persona import Persona
    from spasm.session import DialogueSession

__all__ = ["Presence", "Profile", "profile_of", "resolve_policy"]


@dataclass(frozen=True)
class Presence:
    """One seat of a group dialogue as its harness sees the group (none in a two-party one)."""

    #: The seat's role.
    role: Role
    #: Every participant in turn order: ``(id, role, responder role)``, as
    #: :func:`spasm.agents.group_presence` takes them.
    seats: tuple[tuple[str, str, str], ...]
    #: The responder role the seat plays (a responder seat) or meets (a client seat).
    responder_role: str
    #: The seat's own instructions (``participants[].instructions``), if any.
    instructions: str | None
    #: The group dialogue's cap (``group.max_utterances``).
    max_utterances: int


@dataclass(frozen=True)
class Profile:
    """One agent's names and labels in one dialogue, and where its harness calls go."""

    speaker: Speaker
    #: Whether the agent is a client (persona) or a responder: its speaker in a two-party
    #: dialogue, its seat's role in a group.
    seat: Role
    #: Everyone else who speaks, and the speakers that are clients (the agent included if
    #: it is one): ``("responder",)`` and ``("client",)`` for a two-party Client.
    others: tuple[Speaker, ...]
    clients: tuple[Speaker, ...]
    #: The Responder's role (``customer-service agent`` …), known to both sides.
    role: str
    #: How prompts about this agent name it (the persona's first name, or ``the <role>``).
    name: str
    #: How the agent's own transcript lines label each speaker ("You" for itself).
    labels: dict[Speaker, str]
    #: Backend of the harness's calls (policy, reducer, context, checker, audit, probe).
    backend: str
    #: The dialogue's cap in utterances (the scene's beginning/middle/end).
    max_utterances: int
    #: The group around the agent (``None`` in a two-party dialogue).
    presence: Presence | None = None

    @property
    def checker_who(self) -> str:
        """Who wrote the message a checker reviews."""
        if self.presence is not None:
            if self.seat == "client":
                return f"{self.name}, one of the people in a group conversation with a {self.role}"
            return f"{self.name}, a {self.role} leading a group conversation"
        if self.seat == "client":
            return f"{self.name}, who is talking with a {self.role}"
        return f"a {self.role}"

    def lines(self, utterances: Sequence[Utterance]) -> str:
        """Utterances as labelled transcript lines, from this agent's side."""
        return "\n".join(f"{self.labels[u.speaker]}: {u.content}" for u in utterances)

    def last_partner(self, history: History) -> str | None:
        """What another speaker (the partner, in a two-party dialogue) said last, if anything."""
        return next(
            (u.content for u in reversed(history.utterances) if u.speaker != self.speaker), None
        )


def profile_of(
    speaker: Speaker, backend: str, config: RunConfig, persona: Persona | None,
    presence: Presence | None = None,
) -> Profile:
    """The profile of the agent ``speaker`` whose utterances ``backend`` writes (``persona``:
    the Client's, ``None`` for a Responder; only its ``first_name`` is read, when present);
    with ``presence``, of a group seat: named and labelling others by participant id."""
    if presence is not None:
        return Profile(
            speaker=speaker, seat=presence.role,
            others=tuple(pid for pid, _, _ in presence.seats if pid != speaker),
            clients=tuple(pid for pid, role, _ in presence.seats if role == "client"),
            role=presence.responder_role, name=speaker,
            labels={pid: "You" if pid == speaker else pid for pid, _, _ in presence.seats},
            backend=config.harness.backend or backend,
            max_utterances=presence.max_utterances, presence=presence,
        )
    role = config.dialogue.responder_role
    labels: dict[Speaker, str] = {
        "client": "The client" if speaker == "responder" else "You",
        "responder": f"The {role}" if speaker == "client" else "You",
    }
    name = (
        str((persona.fields.get("first_name") if persona is not None else None) or "the client")
        if speaker == "client" else f"the {role}"
    )
    return Profile(
        speaker=speaker,
        seat="client" if speaker == "client" else "responder",
        others=("responder" if speaker == "client" else "client",),
        clients=("client",),
        role=role,
        name=name,
        labels=labels,
        backend=config.harness.backend or backend,
        max_utterances=2 * config.dialogue.max_turns_per_agent,
    )


async def resolve_policy(
    profile: Profile, persona: Persona | None, config: RunConfig, session: DialogueSession
) -> tuple[CharacterPolicy, int]:
    """The agent's policy and how many fallbacks resolving it cost this dialogue (0 or 1).

    The Client's is stored with the persona; otherwise (and always for the Responder) it is
    extracted once per run (role ``policy``) unless ``extract_policy`` is off, which uses the
    baseline derived in code. Only the dialogue that made the extraction counts its fallback.
    """
    hc = config.harness
    if profile.seat == "client":
        if persona is None:
            raise ValueError(f"the client agent {profile.speaker!r} needs its persona")
        stored = parse_stored_policy(persona)
        if stored is not None:
            return stored, 0
        if not hc.extract_policy:
            return baseline_client_policy(persona, profile.role), 0
        policy, fell_back, extracted_now = await client_policy(
            session.caller, profile.backend, persona, profile.role, session.scope,
            temperature=hc.temperature,
        )
        return policy, int(fell_back and extracted_now)
    instructions = config.dialogue.responder_instructions
    key: tuple[str, ...] = ("responder", profile.role)
    if profile.presence is not None and profile.presence.instructions:
        # A group seat with instructions of its own compiles its own policy.
        instructions = profile.presence.instructions
        key = (*key, instructions)
    baseline = baseline_responder_policy(profile.role, instructions)
    if not hc.extract_policy:
        return baseline, 0
    try:
        # The seed depends on what is compiled, not on the dialogue that happens to ask
        # first: concurrent runs must extract the same policy.
        policy, fell_back, extracted_now = await PolicyBook.get(
            session.caller, profile.backend, key, baseline,
            responder_system_prompt(profile.role, instructions), session.scope,
            temperature=hc.temperature, seed=derive_seed("policy", *key),
        )
    except BackendError:
        return baseline, 1
    return policy, int(fell_back and extracted_now)
