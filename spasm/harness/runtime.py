"""One agent wrapped in the harness for one dialogue: the layers of its level, turn by turn.

:class:`AgentHarness` is what :func:`spasm.simulation.simulate_dialogue` calls for each
utterance. At level A it is exactly the plain agent (same request bytes, so caches and old runs
stay valid). From level B on, a turn is:

1. fold utterances that left the window into the structured context (every ``stride``);
2. classify the current intent (and note a switch);
3. (C+) run the reducer on what happened since the agent last spoke;
4. (D+) retrieve in-character examples;
5. orchestrate the prompt and generate;
6. (E) check the candidate; on failure rewrite once with the advice; a second failure is
   accepted and flagged. With ``audit`` on, lower levels have the accepted reply checked
   (role ``audit``) without any rewrite, for the report.

No harness call can end a dialogue: a missing or malformed structured output (or a backend
error on a harness call) falls back — baseline policy, previous state, rule-based context,
unchecked reply with a flag — and is counted in the turn's ``harness_fallbacks``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from spasm.agents import Agent, client_instructions, derive_seed, responder_system_prompt
from spasm.backends.base import ChatRequest, Completion
from spasm.calls import Caller, CallScope
from spasm.config import HarnessConfig, RunConfig
from spasm.errors import BackendError
from spasm.harness.checker import (
    Verdict,
    check_reply,
    checker_messages,
    rewrite_note,
    rule_violations,
    screened_verdict,
)
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
from spasm.harness.policy import (
    CharacterPolicy,
    PolicyBook,
    baseline_client_policy,
    baseline_responder_policy,
    parse_stored_policy,
)
from spasm.harness.probe import PROBE_QUESTION, fact_words, recall
from spasm.harness.prompt import PrefixTracker, TurnBlock, orchestrate, stable_prompt, turn_block
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
from spasm.history import History, Speaker, Utterance
from spasm.projection import Message, Viewer

__all__ = ["AgentHarness", "TurnResult"]

T = TypeVar("T")


@dataclass
class TurnResult:
    """One accepted utterance and everything the turns table records about it."""

    text: str
    completion: Completion
    messages: list[Message]
    attempts: int = 1
    verdict: dict[str, Any] | None = None
    flagged: bool = False
    flag_reason: str | None = None
    state: AgentState | None = None
    reduction: Reduction | None = None
    intent: str | None = None
    fallbacks: int = 0
    cached_prompt_tokens: int = 0
    stored_messages: bool = False


class AgentHarness:
    """The harness around one agent in one dialogue (state is per dialogue, never shared)."""

    def __init__(
        self,
        agent: Agent,
        level: str,
        config: RunConfig,
        persona: dict[str, Any],
        tracker: PrefixTracker,
    ) -> None:
        self.agent = agent
        self.level = level
        self.layers: Layers = layers(level)
        self.hc: HarnessConfig = config.harness
        self.config = config
        self.persona = persona
        self.tracker = tracker
        self.speaker: Speaker = agent.speaker
        self.partner: Speaker = "responder" if agent.speaker == "client" else "client"
        self.role = config.dialogue.responder_role
        self.backend = self.hc.backend or agent.backend
        self.max_utterances = 2 * config.dialogue.max_turns_per_agent
        self.labels: dict[Speaker, str] = {
            "client": "The client" if self.speaker == "responder" else "You",
            "responder": f"The {self.role}" if self.speaker == "client" else "You",
        }
        self.name = (
            str(persona.get("first_name") or "the client") if self.speaker == "client"
            else f"the {self.role}"
        )
        self.needs_policy = self.layers.policy or self.hc.audit or self.layers.verify
        self.policy: CharacterPolicy | None = None
        self.system_prompt = agent.viewer.system_prompt
        self.viewer: Viewer = agent.viewer
        self.state: AgentState | None = None
        if self.layers.state:
            self.state = (
                initial_client_state(persona) if self.speaker == "client"
                else initial_responder_state(self.role)
            )
        # The Client knows what it came about; the Responder learns it from the conversation.
        self.context = StructuredContext(
            topic=str(persona.get("domain") or "") if self.speaker == "client" else ""
        )
        self.intent: Intent | None = (
            classify_intent(f"{persona.get('motivation', '')} {persona.get('concern', '')}")
            if self.speaker == "client" else None
        )
        self.examples: list[Example] = []
        if self.layers.retrieval and self.hc.corpus:
            self.examples = load_corpus(self.hc.corpus, self.speaker)
        self.correction: str | None = None
        self._last_own_index: int | None = None
        self._pending_fallbacks = 0

    # -- set-up ----------------------------------------------------------------------------
    async def setup(self, caller: Caller, scope: CallScope) -> None:
        """Resolve the policy (stored with the persona, else extracted once per run)."""
        if not self.needs_policy:
            return
        if self.speaker == "client":
            stored = parse_stored_policy(self.persona)
            baseline = baseline_client_policy(self.persona, self.role)
            if stored is not None:
                self.policy = stored
            elif not self.hc.extract_policy:
                self.policy = baseline
            else:
                self.policy = await self._policy(
                    caller, scope, ("client", str(self.persona.get("persona_id"))),
                    baseline, str(self.persona["card"]),
                )
        else:
            d = self.config.dialogue
            baseline = baseline_responder_policy(self.role, d.responder_instructions)
            self.policy = baseline if not self.hc.extract_policy else await self._policy(
                caller, scope, ("responder", self.role), baseline,
                responder_system_prompt(self.role, d.responder_instructions),
            )
        if self.layers.policy:
            base = (
                client_instructions(self.role) if self.speaker == "client"
                else self.agent.viewer.system_prompt
            )
            self.system_prompt = stable_prompt(base, self.policy, never_n=self.hc.never_in_prompt)
            self.viewer = Viewer(self.speaker, self.system_prompt)

    async def _policy(
        self, caller: Caller, scope: CallScope, key: tuple[str, ...],
        baseline: CharacterPolicy, description: str,
    ) -> CharacterPolicy:
        n0 = len(scope.records)
        try:
            # The seed depends on what is compiled, not on the dialogue that happens to ask
            # first: concurrent runs must extract the same policy.
            policy, fell_back, _ = await PolicyBook.get(
                caller, self.backend, key, baseline, description, scope,
                temperature=self.hc.temperature, seed=derive_seed("policy", *key),
            )
        except BackendError:
            policy, fell_back = baseline, True
        if fell_back and len(scope.records) > n0:
            self._pending_fallbacks += 1
        return policy

    # -- helpers ---------------------------------------------------------------------------
    async def _tracked(
        self, messages: list[Message], scope: CallScope, call: Awaitable[T], acc: list[float]
    ) -> T:
        """Run a call and add the prompt tokens a prefix cache could serve to ``acc``."""
        share = self.tracker.observe(messages)
        n0 = len(scope.records)
        try:
            return await call
        finally:
            acc[0] += share * sum(r.prompt_tokens for r in scope.records[n0:])

    async def _safe(self, call: Awaitable[T | None]) -> T | None:
        """A harness call whose failure must not end the dialogue (budget stops still do)."""
        try:
            return await call
        except BackendError:
            return None

    def _lines(self, utterances: Sequence[Utterance]) -> str:
        return "\n".join(f"{self.labels[u.speaker]}: {u.content}" for u in utterances)

    def _open_questions(self, history: History) -> list[str]:
        return still_open(self.context.unresolved_questions, history.utterances,
                          self.context.covered, self.speaker)

    async def _fold_context(
        self, history: History, caller: Caller, scope: CallScope, seed: int, acc: list[float]
    ) -> int:
        """Fold utterances that left the window into the record; returns fallbacks."""
        n = len(history)
        if n - self.context.covered < self.hc.window + self.hc.stride:
            return 0
        upto = n - self.hc.window
        utts = history.utterances
        labels: dict[Speaker, str] = dict(self.labels)
        if self.hc.context == "llm":
            msgs = context_messages(self.context, utts[self.context.covered : upto], self.speaker,
                                    labels)
            new = await self._tracked(msgs, scope, self._safe(compress_llm(
                caller, self.backend, self.context, utts, upto, self.speaker, labels, scope,
                temperature=self.hc.temperature, seed=seed,
            )), acc)
            if new is not None:
                self.context = new
                return 0
            self.context = compress_rules(self.context, utts, upto, self.speaker, labels)
            return 1
        self.context = compress_rules(self.context, utts, upto, self.speaker, labels)
        return 0

    def _scene(self, history: History, intent: Intent, previous: Intent | None) -> list[str]:
        scene = [f"This is message {len(history) + 1} of the conversation."]
        if self.context.topic:
            scene.append(f"Topic so far: {self.context.topic}.")
        if self.context.partner_emotion:
            scene.append(f"The other person seemed {self.context.partner_emotion}.")
        scene.append(intent_guidance(self.speaker, intent, previous))
        open_q = self._open_questions(history)
        if open_q:
            scene.append("Still open: " + " | ".join(open_q))
        return scene

    def _query(self, history: History, intent: Intent) -> Query:
        last_partner = next(
            (u.content for u in reversed(history.utterances) if u.speaker == self.partner), ""
        )
        state = self.state or AgentState()
        return Query(
            text=f"{last_partner} {self.context.topic}", intent=intent,
            emotion=dominant_emotion(state), relation=relation_stage(state),
            act=dialogue_act(last_partner) if last_partner else "none",
            scene=scene_of(len(history), self.max_utterances),
        )

    def _checker_who(self) -> str:
        if self.speaker == "client":
            return f"{self.name}, who is talking with a {self.role}"
        return f"a {self.role}"

    async def _check(
        self, history: History, text: str, caller: Caller, scope: CallScope, seed: int,
        role: str, acc: list[float] | None,
    ) -> Verdict | None:
        """Check a candidate. ``acc=None`` (audits) keeps the call out of the cache estimate:
        an audit is a measurement, not part of the design being measured."""
        assert self.policy is not None
        partner = next(
            (u.content for u in reversed(history.utterances) if u.speaker == self.partner), None
        )
        items = salient_items(self.state, self.hc.state_items) if self.state else []
        msgs = checker_messages(self.policy, self._checker_who(), items, partner, text)
        rules = rule_violations(text, self.speaker, self.role)
        if rules:
            # A certain breach: fail it without paying for a model's opinion.
            return screened_verdict(rules)
        call = self._safe(check_reply(
            caller, self.backend, msgs, rules, scope, role=role, temperature=self.hc.temperature,
            max_tokens=self.hc.checker_max_tokens, seed=seed,
            pass_threshold=self.hc.pass_threshold, boundary_floor=self.hc.boundary_floor,
        ))
        if acc is None:
            return await call
        return await self._tracked(msgs, scope, call, acc)

    # -- the prompt ------------------------------------------------------------------------
    def _messages(
        self, history: History, condition: str, block: TurnBlock | None
    ) -> list[Message]:
        if not self.layers.window:
            return self.agent.messages(history, condition)
        covered = self.context.covered
        context = render_context(self.context) if covered else None
        return orchestrate(
            history.utterances[covered:], self.viewer, condition, covered=covered,
            context=context, block=turn_block(block) if block else None,
        )

    # -- one turn --------------------------------------------------------------------------
    async def turn(
        self, history: History, condition: str, caller: Caller, scope: CallScope, seed: int
    ) -> TurnResult:
        """Produce this agent's next accepted utterance."""
        acc = [0.0]
        fallbacks, self._pending_fallbacks = self._pending_fallbacks, 0
        intent: Intent | None = None
        reduction: Reduction | None = None
        block: TurnBlock | None = None
        if self.layers.window:
            fallbacks += await self._fold_context(history, caller, scope, seed, acc)
            last_client = next(
                (u.content for u in reversed(history.utterances) if u.speaker == "client"), ""
            )
            previous = self.intent
            intent = classify_intent(last_client, previous)
            self.intent = intent
            if self.layers.state and self.state is not None:
                start = self._last_own_index if self._last_own_index is not None else 0
                recent = history.utterances[start:]
                if recent:
                    reduction = await self._reduce(recent, caller, scope, seed, acc)
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
        messages = self._messages(history, condition, block)
        text, completion = await self._tracked(
            messages, scope, self.agent.generate(messages, caller, scope, seed), acc
        )
        result = TurnResult(text=text, completion=completion, messages=messages,
                            stored_messages=self.layers.window)
        self.correction = None
        if self.layers.verify:
            await self._verify(result, history, condition, block, caller, scope, seed, acc)
        elif self.hc.audit:
            verdict = await self._check(history, result.text, caller, scope,
                                        derive_seed(seed, "audit"), "audit", None)
            if verdict is None:
                fallbacks += 1
            result.verdict = {"mode": "audit", **(verdict.as_dict() if verdict else
                                                   {"pass": None, "fallback": True})}
        if self.state is not None and result.verdict is not None:
            self.state = self.state.model_copy(update={"control": self.state.control.model_copy(
                update={"violations": result.verdict.get("violations") or [],
                        "correction": result.verdict.get("correction_advice") or ""}
            )})
        result.fallbacks = fallbacks + result.fallbacks
        result.state = self.state
        result.reduction = reduction
        result.intent = intent
        self._remember(history, result.text, intent)
        result.cached_prompt_tokens = round(acc[0])
        return result

    async def _reduce(
        self, recent: Sequence[Utterance], caller: Caller, scope: CallScope, seed: int,
        acc: list[float],
    ) -> Reduction:
        assert self.state is not None
        lines = self._lines(recent)
        msgs = reducer_messages(self.name, self.state, lines)
        reduction = await self._tracked(msgs, scope, self._safe(reduce_state(
            caller, self.backend, self.name, self.state, lines, scope,
            temperature=self.hc.temperature, max_tokens=self.hc.reducer_max_tokens,
            seed=derive_seed(seed, "reducer"),
        )), acc)
        return reduction if reduction is not None else apply_update(self.state, None, lines)

    async def _verify(
        self, result: TurnResult, history: History, condition: str, block: TurnBlock | None,
        caller: Caller, scope: CallScope, seed: int, acc: list[float],
    ) -> None:
        checks: list[dict[str, Any]] = []
        first = await self._check(history, result.text, caller, scope,
                                  derive_seed(seed, "check", 1), "checker", acc)
        if first is None:
            result.fallbacks += 1
            result.flagged, result.flag_reason = True, "checker_unavailable"
            result.verdict = {"mode": "verify", "pass": None, "fallback": True, "checks": [],
                              "rewritten": False}
            return
        checks.append(first.as_dict())
        final = first
        if not first.passed:
            self.correction = first.correction_advice or None
            note = rewrite_note(result.text, first)
            rewrite_block = replace(block, rewrite=note) if block else TurnBlock(rewrite=note)
            messages = self._messages(history, condition, rewrite_block)
            text, completion = await self._tracked(
                messages, scope,
                self.agent.generate(messages, caller, scope, derive_seed(seed, "rewrite"),
                                    role="rewrite"),
                acc,
            )
            result.text, result.completion, result.messages = text, completion, messages
            result.attempts = 2
            second = await self._check(history, text, caller, scope,
                                       derive_seed(seed, "check", 2), "checker", acc)
            if second is None:
                result.fallbacks += 1
                result.flagged, result.flag_reason = True, "checker_unavailable"
            else:
                checks.append(second.as_dict())
                final = second
                if not second.passed:
                    result.flagged, result.flag_reason = True, "failed_twice"
        result.verdict = {
            "mode": "verify",
            **final.as_dict(),
            "pass": final.passed if len(checks) == result.attempts else None,
            "checks": checks,
            "rewritten": result.attempts == 2,
        }

    def _remember(self, history: History, text: str, intent: Intent | None) -> None:
        """Keep the accepted utterance as a future example, with the situation it answered."""
        self._last_own_index = len(history)
        last_partner = next(
            (u.content for u in reversed(history.utterances) if u.speaker == self.partner), ""
        )
        state = self.state or AgentState()
        self.examples.append(
            Example(
                text=text, intent=intent or classify_intent(text),
                emotion=dominant_emotion(state), relation=relation_stage(state),
                act=dialogue_act(last_partner) if last_partner else "none",
                scene=scene_of(len(history), self.max_utterances), index=len(history),
            )
        )

    # -- after the dialogue ----------------------------------------------------------------
    async def probe(
        self, history: History, condition: str, caller: Caller, scope: CallScope, seed: int
    ) -> dict[str, Any] | None:
        """Ask what the partner said first; score the answer in code (see :mod:`.probe`)."""
        first = next(
            ((i, u) for i, u in enumerate(history.utterances) if u.speaker == self.partner), None
        )
        if first is None:
            return None
        index, opening = first
        facts = fact_words(opening.content)
        if self.layers.window:
            # Bring the record up to date as a next turn would (rules only: no model call).
            n = len(history)
            if n - self.context.covered >= self.hc.window + self.hc.stride:
                self.context = compress_rules(self.context, history.utterances,
                                              n - self.hc.window, self.speaker, dict(self.labels))
        block = TurnBlock(
            state_items=tuple(salient_items(self.state, self.hc.state_items)) if self.state else ()
        ) if self.layers.window else None
        messages = self._messages(history, condition, block)
        messages.append({"role": "system", "content": PROBE_QUESTION})
        try:
            request = ChatRequest(messages=tuple(messages), temperature=0.0, max_tokens=60,
                                  seed=derive_seed(seed, "probe", self.speaker))
            completion = await caller.complete("probe", self.backend, request, scope)
            answer = completion.text.strip()
        except BackendError as exc:
            return {"opening_index": index, "facts": facts, "answer": None,
                    "recall": None, "error": type(exc).__name__}
        return {
            "opening_index": index,
            "in_window": index >= self.context.covered,
            "facts": facts,
            "answer": answer,
            "recall": recall(facts, answer),
        }
