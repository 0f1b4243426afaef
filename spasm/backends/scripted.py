"""A scripted backend that answers without a model and counts tokens (the dry run's backend).

``--dry-run`` simulates the planned dialogues through the same code as a real run
(:func:`spasm.simulation.simulate_dialogue`, the harness, the termination chain, the
:class:`~spasm.calls.Caller`), with every backend replaced by a :class:`ScriptedBackend`
named and priced like the one it stands in for. It makes no network call:

* prompt tokens are :func:`spasm.tokens.count_messages` of the exact request;
* a free-text reply is deterministic filler of a chosen length in tokens (the calibrated mean
  reply length, else the request's ``max_tokens``: an upper bound), drawn from neutral words
  so no termination rule, end marker or checker screen fires on it and no two replies repeat;
* a structured reply is a valid instance of the request's JSON schema (the same instance the
  test server answers), with ``overrides`` for top-level fields the dry run needs to control
  (``{"finished": False}`` keeps the judge from ending a dialogue before its planned length).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Mapping
from typing import Any

from spasm.backends.base import Backend, ChatRequest, Completion, ToolCall
from spasm.config import BackendConfig
from spasm.tokens import count_messages, count_tokens

__all__ = ["ScriptedBackend", "filler"]

# Neutral words: no closing formula, no role label, nothing the checker's code screen or the
# intent classifier keys on strongly. Most are one token in common BPE vocabularies.
_WORDS = (
    "river", "garden", "window", "paper", "morning", "table", "letter", "bridge", "cloud", "stone",
    "orange", "silver", "market", "winter", "summer", "music", "forest", "pencil", "kitchen", "station",
    "ladder", "harbor", "meadow", "candle", "button", "mirror", "tunnel", "valley", "engine", "basket",
    "blanket", "yellow", "purple", "copper", "marble", "velvet", "cotton", "planet", "island", "desert",
    "canyon", "lantern", "compass", "feather", "pebble", "ribbon", "saddle", "timber", "walnut",
    "cherry", "lemon", "pepper", "ginger", "butter", "honey", "bread", "cheese", "carpet", "curtain",
    "pillow", "chimney", "garage", "fence", "hedge", "orchard", "pond", "stream", "tower", "castle",
    "village", "county", "border", "coast", "shadow", "thunder", "breeze", "frost", "spring", "autumn",
    "evening", "noon", "shelf", "drawer", "folder", "ticket", "parcel", "wagon", "cabin", "porch",
    "attic", "cellar", "balcony", "corridor", "hallway", "lobby", "plaza", "avenue", "lane", "road",
    "path", "field", "hill", "rock", "sand", "shell", "coral", "reef", "wave", "tide", "anchor", "sail",
    "oar", "mast",
)
_PAD = ("a", "so", "it", "on", "in")


def _seed(request: ChatRequest) -> int:
    return int.from_bytes(hashlib.blake2b(request.cache_key("scripted").encode(),
                                          digest_size=8).digest(), "big")


def filler(n_tokens: int, seed: int) -> str:
    """About ``n_tokens`` tokens (as :func:`~spasm.tokens.count_tokens` counts) of neutral
    words in a seeded order, ending with a full stop; never more than ``n_tokens``."""
    n_tokens = max(1, n_tokens)
    rng = random.Random(seed)
    words = [rng.choice(_WORDS) for _ in range(2 * n_tokens + 2)]

    def text(k: int) -> str:
        return " ".join(words[:k]).capitalize() + "."

    lo, hi = 1, len(words)
    while lo < hi:  # the most words that fit: the count grows with k
        mid = (lo + hi + 1) // 2
        if count_tokens(text(mid)) <= n_tokens:
            lo = mid
        else:
            hi = mid - 1
    best = text(lo)
    for pad in _PAD:  # a short word often closes the last token of difference
        if count_tokens(best) >= n_tokens:
            break
        candidate = best[:-1] + f" {pad}."
        if count_tokens(candidate) <= n_tokens:
            best = candidate
    return best


class ScriptedBackend(Backend):
    """Answers every request at once, without a model, counting what it would have cost.

    ``reply_tokens`` is the length of free-text replies (fractional means are met on average:
    each reply takes the floor or the ceiling, chosen by the request's hash); ``None`` answers
    ``request.max_tokens``. ``calls`` counts the requests it answered.
    """

    def __init__(
        self,
        name: str,
        cfg: BackendConfig,
        *,
        reply_tokens: float | None = None,
        overrides: Mapping[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.model = cfg.model
        self.max_concurrency = cfg.max_concurrency
        self.reply_tokens = reply_tokens
        self.overrides = dict(overrides or {})
        self.calls = 0

    @property
    def identity(self) -> str:
        return f"ScriptedBackend:{self.model}"

    def _length(self, request: ChatRequest, seed: int) -> int:
        if self.reply_tokens is None:
            return request.max_tokens
        whole = int(self.reply_tokens)
        frac = self.reply_tokens - whole
        n = whole + (1 if (seed % 10_000) / 10_000 < frac else 0)
        return max(1, min(request.max_tokens, n))

    def _structured(self, schema: dict[str, Any]) -> str:
        from spasm.backends.instances import instance_from_schema

        value = instance_from_schema(schema)
        if isinstance(value, dict):
            value.update({k: v for k, v in self.overrides.items() if k in value})
        return json.dumps(value, ensure_ascii=False)

    def _prompted_step(self, request: ChatRequest, seed: int) -> str:
        """One tool step per turn, as with native tools: a call first, then the message."""
        last = request.messages[-1]["content"] if request.messages else ""
        if not last.startswith("Result of "):
            value = self._structured(request.json_schema or {})
            calls = json.loads(value).get("tool_calls")
            if calls:
                return json.dumps({"tool_calls": calls[:1]})
        return json.dumps({"message": filler(self._length(request, seed), seed)})

    async def complete(self, request: ChatRequest) -> Completion:
        """A reply of the planned size; usage counted on the request and the reply. A turn
        that offers tools takes one tool step (it calls the first tool offered, with example
        arguments) before it speaks, so the dry run counts tool steps."""
        self.calls += 1
        seed = _seed(request)
        first_step = not request.messages or request.messages[-1]["role"] != "tool"
        if request.tools and first_step:
            tool = request.tools[0]["function"]
            from spasm.backends.structured import schema_example

            arguments = json.dumps(schema_example(tool.get("parameters") or {}))
            return Completion(text="", prompt_tokens=count_messages(request.messages),
                              completion_tokens=count_tokens(arguments), resolved_model=self.model,
                              finish_reason="tool_calls",
                              tool_calls=(ToolCall(f"call_{seed % 10**8}", tool["name"], arguments),))
        if request.json_schema is not None and str(request.json_schema.get("title", "")).startswith(
                "PromptedStep"):  # a prompted tool step (spasm.backends.structured): the same
            text = self._prompted_step(request, seed)
        elif request.json_schema is not None:
            text = self._structured(request.json_schema)
        else:
            text = filler(self._length(request, seed), seed)
        return Completion(
            text=text,
            prompt_tokens=count_messages(request.messages),
            completion_tokens=count_tokens(text),
            resolved_model=self.model,
            finish_reason="stop",
        )
