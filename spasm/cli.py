"""The command line: a thin layer over the library. ``main(argv) -> int``.

Exit codes: 0 done; 1 the run failed; 2 bad input (config, flags, environment); 3 stopped at a
budget cap (resume with a higher cap); 130 interrupted (rerun the same command to resume).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import errno
import logging
import os
import re
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from spasm.errors import ConfigError, SpasmError, UserError, disk_full
from spasm.exits import RUN_EXIT, TERMINATION, interrupted, outcome_code

log = logging.getLogger("spasm")



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
    p.add_argument("--personas-from", type=Path, metavar="FILE",
                   help="personas from a CSV, JSONL or Parquet file or a datasets directory "
                   "(every row unless --personas N)")
    p.add_argument("--conversations-per-persona", type=int, metavar="K")
    p.add_argument("--trials", type=int, metavar="K",
                   help="run every planned dialogue K times, each with its own seed (pass^k)")
    p.add_argument("--condition", metavar="CONDITION",
                   help="ecp, concat, quoted or a plugin's projection; both: ecp and concat; "
                   "all: ecp, concat and quoted")
    p.add_argument("--seed", type=int)
    p.add_argument("--name", help="run name (default from the config)")
    q = p.add_argument_group("quick start: one OpenAI-compatible endpoint for every role")
    q.add_argument("--base-url", help="e.g. https://api.openai.com/v1 or http://localhost:8000/v1")
    q.add_argument("--model", help="model name at that endpoint")
    q.add_argument("--api-key-env", metavar="VAR", help="NAME of the env var holding the key")
    q.add_argument("--concurrency", type=int, metavar="C", help="requests in flight (default 16)")
    q.add_argument("--timeout", type=float, metavar="S",
                   help="seconds to wait for one model call (every backend; default 60)")
    q.add_argument("--max-attempts", type=int, metavar="N",
                   help="attempts per call, retries included (every backend; default 6)")
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
    p = sub.add_parser("personas", help="sample, validate and craft personas only, or preview "
                       "personas from a data file (--from)")
    p.add_argument("--n", type=int, help="number of personas (with --from: default every row)")
    p.add_argument("--out", type=Path, help="output Parquet file (optional with --from)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    p.add_argument("--from", dest="source", type=Path, metavar="FILE",
                   help="preview personas from a CSV, JSONL or Parquet file or a datasets directory")
    p.add_argument("--field-map", action="append", default=[], metavar="COLUMN=FIELD",
                   help="with --from: read COLUMN as FIELD (repeatable)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--schema", type=Path, help="persona schema (default: schemas/persona.yaml)")
    p.set_defaults(func=cmd_personas)


def _spasm_version() -> str:
    from spasm.plugins import installed_version

    return installed_version("spasm") or "(not installed)"


def _add_status(sub: Any) -> None:
    p = sub.add_parser("status", help="where a run stands: done, quarantined, to do, tokens, cost, "
                       "whether a process is writing it")
    p.add_argument("run_dir", metavar="RUN_DIR", type=Path)
    p.set_defaults(func=cmd_status)


def cmd_status(args: argparse.Namespace) -> int:
    from spasm.status import run_status

    status = run_status(args.run_dir)
    for line in status.lines():
        print(line)
    # A damaged run is not a healthy one: scripts that check the exit code must see it.
    return RUN_EXIT["failed"] if status.damaged else RUN_EXIT["ok"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="spasm",
        description="Persona-driven Client/Responder dialogue simulation into Parquet datasets.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--version", action="version", version=f"spasm {_spasm_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_generate(sub)
    _add_personas(sub)
    _add_status(sub)
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
    from spasm.play.cli import register as register_play
    register_play(sub)
    sub.choices["view"].set_defaults(extend_app=_play_pages)  # /play: a seat in the browser
    return parser


def _play_pages(app: Any, viewer: Any) -> None:
    """``spasm view``'s play pages (the viewer imports no engine: they come from here)."""
    from spasm.play.web import add_play_routes

    add_play_routes(app, viewer)


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
        if args.concurrency is not None:
            backend["max_concurrency"] = args.concurrency
        data["backends"] = {"endpoint": backend}
        data["pairings"] = [{"client": "endpoint", "responder": "endpoint"}]
        data["personas"]["backend"] = None
        data["termination"]["judge_backend"] = None
    elif args.api_key_env or args.concurrency is not None:
        raise UserError("--api-key-env and --concurrency apply with --base-url/--model")
    for b in data["backends"].values():
        if args.timeout is not None:
            b["timeout_s"] = args.timeout
        if args.max_attempts is not None:
            b["max_attempts"] = args.max_attempts
    if args.personas_from is not None:
        if data["personas"].get("source") is None:
            data["personas"]["n"] = None  # the config's n counts sampled personas: every row
        data["personas"]["source"] = str(args.personas_from)
    if args.personas is not None:
        data["personas"]["n"] = args.personas
    if args.conversations_per_persona is not None:
        data["conversations_per_persona"] = args.conversations_per_persona
    if args.condition:
        data["conditions"] = _conditions(args.condition)
    if args.seed is not None:
        data["seed"] = args.seed
    if args.trials is not None:
        data["trials"] = args.trials
    if args.name:
        data["name"] = args.name
    if args.max_cost is not None:
        data["engine"]["max_cost"] = args.max_cost
    if args.max_tokens is not None:
        data["engine"]["max_tokens"] = args.max_tokens
    try:
        return parse_config(data, f"{source} (with command-line options)")
    except ConfigError as exc:
        raise ConfigError(_name_flags(str(exc), args)) from None


