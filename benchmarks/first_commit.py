"""When does a run's first dialogue become readable committed data, against its total run time?

Runs one config through :class:`spasm.engine.Engine` (as ``spasm generate`` does) into a fresh
run directory while a watcher thread polls it every ``--poll`` seconds with
:func:`spasm.open_run` (checksums verified) and counts the rows of its ``dialogues`` table: a
dialogue counts once a reader can open it, not when the engine finished it in memory. Prints
the commit timeline and, e.g.::

    first dialogue committed at 31.2 s of 612.4 s (5.1% of run time)

Time zero is just before ``Engine.run`` (preflight, personas and model loading count). The load
average before and after is printed with the figures: on a shared machine the run is slower,
but the *share* of run time is what the target is about (within the first tenth)::

    nohup .venv/bin/python benchmarks/first_commit.py configs/ecp-vs-concat.yaml \\
        --json /tmp/first_commit.json > /tmp/first_commit.log 2>&1 &
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import anyio

from spasm import load_config, open_run
from spasm.engine import FLUSH_AFTER_S, Engine, make_backends


def committed_dialogues(run_dir: Path) -> int | None:
    """Dialogues a reader sees in ``run_dir`` now (``None``: nothing readable yet)."""
    try:
        run = open_run(run_dir)
        return run.table("dialogues").num_rows if run.has("dialogues") else None
    except Exception:  # not yet created, or a part being compacted: poll again
        return None


class Watcher(threading.Thread):
    """Polls a run directory and records (seconds since ``t0``, dialogues readable)."""

    def __init__(self, run_dir: Path, t0: float, poll_s: float) -> None:
        super().__init__(daemon=True)
        self.run_dir, self.t0, self.poll_s = run_dir, t0, poll_s
        self.timeline: list[tuple[float, int]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.poll_s):
            self.sample()

    def sample(self) -> None:
        """Record the count if it changed since the last sample."""
        n = committed_dialogues(self.run_dir)
        if n is not None and (not self.timeline or n != self.timeline[-1][1]):
            self.timeline.append((round(time.perf_counter() - self.t0, 1), n))


def main() -> None:
    """Run the config, watch its commits and print the figures."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("config", type=Path)
    ap.add_argument("--out", type=Path, help="run directory (default: a fresh temporary one)")
    ap.add_argument("--poll", type=float, default=1.0, help="seconds between reads (1.0)")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    config = load_config(args.config)
    out = args.out or Path(tempfile.mkdtemp(prefix="first-commit-")) / config.name
    backends = make_backends(config)
    engine = Engine(config, out, overwrite=True, progress=False, backends=backends)
    in_flight = engine.dialogues_in_flight(backends)
    print(f"{args.config}: {out}; dialogues in flight: {in_flight}; "
          f"flush every {config.engine.flush_every} dialogues or {FLUSH_AFTER_S:.0f} s", flush=True)
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    watcher = Watcher(out, t0, args.poll)
    watcher.start()
    summary = anyio.run(engine.run)
    total = time.perf_counter() - t0
    watcher.stop.set()
    watcher.join()
    watcher.sample()
    timeline = watcher.timeline
    print(summary.line())
    for t, n in timeline:
        print(f"  {t:8.1f} s  {n:4d} dialogues readable")
    first = next((t for t, n in timeline if n > 0), None)
    figures: dict[str, Any] = {
        "config": str(args.config), "run_dir": str(out), "dialogues": summary.completed,
        "planned": summary.planned, "dialogues_in_flight": in_flight, "total_s": round(total, 1),
        "first_commit_s": first, "commits": len(timeline), "timeline": timeline,
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
    }
    if first is None:
        print(f"no dialogue was readable before the run ended ({total:.1f} s)")
    else:
        share = 100 * first / total
        figures["first_commit_share"] = round(share, 1)
        print(f"first dialogue committed at {first:.1f} s of {total:.1f} s ({share:.1f}% of run time)")
        half = next((t for t, n in timeline if n >= summary.planned / 2), None)
        if half is not None:
            print(f"half the dialogues readable at {half:.1f} s ({100 * half / total:.1f}%)")
    print(f"load average before {figures['loadavg_before']}, after {figures['loadavg_after']} "
          f"({os.cpu_count()} cores)")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
