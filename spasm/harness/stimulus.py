"""Whether the latest messages could move an agent's state: decided in code, before any call.

The reducer (:mod:`spasm.harness.state`) is asked for an update after every own turn. Most
turns of a long dialogue carry nothing that moves an emotion, the relation or the goal, and
then the model's answer is "no stimulus" — the hard constraints apply the decay in code anyway.
:func:`needs_reducer` screens the latest messages for any cue that could justify a change
(affect and relation words, goal and outcome words, exclamations, insults, thanks, apologies,
questions about feelings, and any word of the agent's own goals and beliefs); only when it
finds one is the reducer model called. Otherwise the turn's reduction is :func:`no_stimulus`:
exactly what the constraints make of an update that reports no stimulus (extreme values decay
toward 50, nothing else moves), without a call.

The screen errs towards calling: a cue word anywhere (as a word prefix, so ``worr`` catches
worried and worrying) is enough. The reducer's evidence rule makes the model quote the latest
messages for any change over 10, so a message without such words could only justify small
unquoted changes, which the screen gives up.
"""

from __future__ import annotations

import re

from spasm.harness.state import AgentState, Reduction, StateUpdate, apply_update

__all__ = ["CUES", "goal_words", "needs_reducer", "no_stimulus"]

#: Word prefixes that signal affect, relation or goal movement (lower case).
CUES: tuple[str, ...] = (
    # joy, trust, relief, gratitude
    "happy", "glad", "great", "wonderful", "awesome", "amazing", "love", "lovely", "delight",
    "relie", "thank", "appreciat", "grateful", "pleas", "excit", "hope", "trust", "reliab",
    "perfect", "excellent", "fantastic", "brilliant", "nice", "kind", "fair",
    # sadness, fear, surprise
    "sad", "unhappy", "upset", "disappoint", "depress", "lonely", "cry", "tear", "miss", "loss",
    "lost", "worr", "afraid", "scare", "fear", "anxi", "nervous", "panic", "stress", "overwhelm",
    "terrif", "concern", "unsure", "confus", "surpris", "shock", "unexpect", "sudden", "wow",
    # anger, disgust, impatience
    "angry", "anger", "mad", "furious", "annoy", "frustrat", "irritat", "ridiculous", "absurd",
    "unaccept", "outrage", "disgust", "hate", "terrible", "awful", "horrible", "worst", "useless",
    "stupid", "idiot", "rude", "insult", "lie", "lying", "liar", "cheat", "scam", "complain",
    "impatien", "enough", "again", "still", "never", "always", "wrong", "fault", "blame",
    "fed up", "sick of", "tired", "exhaust", "bored", "hurt", "broke", "damag", "fail",
    # relation, politeness, stance
    "sorry", "apolog", "forgive", "friend", "rude", "respect", "listen", "understand", "care",
    "promise", "honest", "believe", "doubt", "suspic", "sure", "maybe", "please",
    # goal and outcome
    "resolv", "solv", "fix", "sorted", "done", "finish", "refund", "cancel", "replac", "escalat",
    "manager", "supervisor", "deadline", "urgent", "immediately", "asap", "today", "now",
    "agree", "deal", "accept", "refus", "decline", "reject", "help", "progress", "works", "work",
    "bye", "goodbye", "leave", "quit",
    # feelings asked or stated
    "feel", "felt", "mood", "emotion",
)

_CUE = re.compile(r"\b(?:" + "|".join(sorted(set(CUES), key=len, reverse=True)) + r")", re.I)
_MARKS = re.compile(r"!|\?\?|\b[A-Z]{3,}\b")


_WORD = re.compile(r"[a-z][a-z']{4,}")


def goal_words(state: AgentState) -> set[str]:
    """Content words (5+ letters) of the agent's goals and beliefs: a message that names one
    may move goal progress or a belief, whatever its tone."""
    texts = [g.description for g in state.goals] + [b.content for b in state.beliefs]
    return {w for t in texts for w in _WORD.findall(t.lower())}


def needs_reducer(recent_lines: str, state: AgentState | None = None) -> bool:
    """Whether the latest messages hold any cue that could move the state (with ``state``,
    a word of its goals or beliefs counts too)."""
    if _CUE.search(recent_lines) or _MARKS.search(recent_lines):
        return True
    if state is None:
        return False
    words = set(_WORD.findall(recent_lines.lower()))
    return bool(words & goal_words(state))


def no_stimulus(previous: AgentState, recent_lines: str) -> Reduction:
    """The reduction of a turn with nothing that touches the state: the constraints applied to
    an update with no stimulus and no changes (extreme values decay; no model call)."""
    return apply_update(previous, StateUpdate(stimulus=False), recent_lines)
