"""Rate limits at full speed: throughput under 429s against the test server.

In one invocation, each part against ``spasm.testing.server`` at latency L (default 20 ms):

1. **Random 429 storm**: N dialogues through :class:`spasm.engine.Engine` (``max_concurrency``
   C, a fixed number of calls per dialogue, the cache off) against a clean server, then against
   one answering a random 20% of requests 429 without ``Retry-After`` (an overloaded provider:
   the share does not depend on the rate). Reports successful calls/s of each (end to end,
   ``Engine.run``'s wall time) and their ratio: goal ≥ 0.7, ideal 0.8 (a 429 costs about what
   an answer costs).
2. **A server-side request limit** (``--limit-rps``, a bucket of one second's worth refilled
   continuously; 429s with ``Retry-After`` / ``retry-after-ms``) and **a token limit**
   (``--limit-tps``, each request charged its prompt tokens plus ``max_tokens``), each with the
   ``x-ratelimit-*`` headers and without them (only the 429s say it): a run of M dialogues at
   concurrency 64 far above the limit. Reports the share of the limit reached (successful
   requests, or their tokens, over what the limit allows in the run's call window: the bucket's
   burst plus rate × window) and the share of requests refused: goal ≥ 0.9 and ≤ 10%.
3. **A 30-second burst of 429s** (every request refused, no ``Retry-After``) in the middle of a
   steady load of C callers through :class:`spasm.calls.Caller`: the time from the burst's end
   to the start of the first second (sliding in 50 ms steps) whose answers are back to 90% of
   the rate before it.

The servers of parts 1 and 2 run in a subprocess (``python -m spasm.testing.server``) so that
their CPU is never charged to the engine (``benchmarks/throughput.py``); part 3 switches the
plan of an in-process server. Run it with::

    .venv/bin/python benchmarks/ratelimit.py                 # about 3 minutes
    .venv/bin/python benchmarks/ratelimit.py --only storm --dialogues 64
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from benchmarks.throughput import engine_config, server_process  # noqa: E402 - needs ROOT on sys.path
from spasm.backends.base import ChatRequest  # noqa: E402
from spasm.backends.registry import make_backend  # noqa: E402
from spasm.calls import Caller, CallScope  # noqa: E402
from spasm.config import BackendConfig, parse_config  # noqa: E402
from spasm.engine import Engine  # noqa: E402
from spasm.testing import FaultPlan, TestServer  # noqa: E402


@dataclass
class Run:
    ok: int
    refused: int
    wall_s: float
    window_s: float
    tokens: int  # prompt + max_tokens of the successful calls, as the server charges them
    summary: str
    rate_limits: dict[str, Any]

    @property
    def rps(self) -> float:
        return self.ok / self.wall_s


def engine_run(base_url: str, dialogues: int, concurrency: int, turns: int) -> Run:
    """One Engine.run into a fresh directory; every planned dialogue must complete."""
    import pyarrow.parquet as pq

    data = engine_config(base_url, dialogues, concurrency, turns)
    config = parse_config(data, "<benchmark>")
    with tempfile.TemporaryDirectory(prefix="spasm-bench-") as tmp:
        run_dir = Path(tmp) / "run"
        t0 = time.perf_counter()
        summary = anyio.run(Engine(config, run_dir, progress=False).run)
        wall = time.perf_counter() - t0
        if summary.completed != dialogues or summary.errors:
            raise RuntimeError(f"engine run incomplete: {summary.line()}")
        calls = pq.read_table(run_dir / "calls.parquet").to_pandas()
        manifest = json.loads((run_dir / "manifest.json").read_text())
    ok = calls[calls.outcome == "ok"]
    start = calls.started_at.map(lambda t: t.timestamp())
    end = start + calls.latency_s
    max_tokens = data["dialogue"]["max_tokens"]
    return Run(
        ok=len(ok), refused=int((calls.outcome == "rate_limited").sum()), wall_s=wall,
        window_s=float(end.max() - start.min()),
        tokens=int(ok.prompt_tokens.sum()) + max_tokens * len(ok), summary=summary.line(),
        rate_limits=manifest.get("rate_limits", {}),
    )


def storm(args: argparse.Namespace) -> dict[str, Any]:
    cleans: list[Run] = []
    storms: list[Run] = []
    with server_process(args.latency) as srv, server_process(args.latency, "--rate-429", "0.2",
                                                             "--no-retry-after", "--seed", "3") as bad:
        engine_run(srv.base_url, min(args.dialogues, 16), args.concurrency, 2)  # warm-up
        for _ in range(args.repeat):  # alternated, so a busy moment of the machine hits both
            cleans.append(engine_run(srv.base_url, args.dialogues, args.concurrency, args.turns))
            storms.append(engine_run(bad.base_url, args.dialogues, args.concurrency, args.turns))
    clean = max(cleans, key=lambda r: r.rps)
    stormy = max(storms, key=lambda r: r.rps)
    ratio = stormy.rps / clean.rps
    print(f"\n1. random 20% 429 storm (no Retry-After), N={args.dialogues} dialogues × "
          f"{2 * args.turns} calls, C={args.concurrency}, L={args.latency * 1000:.0f} ms")
    print(f"   {'':26} {'ok calls':>8} {'429s':>6} {'wall s':>7} {'calls/s':>8}")
    for label, r in (("clean", clean), ("20% random 429s", stormy)):
        print(f"   {label:26} {r.ok:>8} {r.refused:>6} {r.wall_s:>7.2f} {r.rps:>8.1f}")
    verdict = "PASS" if ratio >= 0.7 else "BELOW GOAL"
    print(f"   storm / clean throughput: {ratio:.3f} (goal ≥ 0.7, ideal 0.8) → {verdict}")
    if args.repeat > 1:
        print("   all runs, calls/s: clean " + ", ".join(f"{r.rps:.1f}" for r in cleans)
              + "; storm " + ", ".join(f"{r.rps:.1f}" for r in storms) + f" (best of {args.repeat})")
    print(f"   pacing at the end: {stormy.rate_limits.get('srv')}")
    return {"clean_rps": clean.rps, "storm_rps": stormy.rps, "ratio": ratio,
            "storm_429s": stormy.refused, "rate_limits": stormy.rate_limits}


def limit(args: argparse.Namespace, kind: str, headers: bool) -> dict[str, Any]:
    rate = args.limit_rps if kind == "requests" else args.limit_tps
    flags = ["--limit-rps" if kind == "requests" else "--limit-tps", str(rate)]
    if not headers:
        flags.append("--no-limit-headers")
    with server_process(args.latency, *flags) as srv:
        r = engine_run(srv.base_url, args.limit_dialogues, 64, args.turns)
    stats = srv.stats or {}
    refused = stats.get("limited", 0)
    used = r.ok if kind == "requests" else r.tokens
    allowed = rate * (1.0 + r.window_s)  # the burst (one second's worth) + rate × window
    share = used / allowed
    refused_share = refused / max(1, refused + stats.get("ok", 0))
    return {"kind": kind, "headers": headers, "limit": rate, "ok": r.ok, "refused": refused,
            "window_s": r.window_s, "share_of_limit": share, "refused_share": refused_share,
            "rate_limits": r.rate_limits.get("srv")}


def limits(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = [limit(args, kind, headers) for kind in ("requests", "tokens") for headers in (True, False)]
    print(f"\n2. server-side limits, M={args.limit_dialogues} dialogues × {2 * args.turns} calls at "
          f"C=64, L={args.latency * 1000:.0f} ms: {args.limit_rps:g} requests/s; "
          f"{args.limit_tps:g} tokens/s")
    print(f"   {'limit':10} {'x-ratelimit headers':>20} {'ok':>6} {'429s':>6} {'window s':>9} "
          f"{'of limit':>9} {'refused':>8}")
    for row in rows:
        good = row["share_of_limit"] >= 0.9 and row["refused_share"] <= 0.10
        print(f"   {row['kind']:10} {'sent' if row['headers'] else 'none':>20} {row['ok']:>6} "
              f"{row['refused']:>6} {row['window_s']:>9.2f} {row['share_of_limit']:>9.3f} "
              f"{row['refused_share']:>8.1%}  {'PASS' if good else 'BELOW GOAL'}")
    print("   (goal: ≥ 0.9 of the limit, ≤ 10% of requests refused)")
    return rows


def burst(args: argparse.Namespace) -> dict[str, Any]:
    """C callers without pause; 429s for ``burst_s`` seconds after ``before_s``."""
    before_s, burst_s, after_s = args.burst_before_s, args.burst_s, args.burst_after_s
    clean = FaultPlan(latency_s=args.latency)
    with TestServer(clean) as srv:
        cfg = BackendConfig(kind="openai", base_url=srv.base_url, model="m",
                            max_concurrency=args.concurrency)
        backend = make_backend("srv", cfg)
        caller = Caller({"srv": backend}, {"srv": cfg})
        done: list[float] = []
        t0 = time.monotonic()
        stop = t0 + before_s + burst_s + after_s
        switch = [threading.Timer(before_s, srv.set_plan,
                                  (FaultPlan(latency_s=args.latency, rate_429=1.0, retry_after_s=None),)),
                  threading.Timer(before_s + burst_s, srv.set_plan, (clean,))]

        async def one(i: int) -> None:
            n = 0
            while time.monotonic() < stop:
                n += 1
                req = ChatRequest(messages=({"role": "user", "content": f"caller {i} call {n}"},),
                                  temperature=0.0, max_tokens=16)
                await caller.complete("client", "srv", req, CallScope(dialogue_id=f"b{i}"))
                done.append(time.monotonic() - t0)

        async def main() -> None:
            try:
                async with anyio.create_task_group() as tg:
                    for i in range(args.concurrency):
                        tg.start_soon(one, i)
            finally:
                await backend.aclose()

        for timer in switch:
            timer.start()
        anyio.run(main)
        report = caller.limits["srv"].report()
    before = sum(1 for t in done if 1.0 <= t < before_s) / (before_s - 1.0)
    end = before_s + burst_s
    recovered = None
    t = end
    while t + 1.0 <= before_s + burst_s + after_s:
        if sum(1 for d in done if t <= d < t + 1.0) >= 0.9 * before:
            recovered = t - end  # the first second at 90% of the rate starts here
            break
        t += 0.05
    bins = [sum(1 for d in done if end + k * 0.5 <= d < end + (k + 1) * 0.5) for k in range(-2, 8)]
    print(f"\n3. a {burst_s:g}-second burst of 429s (every request, no Retry-After), C={args.concurrency} "
          f"callers, L={args.latency * 1000:.0f} ms")
    print(f"   answers/s before the burst: {before:.1f}")
    shown = f"{recovered:.2f} s" if recovered is not None else f"not within {after_s:g} s"
    print(f"   time from the burst's end to the start of a second at ≥ 90% of that rate: {shown}")
    print(f"   answers per 0.5 s from 1 s before the end: {bins}")
    print(f"   pacing at the end: {report}")
    return {"before_rps": before, "recovery_s": recovered, "bins": bins, "rate_limits": report}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--latency", type=float, default=0.02, help="server latency, seconds (L)")
    p.add_argument("--dialogues", type=int, default=128, help="dialogues of the storm part (N)")
    p.add_argument("--concurrency", type=int, default=16, help="max_concurrency of parts 1 and 3 (C)")
    p.add_argument("--turns", type=int, default=4, help="turns per agent (2 × turns calls a dialogue)")
    p.add_argument("--limit-dialogues", type=int, default=96, help="dialogues of each limit run (M)")
    p.add_argument("--limit-rps", type=float, default=40.0)
    p.add_argument("--limit-tps", type=float, default=4000.0)
    p.add_argument("--burst-s", type=float, default=30.0)
    p.add_argument("--burst-before-s", type=float, default=6.0)
    p.add_argument("--burst-after-s", type=float, default=12.0)
    p.add_argument("--repeat", type=int, default=3, help="storm part: runs of each, best kept")
    p.add_argument("--only", choices=("storm", "limits", "burst"), action="append")
    p.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    args = p.parse_args(argv)
    parts = args.only or ["storm", "limits", "burst"]
    print(f"spasm rate-limit benchmark: machine {os.cpu_count()} CPUs, Python "
          f"{platform.python_version()}, load average {os.getloadavg()[0]:.2f}")
    results: dict[str, Any] = {}
    if "storm" in parts:
        results["storm"] = storm(args)
    if "limits" in parts:
        results["limits"] = limits(args)
    if "burst" in parts:
        results["burst"] = burst(args)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
