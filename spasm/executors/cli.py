"""The command line beyond one machine: ``spasm merge`` and the flags of ``spasm generate``
that pick a shard or an executor (``--shard``, ``--executor``, ``--ray-address``, ``--shards``).

spasm/cli.py stays thin: it calls :func:`register`, :func:`add_generate_flags`,
:func:`shard_of` and :func:`generate_with_ray`. docs/cluster.md describes the commands.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from spasm.errors import UserError
from spasm.runplan import Shard

__all__ = ["add_generate_flags", "cmd_merge", "generate_with_ray", "register", "shard_of"]


def register(sub: Any) -> None:
    """Add ``spasm merge`` to the CLI's subcommands."""
    p = sub.add_parser(
        "merge",
        help="merge the shards of a run (spasm generate --shard I/N) into one run directory",
        description="Check that the shards come from one config and schema version, that none "
        "overlaps, is missing or unfinished, then stream them into one run directory equal in "
        "rows to the unsharded run. Nothing is written when a check fails.",
    )
    p.add_argument("shards", nargs="+", type=Path, metavar="SHARD_DIR", help="the shards' --out")
    p.add_argument("--out", type=Path, required=True,
                   help="the merged run directory (new, empty, or holding only its shards/)")
    p.add_argument("--allow-partial", action="store_true",
                   help="merge although shards are missing or unfinished (status: partial)")
    p.set_defaults(func=cmd_merge)


def cmd_merge(args: argparse.Namespace) -> int:
    from spasm.dataset.merge import merge_runs
    from spasm.finish import write_reports

    result = merge_runs(args.shards, args.out, allow_partial=args.allow_partial)
    write_reports(args.out)
    print(result.line())
    return 0


def add_generate_flags(p: argparse.ArgumentParser) -> None:
    """The ``spasm generate`` flags for shards and executors."""
    c = p.add_argument_group("beyond one machine (docs/cluster.md)")
    c.add_argument("--shard", metavar="I/N",
                   help="run only shard I of N (0-based; split by persona), e.g. 0/3; then "
                   "`spasm merge` the shards")
    c.add_argument("--executor", choices=["local", "ray"], default="local",
                   help="ray: run the shards as Ray tasks and merge them (pip install 'spasm[ray]')")
    c.add_argument("--ray-address", metavar="ADDR",
                   help="with --executor ray: the cluster to join (default: RAY_ADDRESS, else a "
                   "local Ray)")
    c.add_argument("--shards", type=int, metavar="N",
                   help="with --executor ray: the number of shards (default: one per CPU)")


def shard_of(args: argparse.Namespace) -> Shard | None:
    """The ``--shard`` of a local run (and a refusal of the Ray-only flags without Ray)."""
    if args.ray_address or args.shards is not None:
        raise UserError("--ray-address and --shards go with --executor ray")
    return Shard.parse(args.shard) if args.shard else None


def generate_with_ray(args: argparse.Namespace, config: Any, run_dir: Path) -> int:
    """``spasm generate --executor ray``; returns the exit code."""
    from spasm.executors.ray_executor import import_ray, run_with_ray
    from spasm.exits import interrupted, outcome_code

    if args.shard:
        raise UserError("--shard runs one shard in this process; with --executor ray every shard "
                        "runs on the cluster (use --shards N)")
    if args.dry_run or args.pilot:
        raise UserError("a dry run is local: drop --executor ray (the estimate is the same)")
    if args.shards is not None and args.shards < 1:
        raise UserError("--shards must be at least 1")
    if args.resume and not (run_dir / "shards").is_dir():
        raise UserError(f"--resume: {run_dir} holds no Ray run to resume")
    import_ray()  # exit 2 with how to install it, before anything else
    try:
        run = run_with_ray(config, run_dir, shards=args.shards, address=args.ray_address,
                           overwrite=args.overwrite, progress=False if args.no_progress else None)
    except KeyboardInterrupt:
        return interrupted(run_dir / "shards")
    print(run.line())
    return outcome_code(run)
