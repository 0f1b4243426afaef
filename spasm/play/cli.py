"""The ``play`` sub-command (wired in by ``spasm/cli.py`` through :func:`register`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from spasm.errors import UserError

__all__ = ["cmd_play", "register"]


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add ``play`` to the main parser."""
    p = subparsers.add_parser(
        "play",
        help="take a seat of a dialogue yourself, in the terminal (the config's agents play the rest)",
        description="A person takes one seat of a config's dialogue (a kind: human backend); every "
        "other seat is the config's agent, through the same engine, caller, cache, limits and "
        "harness. You see what the seat would see (a client seat's card and goal, then the "
        "conversation) and type one line a turn; /end, Ctrl-D or Ctrl-C ends it and keeps what "
        "was said (ended_by_person). A pipe on stdin works too. The result is a run like any "
        "other in --out.",
    )
    p.add_argument("run_dir", metavar="RUN", type=Path, nargs="?",
                   help="a run directory whose config (and personas) to play (or --config)")
    p.add_argument("--config", type=Path, help="run config (YAML); default: the bundled smoke "
                   "config (the embedded model, offline)")
    p.add_argument("--seat", required=True, help="client or responder (a group config: a "
                   "participant id)")
    p.add_argument("--persona", help="the persona to play or meet: its id, the start of it "
                   "(p0002) or its 0-based index (default: the first)")
    p.add_argument("--scenario", help="a scenario id of the config (default: its first)")
    p.add_argument("--condition", help="ecp, concat or quoted (default: the config's first)")
    p.add_argument("--operator", help="your pseudonym in the run (default: a fresh op-xxxxxx; "
                   "never your real name unless you type it here)")
    p.add_argument("--idle-timeout", metavar="DURATION",
                   help="end the dialogue (keeping what was said; termination_reason "
                   "person_silent) when no line comes this long after a prompt: seconds or 30m, "
                   "1h (default: wait as long as it takes)")
    p.add_argument("--out", type=Path, required=True, help="run directory for the session")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it holds a run")
    p.set_defaults(func=cmd_play)


def _load(args: argparse.Namespace) -> Any:
    from spasm.config import data_path, load_config, parse_config

    if args.run_dir is not None and args.config is not None:
        raise UserError("give a RUN or --config, not both")
    if args.run_dir is None:
        return load_config(args.config or data_path("configs", "smoke.yaml"))
    cfg = args.run_dir / "config.json"
    try:
        stored = json.loads(cfg.read_text(encoding="utf-8"))
        return parse_config(stored["config"], str(cfg))
    except FileNotFoundError:
        raise UserError(f"{args.run_dir} holds no run (no config.json); give a run directory "
                        "or --config FILE") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise UserError(f"{cfg} cannot be read ({exc}); give --config FILE instead") from None


def _stored_operator(out: Path) -> str | None:
    """The pseudonym of the play run in ``out``, so rerunning the same command resumes it (the
    models' replies come back from its cache) instead of being refused as another config."""
    try:
        stored = json.loads((out / "config.json").read_text(encoding="utf-8"))
        backends = stored["config"]["backends"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    found = [b.get("operator") for b in backends.values()
             if isinstance(b, dict) and b.get("kind") == "human"]
    return found[0] if found and isinstance(found[0], str) else None


def _idle_timeout(text: str | None) -> float | None:
    """``--idle-timeout``: seconds (``90``) or a duration (``30m``, ``1h``, ``1h30m``)."""
    from spasm.limits import parse_duration

    if text is None:
        return None
    seconds = parse_duration(text)
    if seconds is None or seconds <= 0:
        raise UserError(f"--idle-timeout {text!r}: give a positive duration, e.g. 90 (seconds), "
                        "30m or 1h")
    return seconds


def cmd_play(args: argparse.Namespace) -> int:
    import anyio

    from spasm.exits import RUN_EXIT, interrupted, outcome_code
    from spasm.play.session import new_operator, personas_of, pick_persona, play, play_config
    from spasm.play.terminal import TerminalPerson, duration_text

    config = _load(args)
    operator = args.operator or (None if args.overwrite else _stored_operator(args.out)) or new_operator()
    persona_id = None
    if config.participants is None:
        personas = anyio.run(personas_of, config,
                             args.run_dir if args.run_dir is not None else args.out)
        persona_id = pick_persona([p.id for p in personas], args.persona)
    elif args.persona is not None:
        raise UserError("--persona: a group config draws its seats' personas; leave it out")
    setup = play_config(config, args.seat, persona_id=persona_id, scenario=args.scenario,
                        condition=args.condition, operator=operator)
    idle = _idle_timeout(args.idle_timeout)
    person = TerminalPerson(idle_timeout_s=idle)
    for note in setup.notes:
        person.say(f"note: {note}")
    person.say(f"You take the {setup.seat} seat as {operator}; the others are "
               f"{setup.replaced} (the config's agents). Saving to {args.out}.")
    person.say("No time limit: the conversation waits for your line as long as it takes."
               if idle is None else
               f"If you send no line for {duration_text(idle)} after a prompt, the conversation ends there "
               "and what was said is kept.")
    try:
        with person.signals():
            summary = anyio.run(lambda: play(setup, person, args.out, overwrite=args.overwrite))
    except KeyboardInterrupt:
        return interrupted(args.out)
    code = outcome_code(summary)
    if code != RUN_EXIT["ok"]:
        return code
    if summary.completed < summary.planned:
        person.say(f"The dialogue was not saved (see {args.out}/errors.parquet); rerun the same "
                   "command to play it again.")
        return RUN_EXIT["failed"]
    person.say(f"Saved: {args.out} ({summary.line()})")
    return RUN_EXIT["ok"]
