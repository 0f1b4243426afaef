"""How long the cheap-mode evaluation takes on a run the size of the public SPASM release.

Synthesises 5,000 dialogues of 9 utterances (about 200 personas, ECP and CONCAT paired,
two pairings) as a run directory in a temporary folder, runs ``spasm.evaluation.evaluate``
with the local int8 MiniLM embedder (2 onnxruntime threads) and prints wall time, the
number of texts embedded and sentences per second. A second pass shows the cached cost.

    .venv/bin/python benchmarks/eval_speed.py [--dialogues 5000] [--personas 200] [--keep DIR]

Not part of the test suite: it takes minutes.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dialogues", type=int, default=5000)
    parser.add_argument("--personas", type=int, default=200)
    parser.add_argument("--utterances", type=int, default=9)
    parser.add_argument("--keep", type=Path, default=None, help="write the run here and keep it")
    parser.add_argument("--no-second-pass", action="store_true")
    args = parser.parse_args()

    from spasm.dataset.synthetic import synthesize_run
    from spasm.evaluation import evaluate

    tmp = Path(tempfile.mkdtemp(prefix="spasm-eval-bench-"))
    run_dir = args.keep or tmp / "run"
    try:
        t0 = time.perf_counter()
        synthesize_run(
            run_dir, n_dialogues=args.dialogues, n_personas=args.personas, n_utterances=args.utterances
        )
        print(
            f"synthesised {args.dialogues} dialogues x {args.utterances} utterances, "
            f"{args.personas} personas in {time.perf_counter() - t0:.1f} s -> {run_dir}"
        )
        print(f"cores: {os.cpu_count()}, onnxruntime intra-op threads: 2")

        load_before = os.getloadavg()[0]
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        m = evaluate(run_dir, embedder="local", mode="cheap", progress=None)
        wall = time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
        embed_s = m.timings.get("embed_utterances", 0.0)
        c = m.counts
        print(
            f"\ncold run (empty embedding cache): {wall:.1f} s wall, {cpu:.1f} s CPU "
            f"(load average {load_before:.1f} -> {os.getloadavg()[0]:.1f}; a busy machine "
            "stretches the wall time, not the CPU time)"
        )
        print(
            f"  dialogues {c.dialogues_ok}, utterances {c.utterances}, texts embedded "
            f"{c.texts_embedded} (unique), cache hits {c.texts_cached}"
        )
        print(
            f"  embedding: {embed_s:.1f} s -> {c.texts_embedded / max(embed_s, 1e-9):.0f} sentences/s; "
            f"end to end: {c.utterances / wall:.0f} utterances/s; "
            f"{c.texts_embedded / max(cpu, 1e-9):.0f} sentences per CPU-second"
        )
        print("  stages: " + ", ".join(f"{k} {v:.1f}s" for k, v in m.timings.items()))
        o = m.echoing.overall
        print(
            f"  echoing rate {o.rate:.1%}; separability groups {len(m.separability)}; "
            f"report {run_dir / 'eval' / 'report.html'}"
        )

        if not args.no_second_pass:
            t0 = time.perf_counter()
            m2 = evaluate(run_dir, embedder="local", mode="cheap", progress=False)
            print(
                f"\nwarm run (cached embeddings): {time.perf_counter() - t0:.1f} s wall, "
                f"texts embedded {m2.counts.texts_embedded}"
            )
    finally:
        if args.keep is None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
