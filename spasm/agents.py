"""The two agents: the Client (the persona) and the Responder (the assistant under test).

The Responder never receives the Client's persona card, and the Client is never told it is an
AI: its system prompt is the card plus instructions to stay the person seeking help.

The simulation sees an agent only through :class:`TurnAgent`: it is set up once per dialogue
and then produces one :class:`Turn` at a time — the accepted text and everything the turns table
records about it (attempts, flags, cached prompt tokens), returned rather than read back from
the call log. What a layer above adds (the harness's state, verdict, intent, fallbacks) travels
as that layer's own typed record, seen here only through :class:`TurnNotes`: this module knows
no harness type. :class:`PlainAgent` is level A: its frame and the projection of the whole
history, one generation call per turn. The harnessed agent
(:class:`spasm.harness.runtime.HarnessedAgent`, levels B–E) wraps a plain agent.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

from spasm.backends.base import ChatRequest, Completion, Message, ToolCall
from spasm.backends.structured import prompted_step_model, prompted_tool_messages
from spasm.history import Event, History, Speaker
from spasm.language import language_name
from spasm.projection import Viewer, name_list, project
from spasm.seeds import derive_seed
from spasm.session import DialogueSession
from spasm.tools import Tool, ToolBelt, tool_specs

END_MARKER = "<END>"


def client_instructions(responder_role: str, language: object = None) -> str:
    """How the Client behaves in the conversation (its frame without the persona card).

    ``language``: the persona's (a code, tag or English name); when it is not English the
    frame asks for every message in it. English or none: no language line
    (``test_english_or_no_language_leaves_the_frames_as_they_were``)."""
    name = language_name(language)
    speak = f" Write every message in {name}, your own language." if name else ""
    return (
        f"You are talking with a {responder_role}. You are the person seeking help: stay this "
        "person throughout, with your own concern, feelings and way of speaking, and speak only "
        "for yourself, in the first person. Do not give advice, do not offer help and do not take "
        f"over the {responder_role}'s role. Write short chat messages (one to three sentences)."
        f"{speak} When your concern is settled or you want to leave, say goodbye naturally."
    )


def client_system_prompt(card: str, responder_role: str, language: object = None) -> str:
    """The Client's frame: its persona card and how to behave in the conversation."""
    return f"{card}\n\n{client_instructions(responder_role, language)}"


def responder_system_prompt(
    role: str, instructions: str | None = None, language: object = None
) -> str:
    """The Responder's frame: its role only (never the Client's card). ``language``: the
    conversation's when it is not English (the one thing about the Client the Responder is
    told, as a service knows which language its user writes in); English or none: no language line."""
    name = language_name(language)
    base = (
        f"You are a {role}. Someone has come to talk with you. Help them with care and "
        "competence, ask a question when you need more information, and keep each reply short "
        "(two to four sentences). Stay in your role."
        + (f" The conversation is in {name}: write every reply in {name}." if name else "")
    )
    return f"{base}\n\n{instructions}" if instructions else base


def group_presence(me: str, seats: Sequence[tuple[str, str, str]]) -> str:
    """Who else is in a group conversation, named from ``me``'s side (``seats``: id, role and
    the responder role of each participant, in order), so no participant has to guess how many
    others there are."""
    clients = [pid for pid, role, _ in seats if role == "client" and pid != me]
    helpers = [f"{pid} (the {rrole})" for pid, role, rrole in seats if role == "responder" and pid != me]
    parts = []
    if clients:
        parts.append(f"{name_list(clients)} ({'another person' if len(clients) == 1 else 'other people'} "
                     "seeking help)")
    if helpers:
        parts.append(name_list(helpers))
    return (f"This is a group conversation with {len(seats)} participants. You appear in it as "
            f"{me}; the others present are {' and '.join(parts)}. Each message is labelled with "
            "its speaker's name.")


def group_client_instructions(me: str, seats: Sequence[tuple[str, str, str]],
                              instructions: str | None = None) -> str:
    """How a client seat behaves in a group (its frame without the persona card)."""
    base = (
        f"{group_presence(me, seats)} You are one of the people seeking help: stay "
        "this person throughout, with your own concern, feelings and way of speaking, and speak "
        "only for yourself, in the first person. Never write another participant's lines or "
        "speak for them, and do not start your message with a name. Write short chat messages "
        "(one to three sentences). When your concern is settled or you want to leave, say "
        "goodbye naturally."
    )
    return f"{base}\n\n{instructions}" if instructions else base


