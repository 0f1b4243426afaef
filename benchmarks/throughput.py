"""Throughput and CPU cost of the run engine against the OpenAI-compatible test server.

What it measures, in one process:

1. **Bare loop** (the practical ceiling): ``openai.AsyncOpenAI`` (``max_retries=0``) with C
   requests in flight (an anyio task group and a ``CapacityLimiter``) sending M chat requests to
   a test server that sleeps L seconds per request. Reports requests/s and its ratio to the
   bound C/L.
2. **Engine**: N dialogues through :class:`spasm.engine.Engine` with ``max_concurrency`` C
   against the same kind of server, with a fixed number of calls per dialogue (termination rules
   off, ``turns`` turns per agent, so M = N × 2 × turns calls) and the cache off. Reports
   calls/s, over the whole ``Engine.run`` (end to end: preflight, personas, Parquet writes,
   final compaction) and over the window from the first call's start to the last call's end
   (from the run's ``calls`` table), each as a ratio of C/L and of the bare loop.
3. **CPU per call**: the same two against a zero-latency server, measured with
   ``time.process_time()`` deltas in this process (all of its threads, so the engine's Parquet
   writer threads count).

The server runs in a **subprocess** (``python -m spasm.testing.server``) so that its CPU is
never charged to the client being measured, and its request log and threads do not share the
client's GIL. Run it with::

    .venv/bin/python benchmarks/throughput.py                       # N=400, L=0.2, C=64, turns=3
    .venv/bin/python benchmarks/throughput.py --concurrency 16 --repeat 3

Target: engine ≥ 0.9 of C/L at C = 64, L = 200 ms.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import openai

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

# Offline machines: exact token counts from the shared tiktoken files, as the Makefile does.
_TIKTOKEN = ROOT.parent / "shared" / "data" / "tiktoken"
if _TIKTOKEN.is_dir():
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(_TIKTOKEN))

from spasm.config import parse_config  # noqa: E402
from spasm.engine import Engine  # noqa: E402

# A request shaped like the engine's: a system prompt of a persona card's size plus a few turns.
_SYSTEM = (
    "You are Dana, 41, a nurse from Leeds who is worried about a billing error on her account. "
    * 6
)
_MESSAGES = [
    {"role": "system", "content": _SYSTEM},
    {"role": "user", "content": "Hello, how can I help you today?"},
    {"role": "assistant", "content": "Hi, I was charged twice for the same month and I am upset."},
    {"role": "user", "content": "I am sorry to hear that. Could you tell me the dates of the charges?"},
]


# ---------------------------------------------------------------------------------------------
# The test server, in a subprocess
# ---------------------------------------------------------------------------------------------


@dataclass
class ServerProcess:
    proc: subprocess.Popen[str]
    base_url: str
    stats: dict[str, int] | None = None

    def cpu_s(self) -> float:
        """CPU seconds (user + system) the server process has used so far; NaN off Linux."""
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return float("nan")
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def server_process(latency: float, *extra: str) -> Iterator[ServerProcess]:
    """Start ``python -m spasm.testing.server --port 0 --latency L`` (and ``extra`` options);
    stop it with SIGTERM."""
    cmd = [sys.executable, "-m", "spasm.testing.server", "--port", "0", "--latency", str(latency),
           *extra]
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT
    )
    assert proc.stdout is not None
    server = ServerProcess(proc, proc.stdout.readline().strip())
    try:
        if not server.base_url.startswith("http"):
            raise RuntimeError(f"the test server did not start: {server.base_url!r}")
        yield server
    finally:
        proc.send_signal(signal.SIGTERM)  # the server prints its stats as JSON and exits
        try:
            _, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        with contextlib.suppress(ValueError, IndexError):
            server.stats = json.loads(err.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------
# The bare AsyncOpenAI loop
# ---------------------------------------------------------------------------------------------


@dataclass
class Measure:
    calls: int
    wall_s: float
    cpu_s: float
    window_s: float | None = None  # first call start → last call end (engine only)
    before_s: float = 0.0  # Engine.run start → first call start (preflight, personas, set-up)
    after_s: float = 0.0  # last call end → Engine.run returns (last flush, compaction, manifest)
    errors: int = 0

    @property
    def rate(self) -> float:
        return self.calls / self.wall_s

    @property
    def window_rate(self) -> float | None:
        return self.calls / self.window_s if self.window_s else None

    @property
    def cpu_ms_per_call(self) -> float:
        return 1000 * self.cpu_s / self.calls


async def _bare(base_url: str, n_requests: int, concurrency: int, max_tokens: int) -> int:
    client = openai.AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0, timeout=60)
    limiter = anyio.CapacityLimiter(concurrency)
    errors = 0

    async def one(i: int) -> None:
        nonlocal errors
        async with limiter:
            try:
                resp = await client.chat.completions.create(
                    model="m", messages=_MESSAGES, temperature=0.7, max_tokens=max_tokens, seed=i,  # type: ignore[arg-type]
                )
                _ = resp.choices[0].message.content
            except openai.OpenAIError:
                errors += 1

    try:
        async with anyio.create_task_group() as tg:
            for i in range(n_requests):
                tg.start_soon(one, i)
    finally:
        await client.close()
    return errors


def run_bare(base_url: str, n_requests: int, concurrency: int, max_tokens: int = 40) -> Measure:
    gc.collect()
    c0, t0 = time.process_time(), time.perf_counter()
    errors = anyio.run(_bare, base_url, n_requests, concurrency, max_tokens)
    return Measure(n_requests, time.perf_counter() - t0, time.process_time() - c0, errors=errors)


# ---------------------------------------------------------------------------------------------
# The engine
# ---------------------------------------------------------------------------------------------


def engine_config(
    base_url: str, dialogues: int, concurrency: int, turns: int, in_flight: int | None = None
) -> dict[str, Any]:
    """A config with exactly ``dialogues`` dialogues of exactly ``2 * turns`` calls each."""
    personas = max(d for d in range(1, 51) if dialogues % d == 0)
    return {
        "name": "bench",
        "seed": 7,
        "personas": {"n": personas},
        "conversations_per_persona": dialogues // personas,
        "conditions": ["ecp"],
        "backends": {
            "srv": {"kind": "openai", "base_url": base_url, "model": "m", "max_concurrency": concurrency}
        },
        "pairings": [{"client": "srv", "responder": "srv"}],
        "dialogue": {"max_turns_per_agent": turns, "max_tokens": 40},
        "termination": {"rules": False, "judge": False},
        "engine": {"cache": False, "max_dialogues_in_flight": in_flight},
    }


def run_engine(
    base_url: str, dialogues: int, concurrency: int, turns: int, in_flight: int | None = None
) -> Measure:
    data = engine_config(base_url, dialogues, concurrency, turns, in_flight)
    return timed_engine_run(data, dialogues, dialogues * 2 * turns)[0]


def timed_engine_run(data: dict[str, Any], dialogues: int, expected_calls: int) -> tuple[Measure, int]:
    """One ``Engine.run`` of the config ``data`` into a fresh directory, timed, with its calls read
    from the ``calls`` table (their window, the time before and after them); returns the measure
    and the number of turns the run stored. ``expected_calls`` successful calls must be there."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from spasm.dataset import open_run

    config = parse_config(data, "<benchmark>")
    with tempfile.TemporaryDirectory(prefix="spasm-bench-") as tmp:
        run_dir = Path(tmp) / "run"
        engine = Engine(config, run_dir, progress=False)
        gc.collect()
        c0, t0, e0 = time.process_time(), time.perf_counter(), time.time()
        summary = anyio.run(engine.run)
        wall, cpu, e1 = time.perf_counter() - t0, time.process_time() - c0, time.time()
        if summary.completed != dialogues or summary.errors:
            raise RuntimeError(f"engine run incomplete: {summary.line()}")
        n_turns = open_run(run_dir).table("turns", ["dialogue_id"]).num_rows
        calls = pq.read_table(run_dir / "calls.parquet", columns=["outcome", "started_at", "latency_s"])
        ok = int(pc.sum(pc.equal(calls["outcome"], "ok")).as_py())
        starts = calls["started_at"].to_pylist()
        ends = [s.timestamp() + lat for s, lat in zip(starts, calls["latency_s"].to_pylist(), strict=True)]
        first, last = min(s.timestamp() for s in starts), max(ends)
    if ok != expected_calls:
        raise RuntimeError(f"expected {expected_calls} successful calls, the calls table has {ok}")
    measure = Measure(
        ok, wall, cpu, window_s=last - first, errors=len(calls) - ok, before_s=first - e0, after_s=e1 - last
    )
    return measure, n_turns


