"""Throughput of a 4-participant group run against a two-party run on the test server.

What it measures, in one process and one invocation (a 4-participant run's throughput
against the two-party engine on the test server, as a ratio measured in one run):

1. **Two-party**: N dialogues through :class:`spasm.engine.Engine`, ``max_concurrency`` C,
   ``termination.rules: false`` and ``dialogue.max_turns_per_agent`` U/2, so every dialogue is
   exactly U utterances (U calls).
2. **Group**: N group dialogues of four participants (three client seats and a facilitator,
   ``group.next_speaker: round_robin``, ``group.max_utterances`` U, rules off): the same U
   utterances per dialogue, the same C, the same number of dialogues in flight (the engine's
   default), the cache off in both. The round-robin policy makes no call of its own, so both runs
   make exactly N × U calls; what differs is the engine's work per utterance (four frames, the
   turn order, the participants table) and longer prompts (every participant's prompt names the
   others, and each sees every other turn as a message of its own).

Each is reported as utterances/s end to end (``Engine.run``'s wall time) and over the window from
the first call's start to the last call's end (from the run's ``calls`` table), as a ratio of the
bound C/L, and the group's as a ratio of the two-party run's: the figure this benchmark is for. The
test server (``python -m spasm.testing.server --latency L``, i.e. ``FaultPlan(latency_s=L)``)
runs in a subprocess so that its CPU is never charged to the engine, as in
``benchmarks/throughput.py``. Run it with::

    .venv/bin/python benchmarks/group_throughput.py                 # N=64, U=8, C=32, L=0.2
    .venv/bin/python benchmarks/group_throughput.py --repeat 3 --dialogues 128
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
from pathlib import Path
from typing import Any

import openai

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from benchmarks.throughput import (  # noqa: E402 - needs ROOT on sys.path
    Measure,
    server_process,
    timed_utterance_run,
    utterance_parser,
)

#: The group's seats: three people seeking help and one facilitator.
SEATS = [("Ana", "client"), ("Ben", "client"), ("Carla", "client"), ("Facilitator", "responder")]


def _base(base_url: str, concurrency: int) -> dict[str, Any]:
    return {
        "name": "bench",
        "seed": 7,
        "conditions": ["ecp"],
        "backends": {
            "srv": {"kind": "openai", "base_url": base_url, "model": "m", "max_concurrency": concurrency}
        },
        "termination": {"rules": False, "judge": False},
        "engine": {"cache": False},
    }


def two_party_config(base_url: str, dialogues: int, concurrency: int, utterances: int) -> dict[str, Any]:
    """Exactly ``dialogues`` dialogues of exactly ``utterances`` utterances (``utterances`` even)."""
    personas = max(d for d in range(1, 51) if dialogues % d == 0)
    return {
        **_base(base_url, concurrency),
        "personas": {"n": personas},
        "conversations_per_persona": dialogues // personas,
        "pairings": [{"client": "srv", "responder": "srv"}],
        "dialogue": {"max_turns_per_agent": utterances // 2, "max_tokens": 40},
    }


def group_config(base_url: str, dialogues: int, concurrency: int, utterances: int) -> dict[str, Any]:
    """Exactly ``dialogues`` 4-participant dialogues of exactly ``utterances`` utterances."""
    return {
        **_base(base_url, concurrency),
        "personas": {"n": 12},  # drawn three to a dialogue, never twice in one
        "participants": [
            {"id": pid, "role": role, "backend": "srv",
             **({"responder_role": "peer-support facilitator"} if role == "responder" else {})}
            for pid, role in SEATS
        ],
        "group": {"next_speaker": "round_robin", "max_utterances": utterances, "dialogues": dialogues},
        "dialogue": {"max_tokens": 40},
    }


def run_engine(data: dict[str, Any], dialogues: int, utterances: int) -> Measure:
    """One timed ``Engine.run`` of ``data`` (:func:`benchmarks.throughput.timed_utterance_run`):
    every utterance one successful call, all of them stored."""
    return timed_utterance_run(data, dialogues, dialogues * utterances, utterances)


def main(argv: list[str] | None = None) -> int:
    args = utterance_parser(__doc__).parse_args(argv)
    n, u, c, lat = args.dialogues, args.utterances, args.concurrency, args.latency
    if u < 2 or u % 2:
        raise SystemExit("--utterances must be even and at least 2 (two-party: U/2 turns per agent)")
    bound = c / lat
    print(f"spasm group throughput benchmark: N={n} dialogues × U={u} utterances = {n * u} utterances "
          f"(one call each), C={c}, L={lat * 1000:.0f} ms, bound C/L = {bound:.1f} utterances/s")
    print(f"machine: {os.cpu_count()} CPUs, Python {platform.python_version()}, openai {openai.__version__}, "
          f"load average {os.getloadavg()[0]:.2f} (other processes on these cores skew every figure)")
    # A dialogue is a chain of U calls whatever its number of participants; with C dialogues in
    # flight (the engine's default for one backend) a run takes at least ceil(N / C) chains of U × L.
    sched = n * u / (u * math.ceil(n / c) * c)
    print(f"schedule bound (whole rounds of L, {c} dialogues in flight): ≤ {sched:.3f} of C/L for both")
    runs: dict[str, list[Measure]] = {"two-party": [], "group": []}
    with server_process(lat) as srv:
        run_engine(two_party_config(srv.base_url, min(n, c), c, 2), min(n, c), 2)  # warm-up
        for _ in range(args.repeat):  # interleaved: a change in the machine's load hits both
            runs["two-party"].append(run_engine(two_party_config(srv.base_url, n, c, u), n, u))
            runs["group"].append(run_engine(group_config(srv.base_url, n, c, u), n, u))
    best = {k: max(v, key=lambda m: m.rate) for k, v in runs.items()}
    two, grp = best["two-party"], best["group"]
    print()
    print(f"Throughput at L = {lat * 1000:.0f} ms, C = {c} (bound {bound:.1f} utterances/s); "
          f"best of {args.repeat}")
    print(f"  {'':32} {'utt.':>6} {'wall s':>7} {'utt/s':>7} {'/ (C/L)':>8} {'window utt/s':>13} "
          f"{'/ (C/L)':>8} {'CPU ms/utt':>11}")
    for label, m in (("two-party (client + responder)", two), ("group (4 participants)", grp)):
        w = m.window_rate or 0.0
        print(f"  {label:32} {m.calls:>6} {m.wall_s:>7.2f} {m.rate:>7.1f} {m.rate / bound:>8.3f} "
              f"{w:>13.1f} {w / bound:>8.3f} {m.cpu_ms_per_call:>11.2f}")
    ratio, window_ratio = grp.rate / two.rate, (grp.window_rate or 0.0) / (two.window_rate or 1.0)
    print(f"  group / two-party: {ratio:.3f} end to end, {window_ratio:.3f} first call → last call")
    if args.repeat > 1:
        print("  all runs, utterances/s: " + "; ".join(
            f"{k} " + ", ".join(f"{m.rate:.1f}" for m in v) for k, v in runs.items()))
    if args.json:
        args.json.write_text(json.dumps({
            "args": {k: str(v) for k, v in vars(args).items()}, "bound": bound, "schedule_bound": sched,
            "two_party": vars(two) | {"rate": two.rate}, "group": vars(grp) | {"rate": grp.rate},
            "ratio": ratio, "window_ratio": window_ratio,
        }, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
