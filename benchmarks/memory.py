"""Peak memory of the run engine as the number of dialogues grows.

For each N (default 200, 800, 3200) a fresh Python process runs N dialogues through
:class:`spasm.engine.Engine` against the OpenAI-compatible test server (zero latency by default,
in its own process so its request log is never counted), and reports its peak resident set
size (``resource.getrusage(RUSAGE_SELF).ru_maxrss``) at three points:

* **baseline**: after the imports and the config, before ``Engine.run``;
* **run**: the peak up to the start of the final compaction (``RunStore.compact_all``), i.e. the
  generation phase, where completed dialogues are flushed to Parquet every
  ``engine.flush_every`` dialogues and must not accumulate;
* **end**: the peak of the whole process, compaction and manifest included.

Memory that does not grow with N shows as a largest/smallest ratio near 1 and a slope of a few
bytes per dialogue. ``--control`` adds a run of the largest N with ``flush_every`` = N (nothing
is flushed until the end), to show that the measurement does see memory that grows with N.
No tracemalloc: it would slow the run and count only Python allocations. Run it with::

    .venv/bin/python benchmarks/memory.py
    .venv/bin/python benchmarks/memory.py --sizes 200,800,3200 --control
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))
_TIKTOKEN = ROOT.parent / "shared" / "data" / "tiktoken"
if _TIKTOKEN.is_dir():
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(_TIKTOKEN))


def _maxrss_mib() -> float:
    """Peak RSS of this process in MiB (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def _current_rss_mib() -> float | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def engine_config(
    base_url: str, dialogues: int, concurrency: int, turns: int, flush_every: int | None
) -> dict[str, Any]:
    """Exactly ``dialogues`` dialogues of ``2 * turns`` calls each (no early termination)."""
    personas = max(d for d in range(1, 51) if dialogues % d == 0)
    engine: dict[str, Any] = {"cache": False}
    if flush_every is not None:
        engine["flush_every"] = flush_every
    return {
        "name": "bench-memory",
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
        "engine": engine,
    }


# ---------------------------------------------------------------------------------------------
# The child: one engine run in a fresh process
# ---------------------------------------------------------------------------------------------


def child(args: argparse.Namespace) -> int:
    import anyio

    from spasm.config import parse_config
    from spasm.dataset.store import RunStore
    from spasm.engine import Engine

    data = engine_config(args.base_url, args.child, args.concurrency, args.turns, args.flush_every)
    config = parse_config(data, "<benchmark>")
    marks: dict[str, Any] = {"baseline_mib": _maxrss_mib()}

    original = getattr(RunStore, "compact_all", None)
    if original is not None:

        def compact_all(self: Any, *a: Any, **kw: Any) -> Any:
            marks.setdefault("run_mib", _maxrss_mib())
            marks.setdefault("rss_before_compaction_mib", _current_rss_mib())
            return original(self, *a, **kw)

        RunStore.compact_all = compact_all  # type: ignore[method-assign]

    with tempfile.TemporaryDirectory(prefix="spasm-bench-mem-") as tmp:
        run_dir = Path(tmp) / "run"
        t0 = time.perf_counter()
        summary = anyio.run(Engine(config, run_dir, progress=False).run)
        marks["wall_s"] = time.perf_counter() - t0
        marks["end_mib"] = _maxrss_mib()
        marks["completed"] = summary.completed
        marks["errors"] = summary.errors
        marks["disk_mib"] = sum(p.stat().st_size for p in run_dir.rglob("*") if p.is_file()) / 2**20
    marks.setdefault("run_mib", marks["end_mib"])
    print(json.dumps(marks), flush=True)
    return 0 if summary.completed == args.child and not summary.errors else 1


# ---------------------------------------------------------------------------------------------
# The parent: a server, then one child per N
# ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def server_process(latency: float) -> Iterator[str]:
    cmd = [sys.executable, "-m", "spasm.testing.server", "--port", "0", "--latency", str(latency)]
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": path},
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        if not url.startswith("http"):
            raise RuntimeError(f"the test server did not start: {url!r}")
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_child(args: argparse.Namespace, url: str, n: int, flush_every: int | None) -> dict[str, Any]:
    cmd = [
        sys.executable, str(Path(__file__).resolve()), "--child", str(n), "--base-url", url,
        "--concurrency", str(args.concurrency), "--turns", str(args.turns),
    ]
    if flush_every is not None:
        cmd += ["--flush-every", str(flush_every)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, cwd=ROOT)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"the run of N={n} failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--sizes", default="200,800,3200", help="comma-separated numbers of dialogues")
    p.add_argument("--latency", type=float, default=0.0, help="server latency per request, seconds")
    p.add_argument("--concurrency", type=int, default=64, help="backend max_concurrency")
    p.add_argument("--turns", type=int, default=2, help="turns per agent (2 × turns calls per dialogue)")
    p.add_argument("--flush-every", type=int, default=None, help="engine.flush_every (default: the engine's)")
    p.add_argument("--control", action="store_true",
                   help="also run the largest N with flush_every = N (nothing flushed until the end)")
    p.add_argument("--timeout", type=float, default=600, help="seconds allowed per run")
    p.add_argument("--json", type=Path, default=None, help="also write the figures to this JSON file")
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--base-url", default=None, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.child is not None:
        return child(args)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    k = 2 * args.turns
    print(
        f"spasm memory benchmark: N in {sizes} dialogues × {k} calls, C={args.concurrency}, "
        f"L={args.latency * 1000:.0f} ms, flush_every={args.flush_every or 'engine default'}; "
        "one fresh process per N"
    )
    print(
        f"machine: {os.cpu_count()} CPUs, Python {platform.python_version()}, {platform.system()}, "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    rows: list[tuple[str, int, dict[str, Any]]] = []
    with server_process(args.latency) as url:
        run_child(args, url, min(sizes), args.flush_every)  # warm-up: bytecode, page cache
        for n in sizes:
            rows.append((str(n), n, run_child(args, url, n, args.flush_every)))
        if args.control:
            n = max(sizes)
            rows.append((f"{n} (control: flush_every={n})", n, run_child(args, url, n, n)))

    print()
    print(f"  {'N dialogues':30} {'calls':>6} {'wall s':>7} {'baseline':>9} {'peak run':>9} "
          f"{'peak end':>9} {'run-base':>9} {'disk':>7}")
    for label, n, r in rows:
        print(
            f"  {label:30} {n * k:>6} {r['wall_s']:>7.1f} {r['baseline_mib']:>8.1f}M {r['run_mib']:>8.1f}M "
            f"{r['end_mib']:>8.1f}M {r['run_mib'] - r['baseline_mib']:>8.1f}M {r['disk_mib']:>6.1f}M"
        )
    main_rows = [(n, r) for label, n, r in rows if "control" not in label]
    (n_lo, lo), (n_hi, hi) = main_rows[0], main_rows[-1]
    slope_run = (hi["run_mib"] - lo["run_mib"]) * 2**20 / (n_hi - n_lo)
    slope_end = (hi["end_mib"] - lo["end_mib"]) * 2**20 / (n_hi - n_lo)
    print()
    print(f"  peak RSS, largest/smallest N ({n_hi}/{n_lo} = {n_hi / n_lo:.0f}× the dialogues):")
    print(f"    during the run: {hi['run_mib'] / lo['run_mib']:.3f}  "
          f"({slope_run / 1024:+.2f} KiB per dialogue)")
    print(f"    whole process (compaction included): {hi['end_mib'] / lo['end_mib']:.3f}  "
          f"({slope_end / 1024:+.2f} KiB per dialogue)")
    if len(main_rows) > 2:
        (n_a, a), (n_b, b) = main_rows[-2], main_rows[-1]
        slope = (b["end_mib"] - a["end_mib"]) * 2**20 / (n_b - n_a) / 1024
        print(f"    whole process, {n_a} → {n_b} only (the first compaction also imports pandas): "
              f"{slope:+.2f} KiB per dialogue")
    if args.control:
        ctl = rows[-1][2]
        print(f"  control (nothing flushed until the end): peak during the run {ctl['run_mib']:.1f}M vs "
              f"{hi['run_mib']:.1f}M with flushing, +{ctl['run_mib'] - hi['run_mib']:.1f}M")
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
