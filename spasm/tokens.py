"""Token counting for estimates, with tiktoken when its encoding is available.

tiktoken downloads its BPE files on first use. Offline, point ``TIKTOKEN_CACHE_DIR`` at a folder
that holds them; without them we fall back to ~4 characters per token and say so once. Real
usage always comes from the token counts the API reports.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

log = logging.getLogger("spasm")

_lock = threading.Lock()
_counter: Callable[[str], int] | None = None
_source = "unset"


def _load() -> tuple[Callable[[str], int], str]:
    try:
        import tiktoken

        enc = tiktoken.get_encoding("o200k_base")
        return (lambda text: len(enc.encode(text, disallowed_special=()))), "tiktoken:o200k_base"
    except Exception as exc:
        log.warning(
            "tiktoken encoding unavailable (%s); token estimates use ~4 characters per token. "
            "Set TIKTOKEN_CACHE_DIR to a folder with the encoding files for exact counts.",
            type(exc).__name__,
        )
        return (lambda text: max(1, (len(text) + 3) // 4) if text else 0), "chars/4"


def count_tokens(text: str) -> int:
    """Tokens in ``text`` (exact with tiktoken, else an estimate)."""
    global _counter, _source
    if _counter is None:
        with _lock:
            if _counter is None:
                _counter, _source = _load()
    return _counter(text)


def count_messages(messages: Iterable[dict[str, str]] | Iterable[object]) -> int:
    """Prompt tokens of chat messages: content plus ~4 tokens of framing per message."""
    total = 0
    for m in messages:
        content = m.get("content", "") if isinstance(m, dict) else ""
        total += count_tokens(str(content)) + 4
    return total + 2


def counter_source() -> str:
    """Which counter was used (for the manifest); ``unset`` if nothing needed one."""
    return _source


def common_prefix_length(a: str, b: str) -> int:
    """Length of the longest common start of two strings (binary search on slice equality:
    C-speed comparisons, O(log n) of them). Used wherever a prefix cache is modelled."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo
