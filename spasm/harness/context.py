"""Layer 3, structured context: older turns compressed into a typed record (docs/harness.md, "The layers").

From level B on, an agent sees the last ``window`` utterances verbatim and everything older as
a :class:`StructuredContext` (topic, the partner's emotion, people mentioned, key events,
unresolved questions). The record is updated in steps of ``stride`` utterances, not at every
turn: between updates the messages an agent sees only grow at the end, so a provider's prompt
cache keeps hitting on everything before them.

Compression runs in code by default (``context: rules``: extractive and free); with
``context: llm`` a structured call (role ``context``) rewrites the record and the rules are the
fallback when its output is unusable. The current *intent* (small talk, venting, advice-seeking,
task) and each utterance's *dialogue act* are classified by keyword rules at every turn, so the
prompt can adapt the moment the intent switches without a model call.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from spasm.harness._types import Lines3, Lines5, Record, Reply, Short, Shorts6
from spasm.history import Speaker, Utterance

if TYPE_CHECKING:
    from spasm.backends.base import Message
    from spasm.calls import Caller, CallScope, Structured

__all__ = [
    "INTENTS",
    "Intent",
    "StructuredContext",
    "answered",
    "classify_intent",
    "compress_rules",
    "content_words",
    "dialogue_act",
    "intent_guidance",
    "render_context",
    "still_open",
]

Intent = Literal["small_talk", "venting", "advice_seeking", "task"]
INTENTS: tuple[Intent, ...] = ("small_talk", "venting", "advice_seeking", "task")
Act = Literal["greeting", "closing", "question", "request", "complaint", "statement"]


class StructuredContext(Record):
    """What happened before the verbatim window, as one agent needs to know it."""

    topic: Short = ""
    partner_emotion: Short = ""
    people: Shorts6 = Field(default_factory=list)
    key_events: Lines5 = Field(default_factory=list)
    unresolved_questions: Lines3 = Field(default_factory=list)
    #: Utterances folded into this record (the verbatim window starts here).
    covered: int = 0

    def is_empty(self) -> bool:
        """Whether nothing has been folded in yet."""
        return self.covered == 0


class ContextUpdate(Reply):
    """What the ``context`` model call returns (the record minus our bookkeeping)."""

    topic: Short = ""
    partner_emotion: Short = ""
    people: Shorts6 = Field(default_factory=list)
    key_events: Lines5 = Field(default_factory=list)
    unresolved_questions: Lines3 = Field(default_factory=list)


STOPWORDS = frozenset(
    [
        "a", "about", "above", "after", "again", "against", "all", "am", "an", "and", "any", "are",
        "aren't", "as", "at", "be", "because", "been", "before", "being", "below", "between", "both",
        "but", "by", "can", "can't", "cannot", "could", "couldn't", "did", "didn't", "do", "does",
        "doesn't", "doing", "don't", "down", "during", "each", "few", "for", "from", "further", "had",
        "hadn't", "has", "hasn't", "have", "haven't", "having", "he", "he'd", "he'll", "he's", "her",
        "here", "here's", "hers", "herself", "him", "himself", "his", "how", "how's", "i", "i'd",
        "i'll", "i'm", "i've", "if", "in", "into", "is", "isn't", "it", "it's", "its", "itself", "just",
        "let's", "me", "more", "most", "mustn't", "my", "myself", "no", "nor", "not", "now", "of",
        "off", "on", "once", "only", "or", "other", "ought", "our", "ours", "ourselves", "out", "over",
        "own", "really", "same", "shan't", "she", "she'd", "she'll", "she's", "should", "shouldn't",
        "so", "some", "such", "than", "that", "that's", "the", "their", "theirs", "them", "themselves",
        "then", "there", "there's", "these", "they", "they'd", "they'll", "they're", "they've", "this",
        "those", "through", "to", "too", "under", "until", "up", "very", "was", "wasn't", "we", "we'd",
        "we'll", "we're", "we've", "were", "weren't", "what", "what's", "when", "when's", "where",
        "where's", "which", "while", "who", "who's", "whom", "why", "why's", "will", "with", "won't",
        "would", "wouldn't", "you", "you'd", "you'll", "you're", "you've", "your", "yours", "yourself",
        "yourselves", "also", "get", "got", "like", "know", "think", "want", "need", "one", "thing",
        "things", "sure", "okay", "yes", "yeah", "well", "maybe", "something", "anything", "much",
        "many", "lot", "right", "going", "help", "thank", "thanks", "please", "hello", "hi", "since",
        "still", "even", "ever", "every", "back", "said", "tell", "told",
    ]
)
_WORD = re.compile(r"[A-Za-z][A-Za-z'-]+")
_SENTENCE = re.compile(r"[^.!?]*[.!?]|[^.!?]+$")


def content_words(text: str) -> list[str]:
    """Lower-cased words of four letters or more that carry content, in order, unique."""
    seen: dict[str, None] = {}
    for w in _WORD.findall(text.lower()):
        w = w.strip("'-")
        if len(w) >= 4 and w not in STOPWORDS:
            seen.setdefault(w, None)
    return list(seen)


def _has(text: str, words: Sequence[str]) -> int:
    return sum(1 for w in words if re.search(rf"\b{w}", text))


_VENT = ("frustrat", "upset", "angry", "annoy", "tired", "exhaust", "stress", "worr", "anxious",
         "scared", "afraid", "overwhelm", "sad", "hate", "fed up", "can't believe", "ridiculous",
         "unfair", "awful", "terrible", "lonely", "hurt", "cry", "miserable", "nervous")
_ADVICE = ("should i", "what should", "what can i", "how do i", "how can i", "any advice",
           "recommend", "suggest", "what would you", "is it worth", "do you think", "whether",
           "which is better", "advice", "what are my options", "is it normal")
_TASK = ("refund", "order", "cancel", "book", "appointment", "schedule", "account", "replace",
         "repair", "return", "form", "claim", "invoice", "payment", "password", "deliver",
         "warranty", "contract", "bill", "fix", "send", "process", "reference")
_SMALL = ("hi", "hello", "hey", "good morning", "good afternoon", "thanks", "thank you", "bye",
          "goodbye", "how are you", "nice to", "have a good", "take care")


def classify_intent(text: str, previous: Intent | None = None) -> Intent:
    """The intent an utterance expresses, by keyword rules; ties and silence keep ``previous``.

    Keyword rules are crude, but they cost nothing per turn and never fail; an intent switch
    only changes the prompt's guidance, never the history.
    """
    t = text.lower()
    scores: dict[Intent, float] = {
        "venting": _has(t, _VENT) + 0.5 * t.count("!"),
        "advice_seeking": float(_has(t, _ADVICE)) + (0.5 if "?" in t else 0.0),
        "task": float(_has(t, _TASK)) + (0.5 if re.search(r"\d", t) else 0.0),
        "small_talk": float(_has(t, _SMALL)) + (0.5 if len(t.split()) <= 6 else 0.0),
    }
    best = max(scores.values())
    if best < 1:
        # Only weak cues (a "?", a digit, a short line): keep the intent we had.
        if previous is not None:
            return previous
        return "small_talk" if best == 0 else max(scores, key=scores.__getitem__)
    top = [i for i in INTENTS if scores[i] == best]
    if previous in top:
        return previous
    # Substance beats pleasantries when both appear ("Hi, I need a refund").
    for intent in ("task", "advice_seeking", "venting", "small_talk"):
        if intent in top:
            return intent
    return top[0]  # pragma: no cover


def dialogue_act(text: str) -> Act:
    """The dialogue act of an utterance, by rules."""
    t = text.lower().strip()
    if re.search(r"\b(bye|goodbye|have a (good|nice|great)|take care)\b", t) or (
        re.search(r"\bthank", t) and len(t.split()) <= 12
    ):
        return "closing"
    if re.match(r"^(hi|hello|hey|good (morning|afternoon|evening))\b", t) and len(t.split()) <= 12:
        return "greeting"
    if "?" in t:
        return "question"
    if re.search(r"\b(please|can you|could you|would you|i need|i want|i'd like)\b", t):
        return "request"
    if _has(t, _VENT):
        return "complaint"
    return "statement"


_GUIDANCE: dict[str, dict[Intent, str]] = {
    "client": {
        "small_talk": "Keep it light and brief.",
        "venting": "Say how you feel; you do not need solutions yet.",
        "advice_seeking": "Ask about your concern and react honestly to what they suggest.",
        "task": "Give the details needed to get it done and check what happens next.",
    },
    "responder": {
        "small_talk": "Be brief and friendly.",
        "venting": "Acknowledge their feelings before offering any solution.",
        "advice_seeking": "Offer concrete, relevant options and ask what fits them.",
        "task": "Confirm the details you need and say clearly what happens next.",
    },
}


def intent_guidance(speaker: Speaker, intent: Intent, previous: Intent | None) -> str:
    """The scene line for the current intent; it says so explicitly when the intent switched."""
    label = intent.replace("_", " ")
    text = _GUIDANCE[speaker][intent]
    if previous is not None and previous != intent:
        return (f"The conversation has shifted from {previous.replace('_', ' ')} to {label}: "
                f"adapt. {text}")
    return f"Current intent: {label}. {text}"


_EMOTION_WORDS = ("frustrated", "angry", "upset", "worried", "anxious", "scared", "sad",
                  "confused", "happy", "glad", "relieved", "grateful", "annoyed", "impatient",
                  "overwhelmed", "hopeful", "disappointed", "embarrassed", "nervous", "calm")
_NOT_NAMES = frozenset(
    [
        "I", "I'm", "I'll", "I've", "I'd", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday",
        "Saturday", "Sunday", "January", "February", "March", "April", "May", "June", "July", "August",
        "September", "October", "November", "December", "OK", "Okay", "Hi", "Hello", "Thanks", "Thank",
        "Yes", "No", "Sorry", "Please", "Dear",
    ]
)


def _first_sentence(text: str, limit: int = 110) -> str:
    m = _SENTENCE.search(text.strip())
    s = (m.group(0) if m else text).strip()
    return s if len(s) <= limit else s[: limit - 1].rstrip() + "…"


_DEFER = re.compile(
    r"\b(let me (check|see|look)|i('ll| will) (check|look|find out|get back)|one moment|"
    r"not sure|i don't know|hold on|give me a (moment|second))\b",
    re.I,
)


def _questions(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE.findall(text) if s.strip().endswith("?")]


def answered(question: str, replies: Sequence[str], *, first_is_immediate: bool = True) -> bool:
    """Whether the other side's ``replies`` (in order) answered ``question``.

    The immediate reply answers unless it only asks back or defers ("Let me check. When did
    you buy it?"); any reply answers when it shares 40% of the question's content words.
    """
    if not replies:
        return False
    if first_is_immediate:
        reply = replies[0].strip()
        statements = [x for x in _SENTENCE.findall(reply) if x.strip() and "?" not in x]
        if statements and not _DEFER.search(reply):
            return True
    words = set(content_words(question))
    if not words:
        return False
    return any(len(words & set(content_words(t))) >= max(1, len(words) * 0.4) for t in replies)


def split_question(item: str) -> tuple[str, str]:
    """``"(you asked) Why?"`` → ``("you", "Why?")``."""
    who, _, q = item.partition(") ")
    return who.lstrip("("), q or item


def still_open(
    items: Sequence[str], history: Sequence[Utterance], since: int, viewer: Speaker
) -> list[str]:
    """The recorded open questions the other side has not answered since ``since``."""
    out = []
    for item in items:
        who, q = split_question(item)
        asker = viewer if who == "you" else None
        replies = [
            u.content for u in history[since:]
            if (u.speaker != viewer if asker is not None else u.speaker == viewer)
        ]
        if not answered(q, replies, first_is_immediate=False):
            out.append(item)
    return out


def compress_rules(
    previous: StructuredContext,
    history: Sequence[Utterance],
    upto: int,
    viewer: Speaker,
    labels: dict[Speaker, str],
) -> StructuredContext:
    """Fold ``history[previous.covered:upto]`` into the record, extractively.

    Key events keep the first two (the opening says why the conversation exists, which a
    long-range recall probe asks about) and the latest three. A question counts as
    unresolved until the other side's later messages share enough of its content words.
    """
    new = history[previous.covered : upto]
    if not new:
        return previous
    events = [*previous.key_events]
    for u in new:
        who = "You" if u.speaker == viewer else labels[u.speaker]
        events.append(f"{who}: {_first_sentence(u.content)}")
    if len(events) > 5:
        events = events[:2] + events[-3:]
    counts: Counter[str] = Counter()
    for u in history[:upto]:
        counts.update(content_words(u.content))
    topic = previous.topic or ", ".join(w for w, _ in counts.most_common(3))
    partner_emotion = previous.partner_emotion
    people = list(previous.people)
    for u in new:
        low = u.content.lower()
        if u.speaker != viewer:
            found = [w for w in _EMOTION_WORDS if w in low]
            if found:
                partner_emotion = found[-1]
        for sentence in _SENTENCE.findall(u.content):
            # The first word of a sentence is capitalised anyway; later capitals are names.
            for name in re.findall(r"\b[A-Z][a-z]+\b", " ".join(sentence.split()[1:])):
                if name not in _NOT_NAMES and name not in people:
                    people.append(name)
    # Open questions: earlier ones still open, plus new ones the other side did not answer.
    open_q = still_open(previous.unresolved_questions, history, previous.covered, viewer)
    for i, u in enumerate(new, start=previous.covered):
        for q in _questions(u.content):
            who = "you" if u.speaker == viewer else "they"
            replies = [v.content for v in history[i + 1 :] if v.speaker != u.speaker]
            if not answered(q, replies):
                open_q.append(f"({who} asked) {q}")
    open_q = open_q[-3:]
    return StructuredContext(
        topic=topic, partner_emotion=partner_emotion, people=people[-6:], key_events=events,
        unresolved_questions=open_q, covered=upto,
    )


def render_context(ctx: StructuredContext) -> str:
    """The record as the context message an agent sees before the verbatim window."""
    lines = [f"Earlier in this conversation ({ctx.covered} older messages, summarised):"]
    if ctx.topic:
        lines.append(f"Topic: {ctx.topic}")
    if ctx.people:
        lines.append(f"People mentioned: {', '.join(ctx.people)}")
    if ctx.key_events:
        lines.append("What was said:")
        lines.extend(f"- {e}" for e in ctx.key_events)
    return "\n".join(lines)


def context_messages(
    previous: StructuredContext, new: Sequence[Utterance], viewer: Speaker,
    labels: dict[Speaker, str],
) -> list[Message]:
    """The ``context`` call's prompt: the current record plus the messages to fold in."""
    transcript = "\n".join(
        f"{'You' if u.speaker == viewer else labels[u.speaker]}: {u.content}" for u in new
    )
    record = previous.model_dump(exclude={"covered"}) if not previous.is_empty() else "(empty)"
    return [
        {
            "role": "system",
            "content": "You keep a short structured record of a conversation for one of its "
            "participants (\"You\"). Update the record with the new messages: topic, the other "
            "person's emotion, people mentioned, key events (keep the first ones, which say why "
            "the conversation started), unresolved questions. Reply with JSON only.",
        },
        {"role": "user", "content": f"Record so far: {record}\n\nNew messages:\n{transcript}"},
    ]


async def compress_llm(
    caller: Caller,
    backend: str,
    previous: StructuredContext,
    history: Sequence[Utterance],
    upto: int,
    viewer: Speaker,
    labels: dict[Speaker, str],
    scope: CallScope,
    *,
    temperature: float,
    seed: int | None,
) -> Structured[StructuredContext | None]:
    """Fold the new older turns in with a model call (role ``context``); ``None`` if unusable."""
    new = history[previous.covered : upto]
    result = await caller.structured(
        "context", backend, context_messages(previous, new, viewer, labels), ContextUpdate,
        scope, temperature=temperature, max_tokens=300, seed=seed,
    )

    def fold(update: ContextUpdate | None) -> StructuredContext | None:
        if update is None:
            return None
        return StructuredContext(
            topic=update.topic or previous.topic,
            partner_emotion=update.partner_emotion or previous.partner_emotion,
            people=update.people or previous.people,
            key_events=update.key_events or previous.key_events,
            unresolved_questions=update.unresolved_questions,
            covered=upto,
        )

    return result.map(fold)