def group_client_system_prompt(card: str, me: str, seats: Sequence[tuple[str, str, str]],
                               instructions: str | None = None) -> str:
    """A client seat's frame: its persona card, who is present, how to behave in a group."""
    return f"{card}\n\n{group_client_instructions(me, seats, instructions)}"


def group_responder_system_prompt(role: str, me: str, seats: Sequence[tuple[str, str, str]],
                                  instructions: str | None = None) -> str:
    """A responder seat's frame: its role, who is present, how to lead (never a card)."""
    base = (
        f"You are a {role}. {group_presence(me, seats)} Help each of them with care and "
        "competence, address people by name, ask a question when you need more information, "
        "and keep each reply short (two to four sentences). Stay in your role, write only your "
        "own message, and do not start it with a name."
    )
    return f"{base}\n\n{instructions}" if instructions else base


def strip_own_label(text: str, me: str) -> str:
    """A group reply without the speaker's own name in front ("Ana: …", "**Ana:** …"); other
    participants' names are left where they are (impersonation is measured, not hidden)."""
    return re.sub(rf"^\s*(?:\*\*)?{re.escape(me)}(?:\*\*)?\s*:\s*(?:\*\*)?\s*", "", text,
                  count=1, flags=re.I)


_LABEL_PREFIX = re.compile(r"^\s*(?:\*\*)?(client|responder|user|assistant)(?:\*\*)?\s*:\s*", re.I)
_OTHER_LINE = re.compile(r"\n\s*(?:\*\*)?(?:client|responder)(?:\*\*)?\s*:", re.I)


_SENTENCE_END = re.compile(r"[.!?…)\]\"']\s")


def clean_reply(text: str, truncated: bool = False) -> str:
    """Tidy a generated utterance: drop a leading role label, anything the model wrote for the
    other speaker after it, and our end marker. A reply cut by ``max_tokens`` loses its
    unfinished last sentence when it has a finished one."""
    t = _LABEL_PREFIX.sub("", text.strip(), count=1)
    cut = _OTHER_LINE.search(t)
    if cut:
        t = t[: cut.start()]
    t = t.replace(END_MARKER, "").strip()
    if truncated:
        ends = list(_SENTENCE_END.finditer(t + " "))
        if ends and ends[-1].end() < len(t) + 1:
            t = t[: ends[-1].start() + 1]
    return t.strip().strip('"').strip()


@dataclass(frozen=True)
class NoteColumns:
    """The turns-table columns a layer above the dialogue fills (serialised as stored)."""

    checker_verdict: str | None = None
    state: str | None = None
    state_clips: int = 0
    state_log: str | None = None
    intent: str | None = None
    harness_fallbacks: int = 0


class TurnNotes(Protocol):
    """What a layer above the dialogue adds to a turn, as its own typed record (the harness's
    :class:`~spasm.harness.notes.HarnessNotes`); the dialogue stores it through its columns."""

    def columns(self) -> NoteColumns:
        """The record as the turns table stores it."""
        ...


@dataclass(frozen=True)
class Turn:
    """One accepted utterance and everything the turns table records about it."""

    speaker: Speaker
    text: str
    completion: Completion
    #: The exact messages behind the accepted text (the rewrite's, after a rewrite).
    messages: list[Message]
    #: Generation calls behind the accepted text: 1, or 2 after a rewrite. Transport retries
    #: of a call are not attempts (they are rows of the calls table).
    attempts: int = 1
    flagged: bool = False
    flag_reason: str | None = None
    #: What a layer above adds (the harness's state, verdict, intent, fallbacks), or ``None``.
    notes: TurnNotes | None = None
    #: Estimated prompt tokens of this turn's calls a provider's prefix cache could serve.
    cached_prompt_tokens: int = 0
    #: Whether ``messages`` can be recomputed from the history by projection (level A); when
    #: not, they depend on model calls and are stored with the turn.
    reproducible: bool = True
    #: What the agent did before it spoke: its tool calls, their results and notices, in
    #: order (a run with tools; ``messages`` is then the frame after all of them).
    events: tuple[Event, ...] = ()

    def stored_messages(self) -> str | None:
        """The messages as stored in ``turns.messages``: JSON unless they are reproducible."""
        return None if self.reproducible else json.dumps(list(self.messages), ensure_ascii=False)


