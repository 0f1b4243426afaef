"""Level E's tokens against level A's at several dialogue lengths, at a scripted checker profile.

For each length L (utterances) it runs one sweep ``harness.levels: [A, E]`` through
:class:`spasm.engine.Engine` against the loopback test server, whose replies come from
:class:`spasm.testing.checker_profile.CheckerProfile` (the checker passes ``--first-pass`` of the
drafts, ``--after-rewrite`` of the turns after one rewrite, flags the rest; everything else is
the server's default reply). Termination rules are off, so every dialogue has exactly L
utterances; the same personas and seeds run at both levels. It then reads the run's
``harness_report.json`` (:func:`spasm.harness.level_report.level_report`) and prints, per L, E's
ratio of summed tokens to A's (raw: prompt + completion tokens the server reported; measurement
and one-off policy calls excluded) and the cache-adjusted ratio (cached prompt tokens billed at
``1 - --cache-discount``), with the checker outcomes and calls per role::

    .venv/bin/python benchmarks/harness_cost.py                        # L = 10 20 50 100
    .venv/bin/python benchmarks/harness_cost.py --variants default     # today's design only
    .venv/bin/python benchmarks/harness_cost.py --lengths 50 --personas 4 --json /tmp/cost.json

By default the test server counts tokens with tiktoken (o200k_base; ``--tokens words`` for one
per word) and runs a provider-style prefix cache (:class:`spasm.testing.usage.Usage`), so the
raw figures are what an API reports and the cached tokens are what it reports as served from its
cache (``calls.cached_tokens``), billed at the backend's configured cached price,
``prices.cached_input_per_1m`` = ``1 - --cache-discount`` of the input price.
``--reply-words`` sets the length of the scripted free-text turns (default 45 words, about 55
tokens: what the embedded model writes at ``max_tokens`` 80); ``--reply-words 0`` keeps the
profile's short single lines (~13 words). Each row of :data:`VARIANTS` switches a design choice
on against the default, so the table shows what it moved, on the same personas and seeds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import time
from pathlib import Path
from typing import Any
from unittest import mock

import anyio
import pandas as pd

from spasm.config import parse_config
from spasm.engine import Engine
from spasm.harness.level_report import level_report
from spasm.testing import TestServer
from spasm.testing.checker_profile import CheckerProfile
from spasm.testing.usage import Usage


def sweep_config(base_url: str, utterances: int, personas: int, seed: int, max_tokens: int = 60,
                 cached_price: float = 0.5, **harness: Any) -> Any:
    """A run of both levels, ``utterances`` long, against one endpoint whose cached prompt
    tokens cost ``cached_price`` of an input token (the configured ``prices``)."""
    return parse_config({
        "name": f"cost-{utterances}", "seed": seed,
        "personas": {"n": personas}, "conditions": ["ecp"],
        "backends": {"srv": {"kind": "openai", "base_url": base_url, "model": "m",
                             "max_concurrency": 32,
                             "prices": {"input_per_1m": 1.0, "output_per_1m": 1.0,
                                        "cached_input_per_1m": cached_price}}},
        "pairings": [{"client": "srv", "responder": "srv"}],
        "dialogue": {"max_turns_per_agent": max(1, utterances // 2), "max_tokens": max_tokens},
        "termination": {"rules": False},
        "engine": {"cache": False},
        "harness": {"levels": ["A", "E"], **harness},
    })


#: Design choices, each switched on against the default: (module patches, harness config).
VARIANTS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    # The reducer is called before every own draft; the checker after it.
    "default": ({}, {}),
    # No reducer call when nothing in the new turn can move the state (a code screen).
    "screen": ({"spasm.harness.runtime.REDUCER_SCREEN": True}, {}),
    # The checker's call also proposes the state update: one call a turn instead of two.
    "merged": ({}, {"review": "merged"}),
    # Fold every utterance instead of every 4: a smaller window on average, but the record
    # (early in the prompt) changes every turn, so less of the reply prompt is a cached prefix.
    "stride1": ({}, {"stride": 1}),
}


def _patched(variant: str) -> contextlib.ExitStack:
    stack = contextlib.ExitStack()
    for target, value in VARIANTS[variant][0].items():
        stack.enter_context(mock.patch(target, value))
    return stack


def measure(utterances: int, args: argparse.Namespace, workdir: Path,
            variant: str = "default") -> dict[str, Any]:
    """One sweep at one length; E's ratios and what the checker did."""
    profile = CheckerProfile(args.first_pass, args.after_rewrite, seed=args.seed,
                             reply_words=args.reply_words or None)
    run = workdir / f"{variant}-L{utterances}"
    usage = Usage(tokens=args.tokens, prefix_cache=not args.no_prefix_cache)
    with TestServer(reply=profile, usage=usage) as srv:
        config = sweep_config(srv.base_url, utterances, args.personas, args.seed,
                              max_tokens=max(60, 2 * args.reply_words),
                              cached_price=1 - args.cache_discount, **VARIANTS[variant][1])
        start = time.perf_counter()
        with _patched(variant):
            summary = anyio.run(Engine(config, run, progress=False, sleep_scale=0.0).run)
        wall = time.perf_counter() - start
    if summary.completed != summary.planned:
        raise SystemExit(f"L={utterances}: {summary.line()}")
    report = level_report(run, cache_discount=args.cache_discount)
    ratio = report["token_ratio_vs_A"]["E"]
    calls = pd.read_parquet(run / "calls.parquet")
    dialogues = pd.read_parquet(run / "dialogues.parquet")
    level = calls.dialogue_id.map(dialogues.set_index("dialogue_id").harness_level)
    roles = calls[level == "E"].role.value_counts().to_dict()
    tokens = calls.assign(level=level, tokens=calls.prompt_tokens + calls.completion_tokens)
    by_role = tokens.groupby(["level", "role"]).tokens.sum()
    role_tokens = {f"{lv}:{role}": int(v) for (lv, role), v in by_role.items()}
    return {
        "variant": variant, "utterances": utterances, "pairs": ratio["pairs"],
        "raw_ratio": ratio["ratio_of_sums"], "cache_adjusted_ratio": ratio["cache_adjusted_ratio"],
        "cost_source": report["cost_source"],
        "checker": dict(profile.counts), "calls_per_role_E": roles,
        "tokens_per_level_role": role_tokens, "wall_s": round(wall, 1),
    }


def main() -> None:
    """Measure every length and print the table."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--lengths", type=int, nargs="+", default=[10, 20, 50, 100])
    ap.add_argument("--personas", type=int, default=3)
    ap.add_argument("--first-pass", type=float, default=0.85)
    ap.add_argument("--after-rewrite", type=float, default=0.12)
    ap.add_argument("--cache-discount", type=float, default=0.5,
                    help="share of a cached prompt token's price the provider waives")
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--reply-words", type=int, default=45,
                    help="words of each scripted turn (0: the profile's short single lines)")
    ap.add_argument("--tokens", choices=["tiktoken", "words"], default="tiktoken")
    ap.add_argument("--no-prefix-cache", action="store_true",
                    help="the server reports no cached tokens (the report falls back to its estimate)")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for variant, n in ((v, n) for v in args.variants for n in args.lengths):
            rows.append(measure(n, args, Path(tmp), variant))
            r = rows[-1]
            print(f"{variant:<8} L={n:>3}  E/A raw {r['raw_ratio']:.3f}  cache-adjusted "
                  f"{r['cache_adjusted_ratio']:.3f}  pairs {r['pairs']}  checker {r['checker']}  "
                  f"E calls {r['calls_per_role_E']}  ({r['wall_s']} s)", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
