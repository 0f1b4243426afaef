"""A scripted checker for the test server: pass a set share of drafts and of rewrites.

The harness's cost depends on how often its checker passes a draft the first time, passes the
rewrite, or fails both (the turn is flagged). A tiny model fails nearly every draft, so cost
measured on it says little about the design. :class:`CheckerProfile` is a ``reply`` callable
for :class:`~spasm.testing.server.TestServer` that answers checker calls at chosen rates
(default: the design's 85% first time, 12% after one rewrite, 3% flagged), other structured
calls as the server would (:func:`~spasm.testing.server.default_reply`) and free-text turns with
a short first-person line chosen by a hash of the request's seed. The server's default free
text echoes the last message, so a Client would echo the Responder's offers of help and fail
the harness's code screen before the checker is asked, which would move the profile's rates::

    profile = CheckerProfile(first_pass=0.85, after_rewrite=0.12, seed=3)
    with TestServer(reply=profile) as srv:
        ...
    profile.counts  # {"first_pass": …, "after_rewrite": …, "flagged": …}

Which outcome a turn gets is decided by a hash of the profile's seed, who is reviewed and what
the partner said (not the candidate, the state or the instructions): deterministic for a seed,
whatever the order in which concurrent dialogues reach the server, and the same turns are drawn
whether the check also updates the state or not. ``reply_words`` makes free-text turns that
many words long (lines joined), for cost measured at realistic utterance lengths. After a failed
draft the turn waits for its rewrite: the next, different candidate with the same prompt.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import Counter
from typing import Any

from spasm.testing.server import default_reply

__all__ = ["CheckerProfile", "is_checker_request"]

#: What the harness's checker asks for (``spasm.harness.checker.CheckerOutput``, or
#: ``ReviewOutput`` when the same call also updates the state).
CHECKER_TITLES = ("CheckerOutput", "ReviewOutput")
_CANDIDATE = "Message to review:"
_PARTNER = "The other person just said:"

#: Free-text turns: neutral first-person lines no code screen objects to, of varied length.
_LINES: tuple[str, ...] = (
    "I see, thanks. The order still has not arrived and I am getting worried about it.",
    "That makes sense. Could you tell me what happens next with my case?",
    "Okay. I paid for express delivery, so I expected it last week.",
    "Right, I understand. It is the third time this month that something went wrong.",
    "Thank you for explaining. I would like this sorted out today if possible.",
    "Hmm, I am not sure. What information do you need from me?",
    "Fine. My account number should be on the first email you sent me.",
    "I appreciate it. I only want a clear answer about the refund and the dates.",
)

_PASS = {"dimension_scores": {"boundary": 95, "fact": 90, "state": 90, "style": 90},
         "violations": [], "correction_advice": ""}
_FAIL = {"dimension_scores": {"boundary": 30, "fact": 50, "state": 50, "style": 50},
         "violations": ["out of character"],
         "correction_advice": "Stay in character and keep to your facts."}


def _schema(body: dict[str, Any]) -> dict[str, Any]:
    fmt = body.get("response_format")
    if not isinstance(fmt, dict):
        return {}
    if fmt.get("type") == "json_schema":
        return (fmt.get("json_schema") or {}).get("schema") or {}
    schema = fmt.get("schema")
    return schema if isinstance(schema, dict) else {}


def is_checker_request(body: dict[str, Any]) -> bool:
    """Whether a chat request body is the harness checker's call."""
    return _schema(body).get("title") in CHECKER_TITLES


