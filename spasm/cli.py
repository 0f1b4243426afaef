"""The command line: a thin layer over the library. ``main(argv) -> int``.

Exit codes: 0 done; 1 the run failed; 2 bad input (config, flags, environment); 3 stopped at a
budget cap (resume with a higher cap); 130 interrupted (rerun the same command to resume).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from spasm.errors import SpasmError, UserError

log = logging.getLogger("spasm")

RUN_EXIT = {"ok": 0, "failed": 1, "usage": 2, "budget": 3, "interrupted": 130}


def _add_generate(sub: Any) -> None:
    p = sub.add_parser(
        "generate",
        help="sample personas and simulate dialogues into a run directory",
        description="Run a config (default: the bundled smoke config on the embedded model). "
        "Rerunning the same command resumes an interrupted run.",
    )
    p.add_argument("--config", type=Path, help="run config (YAML); default: configs/smoke.yaml")
    p.add_argument("--out", type=Path, help="run directory (default: runs/<config name>)")
    p.add_argument("--personas", type=int, metavar="N", help="number of personas")
    p.add_argument("--conversations-per-persona", type=int, metavar="K")
    p.add_argument("--condition", choices=["ecp", "concat", "both"])
    p.add_argument("--seed", type=int)
    p.add_argument("--name", help="run name (default from the config)")
    q = p.add_argument_group("quick start: one OpenAI-compatible endpoint for every role")
    q.add_argument("--base-url", help="e.g. https://api.openai.com/v1 or http://localhost:8000/v1")
    q.add_argument("--model", help="model name at that endpoint")
    q.add_argument("--api-key-env", metavar="VAR", help="NAME of the env var holding the key")
    q.add_argument("--concurrency", type=int, metavar="C", help="requests in flight (default 16)")
    e = p.add_argument_group("run control")
    e.add_argument("--resume", action="store_true", help="require an existing run to resume")
    e.add_argument("--overwrite", action="store_true", help="replace an existing run directory")
    e.add_argument("--max-cost", type=float, help="stop cleanly when the cost reaches this")
    e.add_argument("--max-tokens", type=int, help="stop cleanly when total tokens reach this")
    e.add_argument("--no-progress", action="store_true", help="no progress bar")
    e.add_argument("--dry-run", action="store_true",
                   help="estimate calls, tokens and cost per pairing; spend nothing")
    e.add_argument("--pilot", type=int, default=0, metavar="N",
                   help="with --dry-run: first run N dialogues for real and calibrate on them")
    from spasm.executors.cli import add_generate_flags

    add_generate_flags(p)  # --shard, --executor, --ray-address, --shards
    p.set_defaults(func=cmd_generate)


def _add_personas(sub: Any) -> None:
    p = sub.add_parser("personas", help="sample, validate and craft personas only")
    p.add_argument("--n", type=int, required=True, help="number of personas")
    p.add_argument("--out", type=Path, required=True, help="output Parquet file")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--schema", type=Path, help="persona schema (default: schemas/persona.yaml)")
    p.set_defaults(func=cmd_personas)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="spasm",
        description="Persona-driven Client/Responder dialogue simulation into Parquet datasets.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_generate(sub)
    _add_personas(sub)
    from spasm.evaluation.cli import register as register_eval
    from spasm.harness.cli import register as register_harness

    register_harness(sub)
    register_eval(sub)
    from spasm.export.cli import register as register_export
    register_export(sub)
    from spasm.executors.cli import register as register_merge
    register_merge(sub)
    from spasm.viewer.cli import register as register_view
    register_view(sub)
    return parser


def resolve_config(args: argparse.Namespace) -> Any:
    """The run config after applying command-line overrides (validated again)."""
    from spasm.config import data_path, load_config, parse_config

    source = args.config or data_path("configs", "smoke.yaml")
    data = load_config(source).model_dump(mode="json")
    if args.base_url or args.model:
        if not (args.base_url and args.model):
            raise UserError("--base-url and --model go together (the endpoint and its model)")
        backend: dict[str, Any] = {
            "kind": "openai", "base_url": args.base_url, "model": args.model,
            "api_key_env": args.api_key_env,
        }
        if args.concurrency:
            backend["max_concurrency"] = args.concurrency
        data["backends"] = {"endpoint": backend}
        data["pairings"] = [{"client": "endpoint", "responder": "endpoint"}]
        data["personas"]["backend"] = None
        data["termination"]["judge_backend"] = None
    elif args.api_key_env or args.concurrency:
        raise UserError("--api-key-env and --concurrency apply with --base-url/--model")
    if args.personas is not None:
        data["personas"]["n"] = args.personas
    if args.conversations_per_persona is not None:
        data["conversations_per_persona"] = args.conversations_per_persona
    if args.condition:
        data["conditions"] = ["ecp", "concat"] if args.condition == "both" else [args.condition]
    if args.seed is not None:
        data["seed"] = args.seed
    if args.name:
        data["name"] = args.name
    if args.max_cost is not None:
        data["engine"]["max_cost"] = args.max_cost
    if args.max_tokens is not None:
        data["engine"]["max_tokens"] = args.max_tokens
    return parse_config(data, f"{source} (with command-line options)")


def cmd_generate(args: argparse.Namespace) -> int:
    import anyio

    from spasm.engine import Engine

    config = resolve_config(args)
    run_dir = args.out or Path("runs") / config.name
    from spasm.executors.cli import generate_with_ray, shard_of

    if args.executor == "ray":
        return generate_with_ray(args, config, run_dir)
    if args.resume and not (run_dir / "config.json").exists():
        raise UserError(f"--resume: {run_dir} holds no run to resume")
    engine = Engine(
        config, run_dir, overwrite=args.overwrite, progress=False if args.no_progress else None,
        shard=shard_of(args),
    )
    if args.pilot and not args.dry_run:
        raise UserError("--pilot goes with --dry-run")
    if args.dry_run:
        from spasm.estimate import format_estimates

        dry = anyio.run(lambda: engine.dry_run(args.pilot))
        print(format_estimates(dry))
        if dry.calibration is None:
            print("This is an upper bound. Add --pilot N to calibrate on N real dialogues.")
        return RUN_EXIT["ok"]
    try:
        summary = anyio.run(engine.run)
    except KeyboardInterrupt:
        print(
            f"\nInterrupted. Completed dialogues are saved in {run_dir}. "
            "Run the same command again to resume.",
            file=sys.stderr,
        )
        return RUN_EXIT["interrupted"]
    tables = ", ".join(sorted(p.name for p in run_dir.glob("*.parquet")))
    print(f"Dataset: {run_dir} ({tables})")
    print(summary.line())
    if summary.stopped:
        print(f"Stopped early: {summary.stopped}. Raise the cap and rerun the same command to "
              "continue.", file=sys.stderr)
        return RUN_EXIT["budget"]
    if summary.failed:
        print(f"run failed: {summary.failed}", file=sys.stderr)
        return RUN_EXIT["failed"]
    if summary.completed < summary.planned:
        print(f"{summary.planned - summary.completed} dialogues are not done (see the errors "
              "table); rerun the same command to retry them.", file=sys.stderr)
        return RUN_EXIT["failed"]
    return RUN_EXIT["ok"]


def cmd_personas(args: argparse.Namespace) -> int:
    import anyio

    from spasm.dataset.files import atomic_write_table
    from spasm.dataset.rows import persona_row_model, rejection_row_model
    from spasm.dataset.store import rows_to_table
    from spasm.personas import build_personas, load_schema

    if args.n < 1:
        raise UserError("--n must be at least 1")
    out: Path = args.out
    if out.is_dir():
        raise UserError(f"--out {out} is a directory; name the .parquet file to write.")
    schema = load_schema(args.schema)
    result = anyio.run(lambda: build_personas(schema, args.n, args.seed))
    names, ints = schema.field_names, schema.integer_fields()
    rejected_out = out.with_name(out.stem + ".rejected.parquet")
    atomic_write_table(out, rows_to_table("personas", persona_row_model(names, ints), result.accepted))
    atomic_write_table(rejected_out, rows_to_table(
        "persona_rejections", rejection_row_model(names, ints), result.rejected))
    print(f"{len(result.accepted)} personas → {out}; {len(result.rejected)} rejected candidates "
          f"(with reasons) → {rejected_out}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if args.command is None:
        parser.print_help()
        return RUN_EXIT["usage"]
    try:
        code: int = args.func(args)
        return code
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return RUN_EXIT["usage"]
    except SpasmError as exc:
        print(f"run failed: {exc}", file=sys.stderr)
        return RUN_EXIT["failed"]


def entrypoint() -> None:
    """Console-script entry point."""
    sys.exit(main())
