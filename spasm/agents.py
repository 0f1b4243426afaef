"""The two agents: the Client (the persona) and the Responder (the assistant under test).

The Responder never receives the Client's persona card, and the Client is never told it is an
AI: its system prompt is the card plus instructions to stay the person seeking help.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

from spasm.backends.base import ChatRequest, Completion
from spasm.calls import Caller, CallScope
from spasm.history import History, Speaker
from spasm.projection import Message, Viewer, messages_digest, project

END_MARKER = "<END>"


def client_instructions(responder_role: str) -> str:
    """How the Client behaves in the conversation (its frame without the persona card)."""
    return (
        f"You are talking with a {responder_role}. You are the person seeking help: stay this "
        "person throughout, with your own concern, feelings and way of speaking, and speak only "
        "for yourself, in the first person. Do not give advice, do not offer help and do not take "
        f"over the {responder_role}'s role. Write short chat messages (one to three sentences). "
        "When your concern is settled or you want to leave, say goodbye naturally."
    )


def client_system_prompt(card: str, responder_role: str) -> str:
    """The Client's frame: its persona card and how to behave in the conversation."""
    return f"{card}\n\n{client_instructions(responder_role)}"


def responder_system_prompt(role: str, instructions: str | None = None) -> str:
    """The Responder's frame: its role only (never the Client's card)."""
    base = (
        f"You are a {role}. Someone has come to talk with you. Help them with care and "
        "competence, ask a question when you need more information, and keep each reply short "
        "(two to four sentences). Stay in your role."
    )
    return f"{base}\n\n{instructions}" if instructions else base


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


def derive_seed(*parts: object) -> int:
    """A 31-bit seed derived from any parts (stable across machines)."""
    digest = hashlib.sha256(json.dumps(parts, default=str).encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


@dataclass(frozen=True)
class Agent:
    """One side of the dialogue: who it is, which backend plays it, how it samples."""

    speaker: Speaker
    backend: str
    viewer: Viewer
    temperature: float
    max_tokens: int

    def messages(self, history: History, condition: str) -> list[Message]:
        """What this agent sees now: Ψ(history, self)."""
        return project(history, self.viewer, condition)

    async def generate(
        self,
        messages: list[Message],
        caller: Caller,
        scope: CallScope,
        seed: int,
        *,
        role: str | None = None,
    ) -> tuple[str, Completion]:
        """One utterance from exactly these messages; ``role`` names the call in the log
        (default: the speaker; the harness uses ``rewrite`` for its second attempt)."""
        request = ChatRequest(
            messages=tuple(messages), temperature=self.temperature,
            max_tokens=self.max_tokens, seed=seed,
        )
        completion = await caller.complete(role or self.speaker, self.backend, request, scope)
        text = clean_reply(completion.text, completion.finish_reason == "length")
        if not text:
            text = completion.text.strip()
        return text, completion

    async def reply(
        self, history: History, condition: str, caller: Caller, scope: CallScope, seed: int
    ) -> tuple[str, Completion, list[Message]]:
        """Generate this agent's next utterance from its own projected context."""
        messages = self.messages(history, condition)
        text, completion = await self.generate(messages, caller, scope, seed)
        return text, completion, messages