def _split(body: dict[str, Any]) -> tuple[str, str]:
    """(what identifies the turn — who is reviewed, what the partner said — the candidate).

    The state, the policy's wording and the instructions are left out so that a design change
    which moves the state (or merges the state update into the check) does not redraw every
    turn's outcome: the same turns pass or fail.
    """
    messages = body.get("messages") or []
    blocks = [b for m in messages for b in str(m.get("content")).split("\n\n")]
    # Who is reviewed (the first paragraph of the instructions, which names them) and what the
    # partner said: the same whether the call also updates the state or not.
    who = str(messages[0].get("content")).split("\n\n", 1)[0] if messages else ""
    kept = [who, *(b for b in blocks if b.startswith(_PARTNER))]
    candidate = next((b for b in reversed(blocks) if b.startswith(_CANDIDATE)), "")
    return "\n\n".join(kept), candidate


class CheckerProfile:
    """A test-server ``reply`` callable whose checker passes drafts and rewrites at set rates.

    ``first_pass`` is the share of turns whose draft passes; ``after_rewrite`` the share of
    turns whose draft fails and whose rewrite passes; the rest (``1 - first_pass -
    after_rewrite``) fail both and are flagged.
    """

    def __init__(
        self, first_pass: float = 0.85, after_rewrite: float = 0.12, seed: int = 0,
        reply_words: int | None = None,
    ) -> None:
        if not (0.0 <= first_pass <= 1.0 and 0.0 <= after_rewrite <= 1.0 - first_pass + 1e-9):
            raise ValueError("need 0 <= first_pass, after_rewrite and first_pass + after_rewrite <= 1")
        if reply_words is not None and reply_words < 1:
            raise ValueError("reply_words must be at least 1")
        #: Words of each free-text turn (lines joined, then cut); ``None``: one line as it is.
        self.reply_words = reply_words
        self.first_pass = first_pass
        self.after_rewrite = after_rewrite
        self.seed = seed
        #: Turns by outcome (``first_pass``, ``after_rewrite``, ``flagged``) and checks answered.
        self.counts: Counter[str] = Counter()
        self._waiting: dict[str, str] = {}
        self._lock = threading.Lock()

    def outcome(self, turn: str) -> str:
        """The outcome drawn for a turn (its checker prompt without the candidate)."""
        digest = hashlib.blake2b(f"{self.seed}\x1f{turn}".encode(), digest_size=8).digest()
        u = int.from_bytes(digest, "big") / 2**64
        if u < self.first_pass:
            return "first_pass"
        return "after_rewrite" if u < self.first_pass + self.after_rewrite else "flagged"

    def _line(self, n: int) -> str:
        if self.reply_words is None:
            return _LINES[n % len(_LINES)]
        words: list[str] = []
        i = n
        while len(words) < self.reply_words:
            words += _LINES[i % len(_LINES)].split()
            i += 1
        return " ".join(words[: self.reply_words])

    def __call__(self, body: dict[str, Any]) -> str:
        """The reply to one request: a scripted verdict for a checker call, else the default."""
        if not is_checker_request(body):
            if body.get("response_format") is not None:
                return default_reply(body)
            # By the request's seed only (spasm derives it from the dialogue, the turn and the
            # speaker): a design change that alters the prompt keeps the same conversation.
            key = hashlib.blake2b(f"{self.seed}\x1f{body.get('seed')}".encode(),
                                  digest_size=8).digest()
            n = int.from_bytes(key, "big")
            # The number keeps each turn's checker prompt (which quotes the partner) distinct.
            return f"{self._line(n)} (ref {n % 100_000:05d})"
        turn, candidate = _split(body)
        outcome = self.outcome(turn)
        with self._lock:
            # A failed draft leaves its turn waiting for the rewrite's check.
            is_draft = self._waiting.get(turn) in (None, candidate)
            self.counts["checks"] += 1
            if is_draft:
                self.counts[outcome] += 1
            passed = outcome == "first_pass" if is_draft else outcome == "after_rewrite"
            if is_draft and not passed:
                self._waiting[turn] = candidate
            else:
                self._waiting.pop(turn, None)
        # The verdict is scripted; anything else the call asks for (a merged review's state
        # update) is the server's default instance of the schema.
        return json.dumps({**json.loads(default_reply(body)), **(_PASS if passed else _FAIL)})
