"""The echoing judge: an LLM reads each conversation with a written rubric.

One structured call per conversation (role ``eval_judge``) through the engine's
:class:`~spasm.calls.Caller`, answering ``{echoing, who, evidence}``. A reply that never
validates (after one re-ask with the error) or a failed call falls back to the rule's verdict
(:func:`spasm.evaluation.echoing.rule_echoing`) and is counted as a fallback.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import anyio
from pydantic import BaseModel, ConfigDict, Field, model_validator

from spasm.backends.base import Message
from spasm.evaluation.echoing import EchoVerdict, Who, quote
from spasm.evaluation.llm import JUDGE_ROLE, EvalSession
from spasm.evaluation.loader import Conversation

__all__ = ["JUDGE_RUBRIC", "JudgeVerdict", "judge_echoing"]


class JudgeVerdict(BaseModel):
    """The judge's structured answer."""

    model_config = ConfigDict(extra="ignore")

    echoing: bool
    who: Who
    evidence: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> JudgeVerdict:
        if self.echoing and self.who == "none":
            raise ValueError('"echoing" is true, so "who" must be "client" or "responder"')
        if not self.echoing and self.who != "none":
            raise ValueError('"echoing" is false, so "who" must be "none"')
        return self


JUDGE_RUBRIC = """You audit a simulated conversation between a CLIENT (a simulated person \
with their own problem, feelings and goals, who came for help) and a RESPONDER (the helper: agent, \
counsellor, tutor). Decide whether ECHOING happened: one side abandoned its own role and \
began to mirror the other.

Echoing by the client — any of these, sustained or blatant:
- the client gives the advice, instructions, steps or reassurance instead of seeking them;
- the client talks like a service agent ("How can I help you?", "Is there anything else I can \
help with?", "I understand your concern");
- the client repeats or paraphrases the responder's advice back as its own content, in the \
responder's phrasing, instead of reacting to it as the person with the problem.
Echoing by the responder — it starts describing the client's problem as its own, asks the \
client for help, or copies the client's messages.

Not echoing: briefly quoting the other side to ask about it, agreeing, thanking, summarising \
what was agreed before ending, or a frustrated client telling the responder what they should do.

Reply with only a JSON object:
{"echoing": true|false, "who": "client"|"responder"|"none",
 "evidence": ["short verbatim quote", ...]}
"who" is "none" exactly when "echoing" is false. Give at most 3 quotes, copied from the \
conversation."""


def _judge_messages(conv: Conversation) -> list[Message]:
    lines = [
        f"[{i}] {'CLIENT' if s == 'client' else 'RESPONDER'}: {t}"
        for i, (s, t) in enumerate(zip(conv.speakers, conv.texts, strict=True))
    ]
    return [
        {"role": "system", "content": JUDGE_RUBRIC},
        {"role": "user", "content": "Conversation:\n\n" + "\n\n".join(lines)},
    ]


async def judge_echoing(
    conversations: Sequence[Conversation],
    rule_verdicts: dict[str, EchoVerdict],
    llm: EvalSession,
    *,
    concurrency: int = 8,
    on_done: Callable[[int], None] | None = None,
) -> tuple[dict[str, EchoVerdict], int, int]:
    """LLM-judge verdicts, falling back to ``rule_verdicts`` where the judge gives none.

    Returns:
        ``(verdicts by dialogue_id, calls, fallbacks)``; ``calls`` counts every request
        (re-asks, retries and cache hits too).
    """
    limiter = anyio.CapacityLimiter(concurrency)
    out: dict[str, EchoVerdict] = {}
    fallbacks = 0

    async def judge_one(conv: Conversation) -> None:
        nonlocal fallbacks
        async with limiter:
            parsed = await llm.structured(JUDGE_ROLE, conv.dialogue_id, _judge_messages(conv), JudgeVerdict)
        rule = rule_verdicts[conv.dialogue_id]
        if parsed is None:
            fallbacks += 1
            out[conv.dialogue_id] = rule
        else:
            out[conv.dialogue_id] = EchoVerdict(
                dialogue_id=conv.dialogue_id,
                echoing=parsed.echoing,
                who=parsed.who,
                score=1.0 if parsed.echoing else 0.0,
                client_score=rule.client_score,
                responder_score=rule.responder_score,
                evidence=[quote(e) for e in parsed.evidence[:3]],
                method="judge",
                turns=rule.turns,
            )
        if on_done is not None:
            on_done(1)

    async with anyio.create_task_group() as tg:
        for conv in conversations:
            tg.start_soon(judge_one, conv)
    # In the conversations' order, not the replies': the report's examples are taken from
    # this order, so ties between equal scores do not depend on which reply came first.
    return {c.dialogue_id: out[c.dialogue_id] for c in conversations}, llm.calls(JUDGE_ROLE), fallbacks