@dataclass(frozen=True)
class NextPrompt:
    """What an agent would see for a next turn, without any model call (for measurements)."""

    messages: list[Message]
    #: Index of the first utterance shown verbatim; earlier ones are summarised (0 at level A).
    verbatim_from: int = 0


@dataclass(frozen=True)
class Draft:
    """One generated utterance and the messages it came from."""

    text: str
    completion: Completion
    messages: list[Message]
    #: Prompt tokens of the call a prefix cache could serve (estimate; a float until summed).
    cacheable_tokens: float = 0.0


class TurnAgent(Protocol):
    """One side of a dialogue as the simulation sees it: set up once, then turn after turn."""

    @property
    def speaker(self) -> Speaker:
        """``client`` or ``responder`` (in a group dialogue: the participant's id)."""
        ...

    @property
    def backend(self) -> str:
        """The backend that writes this agent's utterances."""
        ...

    @property
    def system_prompt(self) -> str:
        """The agent's stable frame (valid after :meth:`setup`), stored with the dialogue."""
        ...

    async def setup(self, session: DialogueSession) -> None:
        """Prepare for the dialogue (a harnessed agent resolves its policy here)."""
        ...

    async def turn(self, history: History, session: DialogueSession) -> Turn:
        """Produce this agent's next accepted utterance after ``history``."""
        ...

    def next_prompt(self, history: History, session: DialogueSession) -> NextPrompt:
        """The prompt a next turn would start from (no model call, no change of state)."""
        ...