def _conditions(flag: str) -> list[str]:
    """What ``--condition`` names: one projection (a built-in's or a plugin's: the registry
    knows both), ``both`` (ECP and CONCAT) or ``all`` (every built-in condition)."""
    from spasm.registry import BUILTIN_CONDITIONS, PROJECTIONS, ordered_conditions

    shorthands = {"both": list(BUILTIN_CONDITIONS[:2]), "all": list(BUILTIN_CONDITIONS)}
    if flag in shorthands:
        return shorthands[flag]
    if flag not in PROJECTIONS:
        raise UserError(f"--condition {flag}: no such projection; choose one of "
                        f"{', '.join([*ordered_conditions(PROJECTIONS.names()), 'both', 'all'])}")
    return [flag]


#: Config fields that command-line flags set, so errors name the flag the user typed.
_FLAG_FIELDS = {
    "personas.n": "--personas", "conversations_per_persona": "--conversations-per-persona",
    "seed": "--seed", "trials": "--trials", "name": "--name", "engine.max_cost": "--max-cost",
    "engine.max_tokens": "--max-tokens", "backends.endpoint.max_concurrency": "--concurrency",
    "backends.endpoint.base_url": "--base-url", "backends.endpoint.model": "--model",
    "backends.endpoint.api_key_env": "--api-key-env",
}


def _name_flags(message: str, args: argparse.Namespace) -> str:
    given = {"personas": "--personas", "conversations_per_persona": "--conversations-per-persona",
             "seed": "--seed", "trials": "--trials", "name": "--name", "max_cost": "--max-cost",
             "max_tokens": "--max-tokens", "concurrency": "--concurrency", "base_url": "--base-url",
             "model": "--model", "api_key_env": "--api-key-env", "timeout": "--timeout",
             "max_attempts": "--max-attempts"}
    used = {flag for attr, flag in given.items() if getattr(args, attr, None) is not None}
    for field_path, flag in _FLAG_FIELDS.items():
        if flag in used:
            message = message.replace(f"  - {field_path}:", f"  - {flag} ({field_path}):")
    for option, key in (("--timeout", "timeout_s"), ("--max-attempts", "max_attempts")):
        if option in used:
            message = re.sub(rf"  - (backends\.\w+\.{key}):", rf"  - {option} (\1):", message)
    return message


def cmd_generate(args: argparse.Namespace) -> int:
    import anyio

    from spasm.engine import Engine

    if args.resume and args.overwrite:
        raise UserError("--resume continues the run in --out and --overwrite replaces it; "
                        "choose one")
    if args.pilot < 0:
        raise UserError(f"--pilot {args.pilot}: the number of real dialogues to calibrate on "
                        "must be 0 or more")
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
        return interrupted(run_dir)
    tables = ", ".join(sorted(p.name for p in run_dir.glob("*.parquet")))
    print(f"Dataset: {run_dir} ({tables})")
    print(summary.line())
    code = outcome_code(summary)
    if code != RUN_EXIT["ok"]:
        return code
    if summary.completed < summary.planned:
        print(f"{summary.planned - summary.completed} dialogues are not done (see the errors "
              "table); rerun the same command to retry them.", file=sys.stderr)
        return RUN_EXIT["failed"]
    return RUN_EXIT["ok"]


