"""``spasm eval`` and its sibling sub-commands run in-process, as ``spasm/cli.py`` wires them."""

from __future__ import annotations

import argparse

from spasm.evaluation.cli import register


def eval_cli(argv: list[str]) -> int:
    """Parse ``argv`` with the evaluation sub-commands registered and run the chosen one."""
    parser = argparse.ArgumentParser(prog="spasm")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code
