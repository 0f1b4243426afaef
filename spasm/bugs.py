"""A bug met in a dialogue, told on stderr: in full the first time this process meets it, in
one line for every later dialogue that meets the same one (the errors table keeps each with its
traceback; docs/architecture.md, "A bug is never silent").

The only process-global state of the run layer: which bugs this process has told already.
"""

from __future__ import annotations

import sys
import threading

__all__ = ["report_bug"]

_reported: set[tuple[str, str]] = set()
_reported_lock = threading.Lock()


def report_bug(dialogue_id: str, exc: BaseException, tb: str) -> None:
    """Print a bug's traceback to stderr the first time it is seen in this process (later
    dialogues that hit the same bug name it in one line); the errors table keeps each."""
    last = tb.strip().splitlines()
    key = (type(exc).__name__, last[-3] if len(last) >= 3 else tb)
    with _reported_lock:
        first = key not in _reported
        _reported.add(key)
    if first:
        print(f"spasm: dialogue {dialogue_id} failed on a bug (quarantined with its traceback "
              f"in errors.parquet):\n{tb}", file=sys.stderr, end="" if tb.endswith("\n") else "\n")
    else:
        print(f"spasm: dialogue {dialogue_id} failed on the same bug: "
              f"{type(exc).__name__}: {exc}", file=sys.stderr)
