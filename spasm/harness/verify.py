"""Layer 6 at run time: check a candidate reply, rewrite it once on failure (docs/harness.md, "The layers").

:func:`check_candidate` is shared by the verify layer (role ``checker``, inside the agent) and
the audit (role ``audit``, a measurement outside it: :mod:`spasm.harness.measure`).
:func:`verify` is the loop: check the draft; on failure rewrite once with the advice and check
again; a second failure is accepted and flagged; a checker that never answers leaves the reply
accepted unchecked and flagged ``checker_unavailable``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spasm.agents import Draft
from spasm.dataset.columns import CheckerVerdict
from spasm.errors import BackendError
from spasm.harness.checker import (
    Verdict,
    check_reply,
    checker_messages,
    review_messages,
    rewrite_note,
    rule_violations,
    screened_verdict,
)
from spasm.harness.profile import Profile
from spasm.harness.state import AgentState, StateUpdate, salient_items
from spasm.history import History

if TYPE_CHECKING:
    from spasm.calls import Structured
    from spasm.config import HarnessConfig
    from spasm.harness.policy import CharacterPolicy
    from spasm.session import DialogueSession, TurnMeter

__all__ = ["Verified", "check_candidate", "verify", "with_verdict"]


async def check_candidate(
    profile: Profile,
    policy: CharacterPolicy,
    state: AgentState | None,
    history: History,
    text: str,
    session: DialogueSession,
    hc: HarnessConfig,
    *,
    seed: int,
    role: str,
    meter: TurnMeter | None,
    review: bool = False,
) -> Verdict | None:
    """Check a candidate; ``None`` when the checker never gives a usable answer.

    ``meter=None`` (audits) keeps the call out of the cache estimate: an audit is a
    measurement, not part of the design being measured. ``review`` (with a state): the same
    call proposes the state update (``harness.review: merged``).
    """
    partner = profile.last_partner(history)
    review = review and state is not None
    if review and state is not None:
        msgs = review_messages(policy, profile.checker_who, profile.name, state, partner, text)
    else:
        items = salient_items(state, hc.state_items) if state else []
        msgs = checker_messages(policy, profile.checker_who, items, partner, text)
    rules = rule_violations(text, profile.seat, profile.role)
    if rules:
        # A certain breach: fail it without paying for a model's opinion.
        return screened_verdict(rules)

    async def call() -> Structured[Verdict | None] | None:
        try:
            return await check_reply(
                session.caller, profile.backend, msgs, rules, session.scope, role=role,
                temperature=hc.temperature, seed=seed,
                # A merged reply holds the reducer's too: the caps add up.
                max_tokens=hc.checker_max_tokens + (hc.reducer_max_tokens if review else 0),
                pass_threshold=hc.pass_threshold, boundary_floor=hc.boundary_floor, review=review,
            )
        except BackendError:  # a harness call must not end the dialogue (budget stops still do)
            return None

    if meter is None:
        result = await call()
        return result.value if result is not None else None
    return meter.count(msgs, await call())


def with_verdict(state: AgentState, verdict: dict[str, Any]) -> AgentState:
    """The state with a verdict's violations and advice in its control fields."""
    return state.model_copy(update={"control": state.control.model_copy(
        update={"violations": verdict.get("violations") or [],
                "correction": verdict.get("correction_advice") or ""}
    )})


@dataclass(frozen=True)
class Verified:
    """The accepted draft of a verified turn and what the checks said."""

    draft: Draft
    #: Generation calls behind the accepted text: 1, or 2 after a rewrite.
    attempts: int
    #: The :class:`~spasm.dataset.columns.CheckerVerdict` as a plain record (the turn carries
    #: it so; :func:`~spasm.dataset.columns.dump_verdict` stores it).
    verdict: dict[str, Any]
    flagged: bool = False
    flag_reason: str | None = None
    fallbacks: int = 0
    #: The advice of a failed first check, shown at the agent's next turn.
    correction: str | None = None
    #: A merged review's state update for the accepted text (``None``: no model reviewed it).
    update: StateUpdate | None = None


#: ``check(text, n)`` runs the ``n``-th check of a turn; ``redraft(note)`` writes the rewrite.
Check = Callable[[str, int], Awaitable[Verdict | None]]
Redraft = Callable[[str], Awaitable[Draft]]


async def verify(draft: Draft, check: Check, redraft: Redraft) -> Verified:
    """Check ``draft``; on failure rewrite it once with the advice and check the rewrite."""
    first = await check(draft.text, 1)
    if first is None:
        unchecked = CheckerVerdict.of("verify", None, passed=None, checks=[], rewritten=False)
        return Verified(
            draft, 1, unchecked.record(),
            flagged=True, flag_reason="checker_unavailable", fallbacks=1,
        )
    checks = [first.check()]
    final, attempts, fallbacks = first, 1, 0
    update = first.update
    flag_reason: str | None = None
    correction: str | None = None
    if not first.passed:
        correction = first.correction_advice or None
        draft = await redraft(rewrite_note(draft.text, first))
        attempts = 2
        second = await check(draft.text, 2)
        update = second.update if second is not None else None
        if second is None:
            fallbacks, flag_reason = 1, "checker_unavailable"
        else:
            checks.append(second.check())
            final = second
            if not second.passed:
                flag_reason = "failed_twice"
    verdict = CheckerVerdict.of(
        "verify", final.check(), passed=final.passed if len(checks) == attempts else None,
        checks=checks, rewritten=attempts == 2,
    )
    return Verified(draft, attempts, verdict.record(), flag_reason is not None, flag_reason,
                    fallbacks, correction, update)
