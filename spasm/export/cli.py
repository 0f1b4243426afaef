"""The ``export``, ``qa`` and ``card`` sub-commands (wired in by ``spasm/cli.py`` through
:func:`register`)."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from spasm.errors import UserError

__all__ = ["cmd_card", "cmd_export", "cmd_qa", "register"]

_ROLES = ("responder", "client", "both")


def _listed(values: list[str] | None) -> list[str]:
    """Flags given several times and/or as comma lists → one list."""
    return [v.strip() for value in values or [] for v in value.split(",") if v.strip()]


def _add_export(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "export",
        help="training-ready files (OpenAI JSONL, ShareGPT, HF Parquet) with QA and a dataset card",
        description="Export a finished run for fine-tuning: QA scans (findings to RUN_DIR/qa.parquet), "
        "redaction of contact-like strings, a persona-level split and a dataset card (README.md). "
        "`spasm export --check FILE` checks an OpenAI chat JSONL file instead.",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", type=Path, nargs="?", help="run directory (runs/<name>)")
    p.add_argument("--out", type=Path, help="output directory (must not exist, or --overwrite)")
    p.add_argument("--format", action="append", metavar="NAME",
                   help="openai, sharegpt or hf; repeat or comma-separate (default: all three)")
    p.add_argument("--role", default="responder", help="whose turns are the assistant's: "
                   "responder (default), client (a user simulator) or both; in a group run also a "
                   "participant id (its frame; client/responder: every seat of that role)")
    p.add_argument("--split", default="0.9,0.05,0.05", help="train,validation,test fractions by persona")
    p.add_argument("--seed", type=int, help="seed of the split (default: the run's seed)")
    p.add_argument("--system-prompt", default=None,
                   help="the role's system prompt: keep (default), merge into the first user message "
                   "(chat templates without a system role, e.g. Gemma's) or drop")
    p.add_argument("--no-system-prompt", action="store_true", help="the same as --system-prompt drop")
    p.add_argument("--ending", default="trim",
                   help="trim (default): every example ends on a turn of the role it trains; keep: the "
                   "partner's turns after it stay")
    p.add_argument("--weights", action="store_true",
                   help="mask flagged turns in every format: weight 0/1 on assistant messages (openai, hf), "
                   "ShareGPT examples cut before their first flagged turn")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output directory")
    p.add_argument("--allow-unfinished", action="store_true", help="export a run that is not complete")
    p.add_argument("--license", help="license id for the card (default: the run config's, else unknown)")
    p.add_argument("--language", default="en", help="language code for the card (default en)")
    p.add_argument("--near-threshold", type=float, default=0.8, help="near-duplicate Jaccard (0.8)")
    s = p.add_argument_group("selection (repeat a flag or comma-separate values)")
    s.add_argument("--condition", action="append", help="keep these conditions (ecp, concat)")
    s.add_argument("--pairing", action="append", help="keep these pairings (client/responder)")
    s.add_argument("--harness-level", action="append", help="keep these harness levels (A-E)")
    s.add_argument("--termination", action="append", help="keep these termination reasons")
    s.add_argument("--min-utterances", type=int, metavar="N")
    s.add_argument("--max-utterances", type=int, metavar="N")
    s.add_argument("--allow-qa", action="append", metavar="KIND",
                   help="keep dialogues with findings of these kinds (default: dropped); 'all': any")
    s.add_argument("--only-qa", action="append", metavar="KIND",
                   help="keep only dialogues with a finding of these kinds")
    s.add_argument("--echoing", default="drop", help="dialogues spasm eval/annotators marked as echoing: "
                   "drop (default), keep, only")
    s.add_argument("--include-failed", action="store_true", help="keep dialogues whose status is not ok")
    s.add_argument("--include-human", action="store_true", help="keep dialogues with a person in a "
                   "seat (spasm play): left out by default, since people typed their turns")
    c = p.add_argument_group("checking")
    c.add_argument("--check", type=Path, metavar="FILE", help="check an OpenAI chat JSONL file")
    c.add_argument("--token-limit", type=int, metavar="N",
                   help="fail examples over N tokens (default: only warn over 65536; the limit depends on "
                   "the model); with an export, its examples are checked too")
    h = p.add_argument_group("the Hugging Face Hub (pip install 'spasm[hub]')")
    h.add_argument("--push-to-hub", metavar="OWNER/NAME",
                   help="upload the export folder to this dataset repo once it passes OpenAI's checks")
    h.add_argument("--private", action="store_true", help="create the repo private")
    h.add_argument("--revision", metavar="BRANCH", help="upload to this branch (created if missing)")
    h.add_argument("--hub-token-env", default="HF_TOKEN", metavar="NAME",
                   help="environment variable holding the Hub token (default HF_TOKEN)")
    h.add_argument("--hub-endpoint", metavar="URL", help=argparse.SUPPRESS)  # a self-hosted Hub, the tests
    p.set_defaults(func=cmd_export)


def _selection(args: argparse.Namespace) -> Any:
    from spasm.export.select import Selection, qa_kinds

    def kinds(values: list[str] | None) -> list[str]:
        listed = _listed(values)
        return qa_kinds() if "all" in listed else listed

    if args.echoing not in ("drop", "keep", "only"):
        raise UserError(f"--echoing {args.echoing!r}: choose drop, keep or only")
    for flag in ("min_utterances", "max_utterances"):
        if getattr(args, flag) is not None and getattr(args, flag) < 0:
            raise UserError(f"--{flag.replace('_', '-')} must be 0 or more")
    return Selection(
        conditions=_listed(args.condition), pairings=_listed(args.pairing),
        harness_levels=_listed(args.harness_level), terminations=_listed(args.termination),
        min_utterances=args.min_utterances, max_utterances=args.max_utterances,
        allow_qa=kinds(args.allow_qa), only_qa=kinds(args.only_qa), echoing=args.echoing,
        include_failed=args.include_failed, include_human=args.include_human,
    )


def _check(args: argparse.Namespace) -> int:
    from spasm.export.check import check_openai_file

    if args.run_dir is not None or args.out is not None or args.push_to_hub is not None:
        raise UserError("--check FILE checks a file on its own; drop RUN_DIR, --out and --push-to-hub")
    report = check_openai_file(args.check, token_limit=args.token_limit)
    print(report.text())
    return 0 if report.passed else 1


def cmd_export(args: argparse.Namespace) -> int:
    """Export a run, or check a file with ``--check``."""
    if args.check is not None:
        return _check(args)
    from spasm.config import PARTICIPANT_ID
    from spasm.export.formats import format_names, get_format
    from spasm.export.pipeline import ExportOptions, export_run
    from spasm.export.split import parse_split

    if args.run_dir is None or args.out is None:
        raise UserError("spasm export needs RUN_DIR and --out DIR (or --check FILE)")
    if args.role not in _ROLES and not re.match(PARTICIPANT_ID, args.role):
        raise UserError(f"--role {args.role!r}: choose {', '.join(_ROLES)} or, in a group run, a "
                        "participant id")
    formats = _listed(args.format) or format_names()
    for name in formats:
        get_format(name)
    if not 0 < args.near_threshold <= 1:
        raise UserError("--near-threshold is a Jaccard similarity in (0, 1]")
    if args.system_prompt not in (None, "keep", "merge", "drop"):
        raise UserError(f"--system-prompt {args.system_prompt!r}: choose keep, merge or drop")
    if args.ending not in ("trim", "keep"):
        raise UserError(f"--ending {args.ending!r}: choose trim or keep")
    if args.no_system_prompt and args.system_prompt not in (None, "drop"):
        raise UserError(f"--no-system-prompt and --system-prompt {args.system_prompt} disagree; pass one")
    if args.token_limit is not None and args.token_limit < 1:
        raise UserError("--token-limit must be at least 1")
    if args.push_to_hub is None and (args.private or args.revision is not None):
        raise UserError("--private and --revision go with --push-to-hub OWNER/NAME")
    options = ExportOptions(
        formats=formats, role=args.role, split=parse_split(args.split), seed=args.seed,
        system_prompt="drop" if args.no_system_prompt else (args.system_prompt or "keep"), ending=args.ending,
        weights=args.weights, selection=_selection(args),
        allow_unfinished=args.allow_unfinished, overwrite=args.overwrite,
        near_threshold=args.near_threshold, license=args.license, language=args.language,
        token_limit=args.token_limit, push_to_hub=args.push_to_hub, private=args.private,
        revision=args.revision, hub_token_env=args.hub_token_env, hub_endpoint=args.hub_endpoint,
    )
    summary = export_run(args.run_dir, args.out, options)
    s = summary.stats
    print(f"Exported {s.examples} examples ({s.conversations} conversations, {s.personas} personas, "
          f"role {s.role}) to {summary.out}:")
    for f in summary.files:
        print(f"  {f}")
    print("splits: " + ", ".join(f"{k} {v.examples}" for k, v in s.splits.items()))
    from spasm.export.check import OPENAI_MIN_EXAMPLES

    small = {k: v.examples for k, v in s.splits.items() if v.examples < OPENAI_MIN_EXAMPLES}
    if small and "openai" in s.formats:
        print("warning: " + ", ".join(f"the {k} split has {n} example{'s' * (n != 1)}"
                                        for k, n in small.items())
              + f", fewer than the {OPENAI_MIN_EXAMPLES} OpenAI's fine-tuning requires of a file: "
              "OpenAI will refuse it. Export more dialogues, or fold the small splits in (--split 1,0,0).",
              file=sys.stderr)
    dropped = sum(s.dropped.values())
    print(f"dropped {dropped} conversations" + (": " + ", ".join(f"{k} {v}" for k, v in s.dropped.items())
                                                if dropped else ""))
    print("redacted: " + (", ".join(f"{k} {v}" for k, v in s.redactions.items()) or "nothing"))
    print(f"QA findings: {args.run_dir / 'qa.parquet'} (spasm qa {args.run_dir} prints them)")
    if summary.check is not None:
        print(summary.check.text())
    if summary.hub_url is not None:
        print(f"uploaded to {summary.hub_url}")
    return 0


def cmd_qa(args: argparse.Namespace) -> int:
    """Scan a run, replace its qa table, print the summary."""
    from spasm.dataset import open_run
    from spasm.dataset.lock import RunLock
    from spasm.export.qa import check_finished, scan_run, summary_json, summary_table, write_qa

    run = open_run(args.run_dir)
    check_finished(run, args.allow_unfinished)
    with RunLock(run.dir):  # it writes qa.parquet into the run: one writer at a time
        result = scan_run(run, near_threshold=args.near_threshold)
        path = write_qa(run.dir, result, locked=True)
    print(summary_json(result.summary) if args.json else summary_table(result.summary))
    if not args.json:
        print(f"{len(result.rows)} findings → {path}")
    return 0


def cmd_card(args: argparse.Namespace) -> int:
    """Print (or write) the dataset card of a whole run."""
    from spasm.dataset.files import atomic_write_text
    from spasm.dataset.outputs import check_output
    from spasm.export.runcard import run_card

    if args.out is not None:  # before the work: never into a run's tables or over its files
        check_output(args.out, "card", overwrite=args.overwrite, source=args.run_dir)
    text = run_card(args.run_dir, allow_unfinished=args.allow_unfinished, license=args.license,
                    language=args.language)
    if args.out is None:
        from spasm.redact import terminal_safe

        print(terminal_safe(text, keep="\n\t"), end="")
        return 0
    atomic_write_text(args.out, text)
    print(f"Wrote {args.out}")
    return 0


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add ``export``, ``qa`` and ``card`` to the main parser."""
    _add_export(subparsers)
    q = subparsers.add_parser("qa", help="QA scans of a run: findings to RUN_DIR/qa.parquet, a summary",
                              description="Scan every utterance and dialogue of a run for AI-identity and "
                              "system-prompt leakage, contact-like strings, empty turns, broken alternation, "
                              "duplicates and role flips; replace RUN_DIR/qa.parquet; print a summary.")
    q.add_argument("run_dir", metavar="RUN_DIR", type=Path)
    q.add_argument("--near-threshold", type=float, default=0.8, help="near-duplicate Jaccard (0.8)")
    q.add_argument("--allow-unfinished", action="store_true", help="scan a run that is not complete")
    q.add_argument("--json", action="store_true", help="print the summary as JSON")
    q.set_defaults(func=cmd_qa)
    c = subparsers.add_parser("card", help="the dataset card (README.md) of a run",
                              description="Statistics, coverage, generation settings, terminations and "
                              "QA results of a whole run, as a Hub dataset card (printed, or --out FILE).")
    c.add_argument("run_dir", metavar="RUN_DIR", type=Path)
    c.add_argument("--out", type=Path, help="write the card to this file")
    c.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    c.add_argument("--license", help="license id (default: the run config's, else unknown)")
    c.add_argument("--language", default="en", help="language code (default en)")
    c.add_argument("--allow-unfinished", action="store_true", help="describe a run that is not complete")
    c.set_defaults(func=cmd_card)