def cmd_personas(args: argparse.Namespace) -> int:
    import anyio

    from spasm.config import SEED_MAX, SEED_MIN
    from spasm.dataset.outputs import check_output
    from spasm.persona_stage import build_personas
    from spasm.personas import load_schema

    if args.n is None and args.source is None:
        raise UserError("spasm personas needs --n N (personas to sample), or --from FILE")
    if args.n is not None and not 1 <= args.n <= 1_000_000:
        raise UserError("--n must be between 1 and 1,000,000 (personas are held in memory)")
    if not SEED_MIN <= args.seed <= SEED_MAX:
        raise UserError(f"--seed must be between {SEED_MIN} and {SEED_MAX} (a 64-bit integer).")
    if args.source is not None:
        return _personas_from(args)
    if args.field_map:
        raise UserError("--field-map goes with --from FILE")
    if args.out is None:
        raise UserError("spasm personas --n N needs --out FILE (the Parquet file to write)")
    out: Path = args.out
    rejected_out = out.with_name(out.stem + ".rejected.parquet")
    for path in (out, rejected_out):  # never into a run's tables or over its files
        check_output(path, "personas", overwrite=args.overwrite)
    schema = load_schema(args.schema)
    result = anyio.run(lambda: build_personas(schema, args.n, args.seed))
    _write_personas((out, rejected_out), schema, result, source=False)
    print(f"{len(result.accepted)} personas → {out}; {len(result.rejected)} rejected candidates "
          f"(with reasons) → {rejected_out}")
    return 0


def _personas_from(args: argparse.Namespace) -> int:
    """``spasm personas --from FILE``: how the file's columns are read, what is rejected and
    why, and the first cards; with ``--out`` the personas (and rejected rows) as Parquet. No
    model is called: a free-text row's missing drift dimensions are extracted by a run."""
    import anyio

    from spasm.dataset.outputs import check_output
    from spasm.persona_stage import build_source_personas
    from spasm.personas import load_schema
    from spasm.personas.sources import load_source

    field_map: dict[str, str] = {}
    for item in args.field_map:
        column, eq, target = str(item).partition("=")
        if not eq or not column.strip() or not target.strip():
            raise UserError(f"--field-map {item!r}: write COLUMN=FIELD, e.g. job_title=occupation")
        field_map[column.strip()] = target.strip()
    outs: list[Path] = []
    if args.out is not None:
        outs = [args.out, args.out.with_name(args.out.stem + ".rejected.parquet")]
        for path in outs:
            check_output(path, "personas", overwrite=args.overwrite)
    schema = load_schema(args.schema)
    source = load_source(args.source, schema, field_map)
    chosen = source.sample(args.n, args.seed)
    result = anyio.run(lambda: build_source_personas(schema, source, chosen, args.seed))
    for line in source.describe():
        print(line)
    extract = sum(1 for c in chosen if c.missing_dimensions(schema))
    if extract:
        print(f"  {extract} persona(s) lack a drift dimension; a run extracts it from the card "
              "(one structured call each, cached)")
    from spasm.redact import terminal_safe

    for persona in result.accepted[:3]:
        print(f"  {persona.id} (source_id {terminal_safe(str(persona.source_id))}): "
              f"{terminal_safe(persona.card[:160])}")
    if outs:
        _write_personas((outs[0], outs[1]), schema, result, source=True)
        print(f"{len(result.accepted)} personas → {outs[0]}; {len(result.rejected)} rejected "
              f"rows (with reasons) → {outs[1]}")
    return RUN_EXIT["ok"]


def _write_personas(outs: tuple[Path, Path], schema: Any, result: Any, *, source: bool) -> None:
    """``spasm personas --out FILE``: the accepted personas to FILE and the rejected candidates
    (with their reasons) to ``FILE.rejected.parquet``, as the run's own two tables; ``source``:
    personas read from a data file (their ``source_id`` columns)."""
    from spasm.dataset.files import atomic_write_table
    from spasm.dataset.persona_rows import persona_record, persona_row_model, rejection_row_model
    from spasm.dataset.store import rows_to_table

    names, ints = schema.field_names, schema.integer_fields()
    atomic_write_table(outs[0], rows_to_table(
        "personas", persona_row_model(names, ints, source=source),
        [persona_record(p) for p in result.accepted]))
    atomic_write_table(outs[1], rows_to_table(
        "persona_rejections", rejection_row_model(names, ints, source=source), result.rejected))


