"""Exit codes of the commands, and how a finished pass maps to one (a leaf: every CLI module
imports it, and nothing imports a CLI module)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

__all__ = ["RUN_EXIT", "TERMINATION", "interrupted", "outcome_code"]

#: ``0`` done, ``1`` a run that failed (rerun to retry), ``2`` bad usage or input, ``3`` a
#: budget stop, ``130``/``143`` interrupted by SIGINT/SIGTERM (committed work is kept).
RUN_EXIT = {"ok": 0, "failed": 1, "usage": 2, "budget": 3, "interrupted": 130, "terminated": 143}


def outcome_code(summary: Any) -> int:
    """Say how a finished pass ended (budget stop, failure) and return its exit code; ``0``
    when neither (the caller checks what is left to do)."""
    if summary.stopped:
        print(f"Stopped early: {summary.stopped}. Raise the cap and rerun the same command to "
              "continue.", file=sys.stderr)
        return RUN_EXIT["budget"]
    if summary.failed:
        print(f"run failed: {summary.failed}", file=sys.stderr)
        return RUN_EXIT["failed"]
    return RUN_EXIT["ok"]


class _Termination:
    """Whether the interrupt being handled came from SIGTERM (exit 143) or Ctrl-C (130); the
    CLI's SIGTERM handler sets it."""

    by_sigterm = False


TERMINATION = _Termination()


def interrupted(saved_in: Path) -> int:
    """Say how to resume a run stopped by Ctrl-C or SIGTERM; returns its exit code (130, 143)."""
    term = TERMINATION.by_sigterm
    saved = (f"Completed dialogues are saved in {saved_in}. Run the same command again to "
             "resume." if saved_in.exists() else f"Nothing was written ({saved_in} was not "
             "created).")
    print(f"\n{'Stopped by SIGTERM' if term else 'Interrupted'}. {saved}", file=sys.stderr)
    return RUN_EXIT["terminated" if term else "interrupted"]
