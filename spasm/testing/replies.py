"""The test server's deterministic content: chat replies, embeddings and the preflight answer."""

from __future__ import annotations

import hashlib
import json
import math
import re
from typing import Any

from spasm.backends.instances import instance_from_schema

_EMBEDDING_DIM = 64
_WORD_RE = re.compile(r"\w+", re.UNICODE)

# ---------------------------------------------------------------------------------------
# Deterministic content
# ---------------------------------------------------------------------------------------

_TEMPLATES: tuple[str, ...] = (
    "I see. About '{words}' — could you tell me more?",
    "Interesting point on '{words}'. What makes you say that?",
    "Thanks for sharing '{words}'. How does that affect you day to day?",
    "Let me think about '{words}'. Could you give me an example?",
    "Understood: '{words}'. What would you like to happen next?",
    "Hmm, '{words}' is worth unpacking. Where would you like to start?",
)


def _text_of(content: Any) -> str:
    """The text of a message's ``content``: a string, or a list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text", "") for p in content if isinstance(p, dict)]
        return " ".join(p for p in parts if isinstance(p, str))
    return ""


def _words(text: str) -> list[str]:
    return text.split()


def _digest(*parts: object) -> int:
    data = "\x1f".join(repr(p) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def default_reply(body: dict[str, Any]) -> str:
    """The reply the server gives when no ``reply`` callable is configured.

    A JSON instance of the schema for ``response_format`` ``json_schema``, and for
    ``json_object`` with a ``schema`` field (as llama.cpp's server does); ``{}`` for a bare
    ``json_object``; otherwise a short sentence chosen and filled from the last message and
    ``seed``.
    """
    fmt = body.get("response_format")
    if isinstance(fmt, dict):
        if fmt.get("type") == "json_schema":
            spec = fmt.get("json_schema") or {}
            schema = spec.get("schema") or {}
            return json.dumps(instance_from_schema(schema), ensure_ascii=False)
        if fmt.get("type") == "json_object":
            schema = fmt.get("schema")
            if isinstance(schema, dict):
                return json.dumps(instance_from_schema(schema), ensure_ascii=False)
            return "{}"
    messages = body.get("messages") or []
    last = _text_of(messages[-1].get("content")) if messages else ""
    words = " ".join(_words(last)[:6])
    template = _TEMPLATES[_digest(last, body.get("seed")) % len(_TEMPLATES)]
    return template.format(words=words)


def embed(text: str, dimensions: int = _EMBEDDING_DIM) -> list[float]:
    """A deterministic bag-of-words embedding, L2-normalised (all zeros for no words).

    Each lowercase word token is hashed to a bucket and a sign (the hashing trick), so the
    same text always gives the same vector and texts sharing no words are near-orthogonal.
    """
    vector = [0.0] * dimensions
    for token in _WORD_RE.findall(text.lower()):
        h = _digest("tok", token)
        vector[h % dimensions] += 1.0 if (h >> 32) & 1 else -1.0
    norm = math.sqrt(sum(x * x for x in vector))
    return [x / norm for x in vector] if norm else vector


# ---------------------------------------------------------------------------------------
# HTTP plumbing
# ---------------------------------------------------------------------------------------


#: The prompt of spasm's preflight chat call (spasm.backends.openai_compat).
PREFLIGHT_PROMPT = "spasm preflight: reply with one word."
_PREFLIGHT_REPLY = json.dumps({
    "id": "chatcmpl-preflight", "object": "chat.completion", "created": 0, "model": "preflight",
    "choices": [{"index": 0, "finish_reason": "length",
                 "message": {"role": "assistant", "content": "ok"}}],
    "usage": {"prompt_tokens": 8, "completion_tokens": 1, "total_tokens": 9},
}).encode()


def _is_preflight(raw: bytes) -> bool:
    if PREFLIGHT_PROMPT.encode() not in raw:
        return False
    try:
        body = json.loads(raw)
        return bool(body["messages"][-1]["content"] == PREFLIGHT_PROMPT)
    except (ValueError, KeyError, IndexError, TypeError):
        return False