class _Terminated(Exception):
    """Marks that the interrupt came from SIGTERM (exit 143), not Ctrl-C (130)."""


class _ClosedPipeSafe:
    """stdout that outlives its reader (``spasm export … | head``): once the pipe is closed,
    further output goes to /dev/null and the command ends with its own exit code, not a
    ``BrokenPipeError`` (a closed pipe is not a failed run)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def _drop(self) -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self._stream.fileno())
        os.close(devnull)

    def write(self, text: str) -> int:
        try:
            return int(self._stream.write(text))
        except BrokenPipeError:
            self._drop()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._drop()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _on_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM (schedulers, containers, ``timeout``) is handled like Ctrl-C: the running loop is
    cancelled, finished dialogues are flushed, and the exit says how to resume."""
    TERMINATION.by_sigterm = True
    signal.default_int_handler(signal.SIGINT, frame)


#: errno values that mean the user pointed spasm at a place it cannot write (exit 2).
_INPUT_ERRNOS = {errno.ENOTDIR, errno.EISDIR, errno.EROFS, errno.EACCES, errno.EPERM,
                 errno.ENOENT, errno.EEXIST, errno.ENAMETOOLONG}


def _os_error(exc: OSError) -> tuple[str, int]:
    where = f" {exc.filename}" if exc.filename else ""
    if disk_full(exc):
        return (f"no space left on the device{' writing' + where if where else ''}. Free some "
                "space and rerun the same command: committed work is kept.", RUN_EXIT["failed"])
    if exc.errno in _INPUT_ERRNOS:
        return (f"cannot write{where}: {exc.strerror}. Choose another --out (a writable "
                "directory).", RUN_EXIT["usage"])
    return f"file system error{where}: {exc.strerror or exc}", RUN_EXIT["failed"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code. Every expected failure ends here as a message and an
    exit code (see the README's table), never a traceback."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if args.command is None:
        parser.print_help()
        return RUN_EXIT["usage"]
    TERMINATION.by_sigterm = False
    previous = signal.getsignal(signal.SIGTERM)
    in_main_thread = signal.getsignal(signal.SIGINT) is not None
    try:
        if in_main_thread:
            signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:  # not the main thread (tests): leave signals alone
        in_main_thread = False
    guard = sys.stdout is sys.__stdout__ and sys.stdout is not None
    if guard:
        sys.stdout = _ClosedPipeSafe(sys.stdout)
    try:
        from spasm.plugins import load_plugins

        load_plugins()  # once, before any config is read: a broken plugin is exit 2 here
        code: int = args.func(args)
        sys.stdout.flush()
        return code
    except KeyboardInterrupt:
        print("\nStopped by SIGTERM." if TERMINATION.by_sigterm else "\nInterrupted.", "Nothing committed "
              "is lost; rerun the same command to resume.", file=sys.stderr)
        return RUN_EXIT["terminated" if TERMINATION.by_sigterm else "interrupted"]
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return RUN_EXIT["usage"]
    except SpasmError as exc:
        print(f"run failed: {exc}", file=sys.stderr)
        return RUN_EXIT["failed"]
    except OSError as exc:
        message, code = _os_error(exc)
        print(f"error: {message}" if code == RUN_EXIT["usage"] else f"run failed: {message}",
              file=sys.stderr)
        return code
    finally:
        if guard:
            sys.stdout.flush()
            sys.stdout = sys.__stdout__
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)


def entrypoint() -> None:
    """Console-script entry point."""
    code = main()
    # The command is done, but Python's shutdown can take a second, and it restores the default
    # SIGTERM action early: a SIGTERM then would end a finished command as "killed" (143, after
    # `spasm merge` printed "merged"). Until the atexit handlers, SIGTERM exits at once with the
    # command's own code; from them on (the teardown) it is ignored: Python leaves an ignored
    # signal ignored (a mask would not do: library threads would still take the signal).
    with contextlib.suppress(ValueError):
        signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(code))
        atexit.register(signal.signal, signal.SIGTERM, signal.SIG_IGN)
    sys.exit(code)
