"""The whole evaluation on Ray against the local one, and the evaluation's peak memory as the
corpus grows.

``ray``: a synthetic run (:func:`spasm.dataset.synthetic.synthesize_run`) evaluated locally
(``spasm.evaluation.evaluate``) and with ``spasm eval --ray``'s embedder and per-dialogue
stages (:class:`~spasm.evaluation.distributed.RayEmbedder`, :class:`~spasm.evaluation.distributed.RayStages`)
on a local Ray of this machine's CPUs, every stage of the default evaluation included (embedding,
drift, own content, echoing, separability, realism, language, the comparison, the files).
Each evaluation gets a fresh copy of the run (an empty embedding cache); both embedders are
built and warmed before the clock starts (the local one's session, the Ray actors' sessions),
and Ray's start-up is not timed. ``--rounds`` rounds, local and Ray interleaved, each keeping
its best (a shared machine's load moves between rounds). Prints dialogues/s of each and the
ratio Ray / local (goal >= 0.9: what Ray itself costs on one machine).

``memory``: for each size, a synthetic run built untimed, then a fresh Python process evaluates
it (``--embedder static`` by default, so 45,000 dialogues take minutes, not an hour) and
reports its peak resident set size (``VmHWM``); ``baseline`` is a process that only imports
the evaluation. Prints each size's peak, wall time and the ratio of the largest to the
smallest (peak, and peak over the baseline)::

    .venv/bin/python benchmarks/eval_cluster.py ray [--dialogues 400] [--rounds 2] [--embedder local]
    .venv/bin/python benchmarks/eval_cluster.py memory [--sizes 4500,45000] [--embedder static]

Not part of the test suite: minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from benchmarks._rss import peak_rss_mib  # noqa: E402 - needs ROOT on sys.path


def _load_average() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "?"


def _synthesize(path: Path, dialogues: int) -> Path:
    from spasm.dataset.synthetic import synthesize_run

    return synthesize_run(path, n_dialogues=dialogues, n_personas=max(4, dialogues // 25))


def ray_mode(args: argparse.Namespace) -> int:
    import ray

    from spasm.evaluation import evaluate
    from spasm.evaluation.distributed import RayEmbedder, RayStages
    from spasm.evaluation.embeddings import create_embedder

    cpus = os.cpu_count() or 1
    os.environ.setdefault("RAY_memory_monitor_refresh_ms", "0")  # a shared machine's memory
    with tempfile.TemporaryDirectory() as tmp:
        source = _synthesize(Path(tmp) / "source", args.dialogues)
        ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
        try:
            local = create_embedder(args.embedder)
            distributed = RayEmbedder(ray, args.embedder)
            stages = RayStages(distributed)
            local.embed(["warm up the session"])
            distributed.embed([f"warm up worker {i}" for i in range(distributed.workers)])
            best: dict[str, float] = {}
            for r in range(args.rounds):
                for name in ("local", "ray"):
                    run = Path(tmp) / f"{name}-{r}"
                    shutil.copytree(source, run)
                    t0 = time.perf_counter()
                    if name == "local":
                        evaluate(run, embedder=local, progress=False)
                    else:
                        evaluate(run, embedder=distributed, progress=False, distributed=stages)
                    seconds = time.perf_counter() - t0
                    best[name] = min(best.get(name, seconds), seconds)
                    print(f"round {r + 1} {name:5s} {seconds:7.1f} s  "
                          f"{args.dialogues / seconds:7.1f} dialogues/s  (load {_load_average()})",
                          flush=True)
        finally:
            ray.shutdown()
    rates = {k: args.dialogues / v for k, v in best.items()}
    threads = getattr(local, "threads", "?")
    print(f"\n{args.dialogues} dialogues, --embedder {args.embedder}, {cpus} CPUs "
          f"({distributed.workers} Ray workers of one thread; local: {threads} threads)")
    print(f"local {rates['local']:.1f} dialogues/s, Ray {rates['ray']:.1f} dialogues/s: "
          f"Ray / local = {rates['ray'] / rates['local']:.2f} (goal >= 0.9)")
    return 0


def _child(run: str, embedder: str) -> int:
    """One measurement in a fresh process: the evaluation of ``run`` (or only the imports)."""
    from spasm.evaluation import evaluate

    t0 = time.perf_counter()
    if run != "-":
        evaluate(run, embedder=embedder, progress=False)
    print(json.dumps({"peak_mib": peak_rss_mib(), "seconds": time.perf_counter() - t0}))
    return 0


def _measure(run: str, embedder: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "_child", run, "--embedder", embedder],
                         check=True, capture_output=True, text=True)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def memory_mode(args: argparse.Namespace) -> int:
    sizes = [int(s) for s in args.sizes.split(",")]
    baseline = _measure("-", args.embedder)["peak_mib"]
    print(f"baseline (imports only): {baseline:.0f} MiB", flush=True)
    rows = []
    for n in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            run = _synthesize(Path(tmp) / "run", n)
            built = time.perf_counter() - t0
            result = _measure(str(run), args.embedder)
        rows.append((n, result["peak_mib"], result["seconds"]))
        print(f"{n:7d} dialogues: peak {result['peak_mib']:7.0f} MiB, evaluation {result['seconds']:7.1f} s "
              f"(run built in {built:.0f} s; load {_load_average()})", flush=True)
    (n0, p0, _), (n1, p1, _) = rows[0], rows[-1]
    print(f"\n{n1} / {n0} dialogues ({n1 / n0:.1f}x): peak {p1 / p0:.2f}x, "
          f"above the imports' {baseline:.0f} MiB {(p1 - baseline) / max(1.0, p0 - baseline):.2f}x "
          f"(--embedder {args.embedder})")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="mode", required=True)
    r = sub.add_parser("ray", help="the whole evaluation on a local Ray over the local one")
    r.add_argument("--dialogues", type=int, default=400)
    r.add_argument("--rounds", type=int, default=2)
    r.add_argument("--embedder", default="local")
    m = sub.add_parser("memory", help="peak RSS of the evaluation as the corpus grows")
    m.add_argument("--sizes", default="4500,45000")
    m.add_argument("--embedder", default="static")
    c = sub.add_parser("_child")
    c.add_argument("run")
    c.add_argument("--embedder", default="static")
    args = p.parse_args(argv)
    if args.mode == "ray":
        return ray_mode(args)
    if args.mode == "memory":
        return memory_mode(args)
    return _child(args.run, args.embedder)


if __name__ == "__main__":
    sys.exit(main())
