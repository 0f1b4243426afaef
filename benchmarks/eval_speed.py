"""How long the cheap-mode evaluation takes on a run the size of the public SPASM release.

Synthesises 5,000 dialogues of 9 utterances (about 200 personas, ECP and CONCAT paired,
two pairings) as a run directory in a temporary folder, runs ``spasm.evaluation.evaluate``
with the local int8 MiniLM embedder (2 onnxruntime threads) and prints wall time, the
number of texts embedded and sentences per second, the time of every stage (the realism
metrics, echoing with its onset and the paired comparison included) and the peak RSS. A second
pass shows the cached cost.

``--embedder static`` uses the static distillation of the same MiniLM instead (docs/evaluation.md,
"Fast static embedder"); its one-off table is distilled (or read from the cache) before the
timed evaluation and timed on its own line. At the SPASM corpus size:

    .venv/bin/python benchmarks/eval_speed.py --embedder static --dialogues 45000 --personas 1800 \
        --no-second-pass

``--offline-only`` times only what needs no embedding model — lexical diversity (MATTR, Yule's
K, HD-D) per side, the Client diagnostics, their z-scores against a reference (the run itself),
language compliance, the rule's echoing onset and the paired comparison of every metric — so
the SPASM corpus size
(45,000 dialogues) can be measured in minutes:

    .venv/bin/python benchmarks/eval_speed.py [--dialogues 5000] [--personas 200] [--keep DIR]
    .venv/bin/python benchmarks/eval_speed.py --offline-only --dialogues 45000 --personas 1800

Not part of the test suite: it takes minutes.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from benchmarks._rss import peak_rss_mib  # noqa: E402 - needs ROOT on sys.path


def offline_only(run_dir: Path) -> None:
    """Time the metrics that need no embedder, stage by stage, on ``run_dir``."""
    import numpy as np

    from spasm.evaluation.compare import compare_conditions
    from spasm.evaluation.echoing import rule_echoing
    from spasm.evaluation.language import language_scan
    from spasm.evaluation.loader import load_run
    from spasm.evaluation.onset import onset_curves, onset_turn
    from spasm.evaluation.realism import realism_frame, realism_metrics, reference_stats, z_scores

    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    data = load_run(run_dir)
    convs = data.conversations
    timings["load"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    frame = realism_frame(convs)
    timings["lexical+diagnostics"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    stats = reference_stats(frame)  # the run as its own reference: same cost as another one
    frame = frame.join(z_scores(frame, stats))
    timings["reference z-scores"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    realism_metrics(frame, convs)
    timings["realism aggregate"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    language_scan(convs, data.by_id)
    timings["language"] = time.perf_counter() - t0

    # The rule needs an embedding per utterance for its mirror signal; orthogonal stand-ins
    # cost nothing, so this times the copy/cue signals and the onset alone.
    t0 = time.perf_counter()
    eye = np.eye(max(len(c.texts) for c in convs), dtype=np.float32)
    onsets = {}
    for c in convs:
        verdict = rule_echoing(c, eye[: len(c.texts)])
        onsets[c.dialogue_id] = onset_turn(verdict)
    onset_curves(convs, onsets)
    timings["rule echoing+onset"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    per = frame.reset_index()
    info = {c.dialogue_id: c for c in convs}
    for column in ("persona_id", "conversation_index", "seed", "pairing", "condition", "harness_level"):
        per[column] = [getattr(info[d], column) for d in per["dialogue_id"]]
    comparison = compare_conditions(per)
    timings["paired comparison"] = time.perf_counter() - t0

    total = sum(timings.values())
    n = len(convs)
    print(f"\noffline metrics on {n} dialogues: {total:.1f} s -> {n / total:.0f} dialogues/s; "
          f"peak RSS {peak_rss_mib():.0f} MiB")
    print("  stages: " + ", ".join(f"{k} {v:.1f}s" for k, v in timings.items()))
    print(f"  contrasts: {len(comparison.contrasts)} over {len(comparison.metrics)} metrics; "
          f"at this rate 45,000 dialogues take {45000 / (n / total) / 60:.1f} min")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dialogues", type=int, default=5000)
    parser.add_argument("--personas", type=int, default=200)
    parser.add_argument("--utterances", type=int, default=9)
    parser.add_argument("--keep", type=Path, default=None, help="write the run here and keep it")
    parser.add_argument("--no-second-pass", action="store_true")
    parser.add_argument(
        "--embedder",
        choices=("local", "static"),
        default="local",
        help="local (default: int8 MiniLM on onnxruntime) or static (its distilled token table)",
    )
    parser.add_argument(
        "--offline-only", action="store_true", help="only the metrics that need no embedding model"
    )
    args = parser.parse_args()

    from spasm.dataset.synthetic import synthesize_run
    from spasm.evaluation import evaluate
    from spasm.evaluation.embeddings import Embedder, StaticEmbedder, create_embedder

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
        print(f"cores: {os.cpu_count()}, embedder {args.embedder}, onnxruntime intra-op threads: 2")
        if args.offline_only:
            offline_only(run_dir)
            return

        embedder: Embedder = create_embedder(args.embedder)
        if isinstance(embedder, StaticEmbedder):
            t0 = time.perf_counter()
            embedder.embed([""])  # loads the table: distilled once per model file, then cached
            how = "distilled" if embedder.distilled else "read from the cache"
            print(
                f"static table {how} in {time.perf_counter() - t0:.1f} s "
                f"(its distillation took {embedder.distill_seconds:.1f} s): {embedder.table_path}"
            )
        load_before = os.getloadavg()[0]
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        m = evaluate(run_dir, embedder=embedder, mode="cheap", progress=None)
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
        print(f"  peak RSS {peak_rss_mib():.0f} MiB")
        o = m.echoing.overall
        print(
            f"  echoing rate {o.rate:.1%}; separability groups {len(m.separability)}; "
            f"report {run_dir / 'eval' / 'report.html'}"
        )

        if not args.no_second_pass:
            t0 = time.perf_counter()
            m2 = evaluate(run_dir, embedder=embedder, mode="cheap", progress=False)
            print(
                f"\nwarm run (cached embeddings): {time.perf_counter() - t0:.1f} s wall, "
                f"texts embedded {m2.counts.texts_embedded}"
            )
    finally:
        if args.keep is None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
