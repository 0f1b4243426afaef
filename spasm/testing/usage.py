"""How the test server counts tokens and what its prompt cache reports.

By default the test server counts one token per whitespace-separated word (+4 per message) and
reports no cached tokens: cheap and exact to assert on. Cost measurements want what a provider
reports, so :class:`Usage` can count with a real tokenizer (``tokens="tiktoken"``:
:func:`spasm.tokens.count_tokens`, o200k_base when its encoding is available) and run a
provider-style prefix cache (``prefix_cache=True``): the server remembers recent prompts and
reports, as ``usage.prompt_tokens_details.cached_tokens``, the tokens of the longest prefix a new
prompt shares with one of them — whole messages, then the common start of the first message
that differs (cut back to a word boundary, as a cache works on whole tokens). ``min_tokens`` and
``block`` model providers that cache only long prompts, in fixed steps (OpenAI: 1024 and 128)::

    with TestServer(reply=fn, usage=Usage(tokens="tiktoken", prefix_cache=True)) as srv:
        ...
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Sequence
from typing import Literal

from spasm.tokens import common_prefix_length, count_tokens

__all__ = ["Usage"]

#: Framing tokens counted per message, as chat templates add role markers.
MESSAGE_OVERHEAD = 4


def _words(text: str) -> int:
    return len(text.split())


class Usage:
    """The server's token counter and (optionally) its prefix cache."""

    def __init__(
        self,
        tokens: Literal["words", "tiktoken"] = "words",
        *,
        prefix_cache: bool = False,
        capacity: int = 4096,
        min_tokens: int = 0,
        block: int = 1,
    ) -> None:
        if tokens not in ("words", "tiktoken"):
            raise ValueError(f"tokens must be 'words' or 'tiktoken', not {tokens!r}")
        if block < 1 or min_tokens < 0 or capacity < 1:
            raise ValueError("block and capacity must be ≥ 1 and min_tokens ≥ 0")
        self.count: Callable[[str], int] = _words if tokens == "words" else count_tokens
        self.prefix_cache = prefix_cache
        self.min_tokens = min_tokens
        self.block = block
        self._lock = threading.Lock()
        # Prompts by their first message: only a prompt with the same first message can share
        # more than part of it, so a lookup compares a handful of prompts, not all of them.
        self._by_first: collections.OrderedDict[tuple[str, str], list[tuple[tuple[str, str], ...]]] = (
            collections.OrderedDict()
        )
        self._stored = 0
        self._capacity = capacity

    def prompt_tokens(self, messages: Sequence[tuple[str, str]]) -> int:
        """Prompt tokens of ``(role, content)`` messages."""
        return sum(self.count(content) + MESSAGE_OVERHEAD for _, content in messages)

    def truncate(self, text: str, limit: int) -> str:
        """``text`` cut to at most ``limit`` completion tokens, at a word boundary."""
        words = text.split()
        if len(words) > limit:
            words = words[: max(limit, 0)]
        while words and self.count(" ".join(words)) > limit:
            words = words[:-1]
        return " ".join(words)

    def cached_tokens(self, messages: Sequence[tuple[str, str]]) -> int:
        """Tokens of ``messages`` an earlier prompt already had (then remember this one)."""
        if not self.prefix_cache or not messages:
            return 0
        prompt = tuple(messages)
        with self._lock:
            earlier = list(self._by_first.get(prompt[0], ()))
            self._remember(prompt)
        best = max((self._shared(prompt, e) for e in earlier), default=0)
        if best < self.min_tokens:
            return 0
        return best - best % self.block

    def _remember(self, prompt: tuple[tuple[str, str], ...]) -> None:
        bucket = self._by_first.setdefault(prompt[0], [])
        self._by_first.move_to_end(prompt[0])
        if prompt not in bucket:
            bucket.append(prompt)
            self._stored += 1
            if len(bucket) > 16:  # a long dialogue's agent: its latest prompts extend the others
                bucket.pop(0)
                self._stored -= 1
        while self._stored > self._capacity:
            _, old = self._by_first.popitem(last=False)
            self._stored -= len(old)

    def _shared(self, prompt: Sequence[tuple[str, str]], earlier: Sequence[tuple[str, str]]) -> int:
        tokens = 0
        for (role, content), (e_role, e_content) in zip(prompt, earlier, strict=False):
            if (role, content) == (e_role, e_content):
                tokens += self.count(content) + MESSAGE_OVERHEAD
                continue
            if role == e_role:
                common = content[: common_prefix_length(content, e_content)]
                # A partial message: its framing and the words both prompts have in full.
                cut = common if not common or common[-1].isspace() else _to_word_boundary(common)
                tokens += MESSAGE_OVERHEAD // 2 + (self.count(cut) if cut.strip() else 0)
            break
        return tokens


def _to_word_boundary(text: str) -> str:
    """``text`` without its last, possibly partial, word."""
    cut = max(text.rfind(c) for c in " \n\t")
    return text[: cut + 1] if cut >= 0 else ""