@dataclass(frozen=True)
class PlainAgent:
    """Level A: its frame and the projection of the whole history; one call per turn."""

    speaker: Speaker
    backend: str
    viewer: Viewer
    temperature: float
    max_tokens: int
    #: How a tool step is asked (a run with tools): ``native`` sends the tools and reads the
    #: reply's ``tool_calls``; ``prompted`` describes them in the frame and asks through the
    #: structured-output path for a message or calls (servers without tools, the embedded model).
    tool_mode: Literal["native", "prompted"] = "native"

    @property
    def system_prompt(self) -> str:
        """The frame (persona card or role) the agent speaks from."""
        return self.viewer.system_prompt

    def reframed(self, system_prompt: str) -> PlainAgent:
        """The same agent speaking from another frame (the harness's orchestrated prompt)."""
        return replace(self, viewer=replace(self.viewer, system_prompt=system_prompt))

    def messages(self, history: History, condition: str) -> list[Message]:
        """What this agent sees now: Ψ(history, self)."""
        return project(history, self.viewer, condition)

    async def draft(
        self, messages: list[Message], session: DialogueSession, seed: int, *,
        role: str | None = None, turn_index: int | None = None,
    ) -> Draft:
        """One utterance from exactly these messages; ``role`` names the call in the log
        (default: the speaker; the harness uses ``rewrite`` for its second attempt);
        ``turn_index`` is the index of the utterance it writes (the request's context)."""
        share = session.prefix.observe(messages)
        request = ChatRequest(
            messages=tuple(messages), temperature=self.temperature,
            max_tokens=self.max_tokens, seed=seed,
            # One stream per agent and dialogue: under ECP its prompts only ever grow.
            stream_key=f"{session.scope.dialogue_id}:{self.speaker}",
            context=session.context(self.speaker, turn_index),
        )
        completion = await session.complete(role or self.speaker, self.backend, request)
        text = clean_reply(completion.text, completion.finish_reason == "length")
        if self.viewer.group is not None:
            text = strip_own_label(text, self.speaker)
        if not text:
            text = completion.text.strip()
        return Draft(text, completion, messages, share * completion.prompt_tokens)

    async def setup(self, session: DialogueSession) -> None:
        """Nothing to prepare."""

    async def turn(self, history: History, session: DialogueSession) -> Turn:
        """Generate the next utterance from the agent's own projected context (in a run with
        tools, after the tool steps it takes: :meth:`acting_turn`)."""
        belt = session.belt
        offered = belt.offered(self.speaker) if belt is not None else []
        if belt is not None and offered:
            return await self.acting_turn(history, session, belt, offered)
        messages = self.messages(history, session.condition)
        d = await self.draft(messages, session, session.turn_seed(len(history), self.speaker),
                             turn_index=len(history))
        return Turn(
            speaker=self.speaker, text=d.text, completion=d.completion, messages=d.messages,
            cached_prompt_tokens=round(d.cacheable_tokens),
        )

    def next_prompt(self, history: History, session: DialogueSession) -> NextPrompt:
        """The projection of the whole history, as at a next turn."""
        return NextPrompt(self.messages(history, session.condition))

    async def acting_turn(self, history: History, session: DialogueSession, belt: ToolBelt,
                          offered: list[Tool]) -> Turn:
        """A turn that may act: up to ``belt.max_steps`` tool steps (each a call whose reply
        asks for tools, which run and whose results the next step sees), then the utterance.
        After the last step the agent is asked without tools, so every turn ends in words."""
        index = len(history)
        first = session.turn_seed(index, self.speaker)
        specs = tool_specs(offered)
        events: list[Event] = []
        cacheable = 0.0
        for step in range(belt.max_steps + 1):
            frame = self.messages(history.with_events(events), session.condition)
            seed = first if step == 0 else derive_seed(first, "step", step)
            last = step == belt.max_steps
            cacheable += session.prefix.observe(frame)
            calls, text, completion = await self._step(frame, session, seed, index,
                                                       None if last else specs, belt)
            if calls:
                named = [ToolCall(c.id or f"call_{index}_{step}_{i}", c.name, c.arguments)
                         for i, c in enumerate(calls)]
                events.extend(await belt.run(self.speaker, index, named))
                continue
            belt.capped += int(last and step > 0)
            return Turn(speaker=self.speaker, text=text, completion=completion, messages=frame,
                        cached_prompt_tokens=round(cacheable * completion.prompt_tokens),
                        events=tuple(events))
        raise AssertionError("unreachable: the last step offers no tools")

    async def _step(
        self, frame: list[Message], session: DialogueSession, seed: int, index: int,
        specs: tuple[dict[str, Any], ...] | None, belt: ToolBelt,
    ) -> tuple[tuple[ToolCall, ...], str, Completion]:
        """One call of a tool step: the calls it asks for, or the utterance it writes."""
        if self.tool_mode == "native" or specs is None:
            messages = frame if self.tool_mode == "native" else prompted_tool_messages(frame, ())
            request = ChatRequest(
                messages=tuple(messages), temperature=self.temperature,
                max_tokens=self.max_tokens, seed=seed,
                stream_key=f"{session.scope.dialogue_id}:{self.speaker}",
                context=session.context(self.speaker, index), tools=specs,
            )
            completion = await session.complete(self.speaker, self.backend, request)
            if completion.tool_calls and specs is not None:
                return completion.tool_calls, "", completion
            return (), self._clean(completion), completion
        names = tuple(t["function"]["name"] for t in specs)
        result = await session.caller.structured(
            self.speaker, self.backend, prompted_tool_messages(frame, specs),
            prompted_step_model(names), session.scope, temperature=self.temperature,
            max_tokens=self.max_tokens, seed=seed)
        assert result.last is not None
        completion = replace(result.last, prompt_tokens=result.prompt_tokens,
                             completion_tokens=result.completion_tokens)
        step = result.value
        if step is None:  # no ask parsed: the turn writes plain text instead (counted)
            belt.fallbacks += 1
            return await self._step(frame, session, derive_seed(seed, "fallback"), index, None,
                                    belt)
        if step.tool_calls:
            return tuple(ToolCall("", c.name, json.dumps(c.arguments, ensure_ascii=False))
                         for c in step.tool_calls), "", completion
        return (), self._clean(replace(completion, text=step.message or "")), completion

    def _clean(self, completion: Completion) -> str:
        text = clean_reply(completion.text, completion.finish_reason == "length")
        if self.viewer.group is not None:
            text = strip_own_label(text, self.speaker)
        return text or completion.text.strip()