def timed_utterance_run(data: dict[str, Any], dialogues: int, calls: int, utterances: int) -> Measure:
    """:func:`timed_engine_run` of a run whose dialogues have ``utterances`` turns each: exactly
    ``calls`` successful calls and ``dialogues`` × ``utterances`` turns stored."""
    measure, n_turns = timed_engine_run(data, dialogues, calls)
    if n_turns != dialogues * utterances:
        raise RuntimeError(f"expected {dialogues * utterances} utterances, the run stored {n_turns}")
    return measure


def utterance_parser(doc: str | None) -> argparse.ArgumentParser:
    """The options of the benchmarks that count utterances (group_throughput.py,
    tools_throughput.py); ``doc`` is the benchmark's module docstring (its first paragraph is
    the description)."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0] if doc else None)
    p.add_argument("--dialogues", type=int, default=64, help="dialogues per run (N)")
    p.add_argument("--utterances", type=int, default=8, help="utterances per dialogue (U, even)")
    p.add_argument("--latency", type=float, default=0.2, help="server latency per request, seconds (L)")
    p.add_argument("--concurrency", type=int, default=32, help="requests in flight (C)")
    p.add_argument("--repeat", type=int, default=1, help="repeat each run; the fastest is kept")
    p.add_argument("--json", type=Path, default=None, help="also write the figures to this JSON file")
    return p


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--dialogues", type=int, default=400, help="dialogues per engine run (N)")
    p.add_argument("--latency", type=float, default=0.2, help="server latency per request, seconds (L)")
    p.add_argument("--concurrency", type=int, default=64, help="requests in flight (C)")
    p.add_argument("--turns", type=int, default=3, help="turns per agent (2 × turns calls per dialogue)")
    p.add_argument(
        "--in-flight", type=int, default=None,
        help="engine.max_dialogues_in_flight (default: the engine's own, = C for one backend)",
    )
    p.add_argument("--repeat", type=int, default=1, help="repeat each measurement; the best is kept")
    p.add_argument("--cpu-dialogues", type=int, default=None, help="N for the CPU-per-call part (default N)")
    p.add_argument("--skip-cpu", action="store_true", help="skip the zero-latency CPU-per-call part")
    p.add_argument("--json", type=Path, default=None, help="also write the figures to this JSON file")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    n, c, lat, turns = args.dialogues, args.concurrency, args.latency, args.turns
    calls = n * 2 * turns
    bound = c / lat
    print(
        f"spasm throughput benchmark: N={n} dialogues × {2 * turns} calls = {calls} calls, "
        f"C={c}, L={lat * 1000:.0f} ms, bound C/L = {bound:.1f} req/s"
    )
    print(
        f"machine: {os.cpu_count()} CPUs, Python {platform.python_version()}, openai {openai.__version__}, "
        f"load average {os.getloadavg()[0]:.2f} (other processes on these cores skew every figure)"
    )
    # Whole 'rounds' of L: C requests in flight can finish at most C per L. A dialogue is a chain
    # of 2 × turns calls, so with D dialogues in flight (the engine's default D = C) the run
    # takes at least ceil(N / D) chains of 2 × turns × L when D ≤ C: N = 400, C = 64 leaves a last
    # wave of 16 dialogues, so ≤ 0.893 of C/L is reachable at all. Use N a multiple of C.
    k = 2 * turns
    d = args.in_flight or c
    rounds_bare = math.ceil(calls / c)
    rounds_engine = max(rounds_bare, k * math.ceil(n / d)) if d <= c else rounds_bare
    sched_bare = calls / (rounds_bare * c)
    sched_engine = calls / (rounds_engine * c)
    print(
        f"schedule bound (whole rounds of L; {d} dialogues in flight): bare ≤ {sched_bare:.3f}, "
        f"engine ≤ {sched_engine:.3f} of C/L"
    )
    results: dict[str, Any] = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "schedule_bound": {"bare": sched_bare, "engine": sched_engine},
    }

    bare: list[Measure] = []
    eng: list[Measure] = []
    with server_process(lat) as srv:
        # Warm-up: imports, the server's thread start-up, first connections.
        run_bare(srv.base_url, min(calls, 2 * c), c)
        for _ in range(args.repeat):
            bare.append(run_bare(srv.base_url, calls, c))
            eng.append(run_engine(srv.base_url, n, c, turns, args.in_flight))
    b = max(bare, key=lambda m: m.rate)
    e = max(eng, key=lambda m: m.rate)
    ew = e.window_rate or 0.0
    print()
    print(f"Throughput at L = {lat * 1000:.0f} ms, C = {c} (bound {bound:.1f} req/s); best of {args.repeat}")
    print(f"  {'':34} {'calls':>6} {'wall s':>7} {'req/s':>7} {'/ (C/L)':>8} {'/ bare':>7}")
    print(
        f"  {'bare AsyncOpenAI loop':34} {b.calls:>6} {b.wall_s:>7.2f} {b.rate:>7.1f} "
        f"{b.rate / bound:>8.3f} {1:>7.3f}"
    )
    print(
        f"  {'engine, end to end (Engine.run)':34} {e.calls:>6} {e.wall_s:>7.2f} {e.rate:>7.1f} "
        f"{e.rate / bound:>8.3f} {e.rate / b.rate:>7.3f}"
    )
    print(
        f"  {'engine, first call → last call':34} {e.calls:>6} {e.window_s or 0:>7.2f} {ew:>7.1f} "
        f"{ew / bound:>8.3f} {ew / b.rate:>7.3f}"
    )
    print(
        f"  engine outside the call window: {e.before_s:.2f} s before the first call (preflight, "
        f"personas, set-up), {e.after_s:.2f} s after the last (flush, compaction, manifest)"
    )
    if args.repeat > 1:
        print("  all runs, req/s: bare " + ", ".join(f"{m.rate:.1f}" for m in bare)
              + "; engine end to end " + ", ".join(f"{m.rate:.1f}" for m in eng)
              + "; engine window " + ", ".join(f"{m.window_rate or 0:.1f}" for m in eng))
    verdict = "PASS" if e.rate / bound >= 0.9 else "BELOW TARGET"
    where = "" if (c, lat) == (64, 0.2) else " (the target is set at C = 64, L = 200 ms)"
    print(f"  engine end to end ≥ 0.9 of C/L: {e.rate / bound:.3f} → {verdict}{where}")
    results["throughput"] = {
        "bound_rps": bound,
        "bare": vars(b) | {"rps": b.rate},
        "engine": vars(e) | {"rps": e.rate, "window_rps": ew},
        "bare_runs_rps": [m.rate for m in bare],
        "engine_runs_rps": [m.rate for m in eng],
    }

    if not args.skip_cpu:
        cn = args.cpu_dialogues or n
        ccalls = cn * 2 * turns
        with server_process(0.0) as srv:
            run_bare(srv.base_url, min(ccalls, 2 * c), c)  # warm-up
            # The least CPU of --repeat runs of each: other processes only ever add to it.
            best: dict[str, tuple[Measure, float]] = {}
            for _ in range(args.repeat):
                # A second engine run of twice the size separates the per-call cost from the
                # fixed cost of a run (preflight, personas, pandas import and compaction).
                for kind in ("bare", "engine", "engine2"):
                    s0 = srv.cpu_s()
                    if kind == "bare":
                        m = run_bare(srv.base_url, ccalls, c)
                    else:
                        size = cn if kind == "engine" else 2 * cn
                        m = run_engine(srv.base_url, size, c, turns, args.in_flight)
                    server = 1000 * (srv.cpu_s() - s0) / m.calls
                    if kind not in best or m.cpu_s < best[kind][0].cpu_s:
                        best[kind] = (m, server)
        (bz, sb), (ez, se), (ez2, se2) = best["bare"], best["engine"], best["engine2"]
        server_ms = [sb, se, se2]
        marginal = 1000 * (ez2.cpu_s - ez.cpu_s) / (ez2.calls - ez.calls)
        fixed = ez.cpu_s - marginal * ez.calls / 1000
        print()
        print(f"CPU time per call against a zero-latency server (server in its own process), C = {c}; "
              f"least of {args.repeat}")
        print(f"  {'':34} {'calls':>6} {'CPU s':>7} {'ms/call':>8} {'wall s':>7} {'req/s':>7} "
              f"{'server ms/req':>13}")
        rows = (
            ("bare AsyncOpenAI loop", bz, server_ms[0]),
            ("engine (Engine.run, end to end)", ez, server_ms[1]),
            ("engine, twice the dialogues", ez2, server_ms[2]),
        )
        for label, m, sms in rows:
            print(f"  {label:34} {m.calls:>6} {m.cpu_s:>7.2f} "
                  f"{m.cpu_ms_per_call:>8.3f} {m.wall_s:>7.2f} {m.rate:>7.1f} {sms:>13.3f}")
        extra, times = ez.cpu_ms_per_call - bz.cpu_ms_per_call, ez.cpu_ms_per_call / bz.cpu_ms_per_call
        print(f"  engine overhead over the bare SDK, end to end: {extra:.3f} ms/call ({times:.2f}×)")
        print(f"  engine per call at the margin (difference of the two runs): {marginal:.3f} ms/call "
              f"({marginal / bz.cpu_ms_per_call:.2f}× the bare loop), plus {fixed:.2f} s fixed per run")
        results["cpu"] = {"bare": vars(bz), "engine": vars(ez), "engine_2x": vars(ez2),
                          "engine_marginal_ms_per_call": marginal, "engine_fixed_cpu_s": fixed}

    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
