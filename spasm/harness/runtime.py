"""One agent wrapped in the harness for one dialogue: the layers of its level, turn by turn.

:class:`HarnessedAgent` implements :class:`~spasm.agents.TurnAgent` around a
:class:`~spasm.agents.PlainAgent` (composition: it asks the plain agent for a draft from the
messages it orchestrated, or for the same agent in another frame, and touches nothing else).
The layers come from :data:`spasm.harness.levels.LEVELS`. A turn is:

1. (window) fold utterances that left the window into the structured context (every
   ``stride``), and classify the current intent (and note a switch);
2. (state) run the reducer on what happened since the agent last spoke;
3. (retrieval) retrieve in-character examples;
4. orchestrate the prompt and draft the reply;
5. (verify) check the candidate; on failure rewrite once with the advice; a second failure is
   accepted and flagged (:mod:`spasm.harness.verify`).

Audits and recall probes are measurements outside the agent (:mod:`spasm.harness.measure`).

No harness call can end a dialogue: a missing or malformed structured output (or a backend
error on a harness call) falls back — baseline policy, previous state, rule-based context,
unchecked reply with a flag — and is counted in the turn's ``fallbacks``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from spasm.agents import (
    Draft,
    NextPrompt,
    PlainAgent,
    Turn,
    client_instructions,
    group_client_instructions,
)
from spasm.backends.base import Message
from spasm.errors import BackendError
from spasm.harness.checker import Verdict
from spasm.harness.context import (
    Intent,
    StructuredContext,
    classify_intent,
    compress_llm,
    compress_rules,
    context_messages,
    dialogue_act,
    intent_guidance,
    render_context,
    still_open,
)
from spasm.harness.levels import Layers, layers
from spasm.harness.notes import HarnessNotes
from spasm.harness.policy import CharacterPolicy
from spasm.harness.profile import Presence, profile_of, resolve_policy
from spasm.harness.prompt import TurnBlock, orchestrate, stable_prompt, turn_block
from spasm.harness.retrieval import (
    Example,
    Query,
    dominant_emotion,
    load_corpus,
    relation_stage,
    render_examples,
    retrieve,
    scene_of,
)
from spasm.harness.state import (
    AgentState,
    Reduction,
    apply_update,
    initial_client_state,
    initial_responder_state,
    reduce_state,
    reducer_messages,
    salient_items,
)
from spasm.harness.stimulus import needs_reducer, no_stimulus
from spasm.harness.verify import Verified, check_candidate, verify, with_verdict
from spasm.history import History, Speaker, Utterance
from spasm.seeds import derive_seed
from spasm.session import TurnMeter

if TYPE_CHECKING:
    from spasm.calls import Structured
    from spasm.config import RunConfig
    from spasm.personas.persona import Persona
    from spasm.session import DialogueSession

__all__ = ["HarnessedAgent"]

#: Skip the reducer call when no cue in the new turn could move the state
#: (:mod:`spasm.harness.stimulus`). Off by default: at the design's checker rates it saved 1–3%
#: of level E's tokens (benchmarks/harness_cost.py), while it makes the number of reducer calls
#: depend on the text, which the dry run's estimate (scripted text) cannot reproduce exactly.
REDUCER_SCREEN = False


@dataclass(frozen=True)
class _Prepared:
    """What the layers before the draft produced for one turn."""

    block: TurnBlock | None = None
    intent: Intent | None = None
    reduction: Reduction | None = None
    fallbacks: int = 0


class HarnessedAgent:
    """A plain agent inside the layers of its level, for one dialogue (state never shared).

    ``persona``: the Client's (a client seat's own in a group dialogue); ``None`` for a
    Responder, which is never handed one. In a group dialogue ``presence`` is its seat's view
    of the group."""

    def __init__(
        self, inner: PlainAgent, level: str, config: RunConfig, persona: Persona | None,
        presence: Presence | None = None,
    ) -> None:
        self.inner = inner
        self.layers: Layers = layers(level)
        self.hc = config.harness
        self.config = config
        self.persona = persona
        self.profile = profile_of(inner.speaker, inner.backend, config, persona, presence)
        client = self.profile.seat == "client"
        if client and persona is None:
            raise ValueError(f"the client agent {inner.speaker!r} needs its persona")
        self.policy: CharacterPolicy | None = None
        #: The plain agent that writes this agent's drafts: ``inner`` in the orchestrated
        #: frame once the policy layer has compiled it (:meth:`setup`).
        self.voice = inner
        self.state: AgentState | None = None
        if self.layers.state:
            self.state = (
                initial_client_state(persona) if persona is not None and client
                else initial_responder_state(self.profile.role)
            )
        # The Client knows what it came about; the Responder learns it from the conversation.
        self.context = StructuredContext(
            topic=str(persona.fields.get("domain") or "") if persona is not None and client
            else ""
        )
        self.intent: Intent | None = (
            classify_intent(f"{persona.fields.get('motivation', '')} "
                            f"{persona.fields.get('concern', '')}")
            if persona is not None and client else None
        )
        self.examples: list[Example] = []
        if self.layers.retrieval and self.hc.corpus:
            self.examples = load_corpus(self.hc.corpus, self.profile.seat)
        self.correction: str | None = None
        #: Level E with ``review: merged``: the checker's call updates the state after the
        #: draft, instead of a reducer call before it.
        self.merged_review = (
            self.layers.verify and self.layers.state and self.hc.review == "merged"
        )
        self._last_own_index: int | None = None
        self._pending_fallbacks = 0

    @property
    def speaker(self) -> Speaker:
        """The wrapped agent's side."""
        return self.inner.speaker

    @property
    def backend(self) -> str:
        """The backend that writes the drafts (harness calls may use ``harness.backend``)."""
        return self.inner.backend

    @property
    def system_prompt(self) -> str:
        """The stable frame: the orchestrated one from level C on (after :meth:`setup`)."""
        return self.voice.system_prompt

    # -- set-up ----------------------------------------------------------------------------
    async def setup(self, session: DialogueSession) -> None:
        """Resolve the policy (stored with the persona, else extracted once per run) and, with
        the policy layer, compile it into the stable frame."""
        if not (self.layers.policy or self.layers.verify):
            return
        self.policy, self._pending_fallbacks = await resolve_policy(
            self.profile, self.persona, self.config, session
        )
        if self.layers.policy:
            self.voice = self.inner.reframed(
                stable_prompt(self._frame_without_card(), self.policy,
                              never_n=self.hc.never_in_prompt)
            )

    def _frame_without_card(self) -> str:
        """What the policy's facts stand on: the Client's instructions without its card (a
        client seat's group frame without it), the responder's whole frame."""
        p = self.profile
        if p.seat != "client":
            return self.inner.system_prompt
        if p.presence is None:
            return client_instructions(p.role, self.persona.language if self.persona else None)
        return group_client_instructions(p.speaker, p.presence.seats, p.presence.instructions)

    # -- one turn --------------------------------------------------------------------------
    async def turn(self, history: History, session: DialogueSession) -> Turn:
        """Produce this agent's next accepted utterance."""
        seed = session.turn_seed(len(history), self.speaker)
        meter = TurnMeter(session)
        fallbacks, self._pending_fallbacks = self._pending_fallbacks, 0
        prep = await self._prepare(history, session, seed, meter)
        messages = self._messages(history, session.condition, prep.block)
        draft = await self.voice.draft(messages, session, seed, turn_index=len(history))
        meter.add(draft.cacheable_tokens)
        self.correction = None
        checked: Verified | None = None
        if self.layers.verify:
            checked = await self._verify(draft, history, prep.block, session, seed, meter)
            draft, self.correction = checked.draft, checked.correction
        reduction = prep.reduction
        if self.merged_review and self.state is not None and checked is not None:
            reduction = self._reviewed_state(history, draft.text, checked)
            self.state = reduction.state
        if self.state is not None and checked is not None:
            self.state = with_verdict(self.state, checked.verdict)
        self._remember(history, draft.text, prep.intent)
        return Turn(
            speaker=self.speaker, text=draft.text, completion=draft.completion,
            messages=draft.messages,
            attempts=checked.attempts if checked else 1,
            flagged=checked.flagged if checked else False,
            flag_reason=checked.flag_reason if checked else None,
            notes=HarnessNotes(
                verdict=checked.verdict if checked else None,
                state=self.state, reduction=reduction, intent=prep.intent,
                fallbacks=fallbacks + prep.fallbacks + (checked.fallbacks if checked else 0),
            ),
            cached_prompt_tokens=meter.cached_prompt_tokens,
            reproducible=not self.layers.window,
        )

    async def _prepare(
        self, history: History, session: DialogueSession, seed: int, meter: TurnMeter
    ) -> _Prepared:
        """The layers before the draft: context, intent, state, examples → the turn block."""
        if not self.layers.window:
            return _Prepared()
        fallbacks = await self._fold_context(history, session, seed, meter)
        clients = self.profile.clients
        last_client = next(
            (u.content for u in reversed(history.utterances) if u.speaker in clients), ""
        )
        previous = self.intent
        intent = classify_intent(last_client, previous)
        self.intent = intent
        reduction: Reduction | None = None
        if self.layers.state and self.state is not None and not self.merged_review:
            start = self._last_own_index if self._last_own_index is not None else 0
            recent = history.utterances[start:]
            if recent:
                reduction = await self._reduce(recent, session, seed, meter)
                if reduction.fallback:
                    fallbacks += 1
                self.state = reduction.state
        examples = None
        if self.layers.retrieval:
            window_texts = [u.content for u in history.utterances[self.context.covered :]]
            chosen = retrieve(
                self._query(history, intent), self.examples, k=self.hc.examples,
                prefilter=self.hc.prefilter, exclude_texts=window_texts,
            )
            examples = render_examples(chosen) if chosen else None
        block = TurnBlock(
            state_items=tuple(salient_items(self.state, self.hc.state_items))
            if self.state else (),
            scene=tuple(self._scene(history, intent, previous)),
            examples=examples,
            correction=self.correction if self.layers.verify else None,
        )
        return _Prepared(block, intent, reduction, fallbacks)

    async def _fold_context(
        self, history: History, session: DialogueSession, seed: int, meter: TurnMeter
    ) -> int:
        """Fold utterances that left the window into the record; returns fallbacks."""
        n = len(history)
        if n - self.context.covered < self.hc.window + self.hc.stride:
            return 0
        upto = n - self.hc.window
        utts = history.utterances
        labels: dict[Speaker, str] = dict(self.profile.labels)
        if self.hc.context == "llm":
            msgs = context_messages(self.context, utts[self.context.covered : upto], self.speaker,
                                    labels)

            async def fold() -> Structured[StructuredContext | None] | None:
                try:
                    return await compress_llm(
                        session.caller, self.profile.backend, self.context, utts, upto,
                        self.speaker, labels, session.scope,
                        temperature=self.hc.temperature, seed=seed,
                    )
                except BackendError:
                    return None

            new = meter.count(msgs, await fold())
            if new is not None:
                self.context = new
                return 0
            self.context = compress_rules(self.context, utts, upto, self.speaker, labels)
            return 1
        self.context = compress_rules(self.context, utts, upto, self.speaker, labels)
        return 0

    async def _reduce(
        self, recent: Sequence[Utterance], session: DialogueSession, seed: int, meter: TurnMeter
    ) -> Reduction:
        assert self.state is not None
        state = self.state
        lines = self.profile.lines(recent)
        if REDUCER_SCREEN and not needs_reducer(lines, state):
            # Nothing in the new turn can move the state: the constraints' no-stimulus step
            # (decay), in code, instead of a call whose answer would be "no stimulus".
            return no_stimulus(state, lines)
        msgs = reducer_messages(self.profile.name, state, lines)

        async def step() -> Structured[Reduction] | None:
            try:
                return await reduce_state(
                    session.caller, self.profile.backend, self.profile.name, state, lines,
                    session.scope, temperature=self.hc.temperature,
                    max_tokens=self.hc.reducer_max_tokens, seed=derive_seed(seed, "reducer"),
                )
            except BackendError:
                return None

        reduction = meter.count(msgs, await step())
        return reduction if reduction is not None else apply_update(state, None, lines)

    def _reviewed_state(self, history: History, text: str, checked: Verified) -> Reduction:
        """The state after a merged review: its update applied under the hard constraints,
        with the partner's messages since this agent last spoke and the accepted reply as the
        evidence the update may quote. No reviewed update (the check was unavailable or only
        the code screen judged the accepted text): the state stays as it was."""
        assert self.state is not None
        start = self._last_own_index + 1 if self._last_own_index is not None else 0
        recent = [*history.utterances[start:], Utterance(self.speaker, text)]
        return apply_update(self.state, checked.update, self.profile.lines(recent))

    async def _verify(
        self, draft: Draft, history: History, block: TurnBlock | None,
        session: DialogueSession, seed: int, meter: TurnMeter,
    ) -> Verified:
        assert self.policy is not None
        policy = self.policy

        async def check(text: str, n: int) -> Verdict | None:
            return await check_candidate(
                self.profile, policy, self.state, history, text, session, self.hc,
                seed=derive_seed(seed, "check", n), role="checker", meter=meter,
                review=self.merged_review,
            )

        async def redraft(note: str) -> Draft:
            rewrite_block = replace(block, rewrite=note) if block else TurnBlock(rewrite=note)
            messages = self._messages(history, session.condition, rewrite_block)
            d = await self.voice.draft(messages, session, derive_seed(seed, "rewrite"),
                                       role="rewrite", turn_index=len(history))
            meter.add(d.cacheable_tokens)
            return d

        return await verify(draft, check, redraft)

    # -- the prompt ------------------------------------------------------------------------
    def _messages(
        self, history: History, condition: str, block: TurnBlock | None,
        context: StructuredContext | None = None,
    ) -> list[Message]:
        if not self.layers.window:
            return self.voice.messages(history, condition)
        ctx = self.context if context is None else context
        covered = ctx.covered
        return orchestrate(
            history.utterances[covered:], self.voice.viewer, condition, covered=covered,
            context=render_context(ctx) if covered else None,
            block=turn_block(block) if block else None,
        )

    def _scene(self, history: History, intent: Intent, previous: Intent | None) -> list[str]:
        scene = [f"This is message {len(history) + 1} of the conversation."]
        if self.context.topic:
            scene.append(f"Topic so far: {self.context.topic}.")
        if self.context.partner_emotion:
            who = "The others" if len(self.profile.others) > 1 else "The other person"
            scene.append(f"{who} seemed {self.context.partner_emotion}.")
        scene.append(intent_guidance(self.profile.seat, intent, previous))
        open_q = still_open(self.context.unresolved_questions, history.utterances,
                            self.context.covered, self.speaker)
        if open_q:
            scene.append("Still open: " + " | ".join(open_q))
        return scene

    def _query(self, history: History, intent: Intent) -> Query:
        last_partner = self.profile.last_partner(history) or ""
        state = self.state or AgentState()
        return Query(
            text=f"{last_partner} {self.context.topic}", intent=intent,
            emotion=dominant_emotion(state), relation=relation_stage(state),
            act=dialogue_act(last_partner) if last_partner else "none",
            scene=scene_of(len(history), self.profile.max_utterances),
        )

    def _remember(self, history: History, text: str, intent: Intent | None) -> None:
        """Keep the accepted utterance as a future example, with the situation it answered."""
        self._last_own_index = len(history)
        last_partner = self.profile.last_partner(history) or ""
        state = self.state or AgentState()
        self.examples.append(
            Example(
                text=text, intent=intent or classify_intent(text),
                emotion=dominant_emotion(state), relation=relation_stage(state),
                act=dialogue_act(last_partner) if last_partner else "none",
                scene=scene_of(len(history), self.profile.max_utterances), index=len(history),
            )
        )

    # -- what a next turn would see (for measurements) --------------------------------------
    def next_prompt(self, history: History, session: DialogueSession) -> NextPrompt:
        """The prompt of a next turn without any model call: the record brought up to date by
        rules (as a fold would), the window, the state items; nothing is changed."""
        if not self.layers.window:
            return NextPrompt(self.voice.messages(history, session.condition))
        ctx = self.context
        n = len(history)
        if n - ctx.covered >= self.hc.window + self.hc.stride:
            ctx = compress_rules(ctx, history.utterances, n - self.hc.window, self.speaker,
                                 dict(self.profile.labels))
        block = TurnBlock(
            state_items=tuple(salient_items(self.state, self.hc.state_items)) if self.state else ()
        )
        return NextPrompt(self._messages(history, session.condition, block, ctx), ctx.covered)
