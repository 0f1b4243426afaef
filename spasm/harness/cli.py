"""The ``harness-report`` sub-command (wired in by ``spasm/cli.py`` through :func:`register`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from spasm.errors import UserError

__all__ = ["cmd_harness_report", "register"]


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add ``harness-report`` to the main parser."""
    p = subparsers.add_parser(
        "harness-report",
        help="per-level Persona Harness report of a run (A-E ablation)",
        description="Compute boundary violations, state continuity, fact recall, calls, tokens "
        "and latency per harness level; write RUN_DIR/harness_report.json and .md.",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", type=Path, help="run directory (runs/<name>)")
    p.add_argument(
        "--cache-discount",
        type=float,
        default=0.5,
        help="share of a cached prompt token's price the provider waives (default 0.5)",
    )
    p.set_defaults(func=cmd_harness_report)


def cmd_harness_report(args: argparse.Namespace) -> int:
    """Write the report and print its Markdown."""
    from spasm.harness.level_report import level_report

    if not 0 <= args.cache_discount <= 1:
        raise UserError("--cache-discount is a share between 0 and 1")
    from contextlib import nullcontext

    from spasm.dataset.lock import RunLock

    # It writes harness_report.* into the run: one writer at a time (a missing run is
    # level_report's error, not a directory the lock creates).
    with RunLock(args.run_dir) if args.run_dir.is_dir() else nullcontext():
        level_report(args.run_dir, cache_discount=args.cache_discount)
    print((args.run_dir / "harness_report.md").read_text(encoding="utf-8"), end="")
    return 0
