"""A cheap long-range fact-recall probe: a fact stated early, asked about late.

The fact is what the *partner* said in its first message (for the Responder: the Client's
opening, which states why it came; for the Client: the Responder's first reply). After the
dialogue, each agent gets the prompt it would see for its next turn plus one question (role
``probe``, temperature 0) and its answer is scored in code: the share of the opening's content
words (up to :data:`MAX_FACT_WORDS`, matched on a 5-letter stem) that the answer contains.
No judge model, one short call per agent per dialogue. At level A the opening is still in the
prompt verbatim; from level B on it has usually left the window, so the probe measures what the
structured record kept. The probe is run from outside the agent, after the dialogue, by
:func:`spasm.harness.measure.recall_probe`.
"""

from __future__ import annotations

from spasm.harness.context import content_words

__all__ = ["MAX_FACT_WORDS", "PROBE_QUESTION", "fact_words", "recall"]

MAX_FACT_WORDS = 8
PROBE_QUESTION = (
    "Pause the conversation for a moment. From memory, in one short sentence: what did the "
    "other person say in their very first message? Answer only that."
)


def fact_words(opening: str) -> list[str]:
    """The words a recall answer should contain: the opening's first content words."""
    return content_words(opening)[:MAX_FACT_WORDS]


def _stem(word: str) -> str:
    return word[:5]


def recall(facts: list[str], answer: str) -> float | None:
    """Share of ``facts`` found in ``answer`` (stem match); ``None`` when there is no fact."""
    if not facts:
        return None
    said = {_stem(w) for w in content_words(answer)}
    return round(sum(_stem(f) in said for f in facts) / len(facts), 4)
