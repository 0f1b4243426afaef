"""Long-range fact-recall probes: facts stated early (or at set depths), asked about late.

After the dialogue each agent is asked what its *partner* said at a few positions of the
dialogue (``harness.probe_depths``, fractions of its length: ``0`` is the partner's first
message — for the Responder the Client's opening, which says why it came — ``0.5`` the partner's
first message at or after the middle). Each probe is one short call (role ``probe``,
temperature 0) on the prompt the agent would see for its next turn plus one question; the
answer is scored in code: the share of the probed message's content words (up to
:data:`MAX_FACT_WORDS`, matched on a 5-letter stem) that the answer contains. No judge model.
At level A every probed message is still in the prompt verbatim; from level B on the early ones
have left the window, so the probe measures what the structured record kept.

**How a message is named in the question.** Quoting its first words would hand the answer to
the model, so a message is named by its place among the partner's messages: "their very first
message" (the depth-0 question is :data:`PROBE_QUESTION`, the one a single probe asks),
else "their message number *k* of the *m* they have sent so far (*m − k* before their
latest)". Both anchors are given because a model counts more reliably from the nearer end, and
both can be read off its prompt: at level A the partner's messages are all there in order; from
level B on only the last ``window`` are, and an older one has to come from the record.

Stored on each speaker's last turn (``turns.probe``) as ``{"probes": [...]}``, one
:class:`~spasm.dataset.columns.Probe` per probed message: ``depth``, ``index`` (of the
utterance), ``partner_message`` (its place among the partner's), ``distance`` (utterances said
after it), ``in_window`` (still verbatim in the agent's prompt), ``facts``, ``answer``,
``recall`` (and ``error`` when the call failed). An older run's column may hold one probe as a
dict (``opening_index``, ``in_window``, ``facts``, ``answer``, ``recall``);
:func:`~spasm.dataset.columns.load_probes` reads either and
:func:`~spasm.dataset.columns.dump_probes` writes the column. The probes are run from outside
the agent by :func:`spasm.harness.measure.recall_probes`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from spasm.harness.context import content_words

__all__ = [
    "MAX_FACT_WORDS", "PROBE_QUESTION", "ProbeTarget", "fact_words", "probe_question",
    "probe_targets", "recall",
]

MAX_FACT_WORDS = 8
PROBE_QUESTION = (
    "Pause the conversation for a moment. From memory, in one short sentence: what did the "
    "other person say in their very first message? Answer only that."
)
_NTH_QUESTION = (
    "Pause the conversation for a moment. From memory, in one short sentence: what did the "
    "other person say in their message number {k} of the {m} they have sent so far ({where})? "
    "Answer only that."
)


@dataclass(frozen=True)
class ProbeTarget:
    """One partner message to ask about."""

    #: The configured depth (fraction of the dialogue) that chose it.
    depth: float
    #: Its index in the history (0 = the dialogue's first utterance).
    index: int
    #: Its place among the partner's messages, 1 = the first.
    ordinal: int
    #: How many messages the partner has sent in all.
    of: int


def probe_targets(speakers: Sequence[str], partner: str, depths: Sequence[float]) -> list[ProbeTarget]:
    """The partner messages the probes ask about, one per distinct message.

    A depth ``d`` picks the partner's first message at or after utterance ``floor(d * n)`` of
    the ``n`` in the dialogue (its last message when none is that late). Depths that pick the
    same message (a short dialogue) are asked once, under the first of them.
    """
    theirs = [i for i, s in enumerate(speakers) if s == partner]
    if not theirs:
        return []
    out: list[ProbeTarget] = []
    for depth in depths:
        start = math.floor(depth * len(speakers))
        index = next((i for i in theirs if i >= start), theirs[-1])
        if all(t.index != index for t in out):
            out.append(ProbeTarget(depth, index, theirs.index(index) + 1, len(theirs)))
    return out


def probe_question(target: ProbeTarget) -> str:
    """The question for ``target``: its place among the partner's messages, never its words."""
    if target.ordinal == 1:
        return PROBE_QUESTION
    back = target.of - target.ordinal
    where = "their latest" if back == 0 else f"{back} before their latest"
    return _NTH_QUESTION.format(k=target.ordinal, m=target.of, where=where)


def fact_words(opening: str) -> list[str]:
    """The words a recall answer should contain: the message's first content words."""
    return content_words(opening)[:MAX_FACT_WORDS]


def _stem(word: str) -> str:
    return word[:5]


def recall(facts: list[str], answer: str) -> float | None:
    """Share of ``facts`` found in ``answer`` (stem match); ``None`` when there is no fact."""
    if not facts:
        return None
    said = {_stem(w) for w in content_words(answer)}
    return round(sum(_stem(f) in said for f in facts) / len(facts), 4)
