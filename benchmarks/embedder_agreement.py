"""What the fast ``static`` embedder changes: one run evaluated with ``local`` and with ``static``.

Evaluates the same run twice (cheap mode) and prints, side by side: the Spearman correlation
of every per-dialogue drift dimension and of the echo score, how often the echoing verdicts
agree, the echoing rates by pairing and condition, the ECP-vs-CONCAT drift comparison and the
persona separability of every group, plus each embedder's embedding time. By default the run
is synthesised (2,000 dialogues, 80 personas: the SPASM corpus's 25 dialogues a persona);
``--run DIR`` evaluates a run you have instead (an imported release, a real run; its eval/ is
left alone: results go to a temporary folder).

    .venv/bin/python benchmarks/embedder_agreement.py [--dialogues 2000] [--personas 80]
    .venv/bin/python benchmarks/embedder_agreement.py --run runs/my-run

Not part of the test suite: the ``local`` pass takes minutes (~18,000 texts).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

EMBEDDERS = ("local", "static")


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def _at(values: list[float | None], i: int) -> float | None:
    return values[i] if i < len(values) else None


def _spearman(a: Any, b: Any) -> float | None:
    from scipy.stats import spearmanr

    ok = a.notna() & b.notna()
    if ok.sum() < 3 or a[ok].nunique() < 2 or b[ok].nunique() < 2:
        return None
    return float(spearmanr(a[ok], b[ok]).statistic)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dialogues", type=int, default=2000)
    parser.add_argument("--personas", type=int, default=80)
    parser.add_argument("--run", type=Path, default=None, help="evaluate this run instead of a synthetic one")
    args = parser.parse_args()

    import pandas as pd

    from spasm.dataset.synthetic import synthesize_run
    from spasm.evaluation import evaluate
    from spasm.evaluation.pipeline import EVAL_DIRNAME

    tmp = Path(tempfile.mkdtemp(prefix="spasm-agreement-"))
    try:
        if args.run is None:
            run_dir = synthesize_run(tmp / "run", n_dialogues=args.dialogues, n_personas=args.personas)
            print(f"synthesised {args.dialogues} dialogues, {args.personas} personas -> {run_dir}")
        else:
            # A copy, so the run's own eval/ (and its embedding cache) stay as they were.
            run_dir = tmp / "run"
            shutil.copytree(args.run, run_dir, ignore=shutil.ignore_patterns(EVAL_DIRNAME))
        metrics, frames = {}, {}
        for name in EMBEDDERS:
            out = tmp / f"eval-{name}"
            t0 = time.perf_counter()
            metrics[name] = evaluate(run_dir, embedder=name, mode="cheap", out_dir=out, progress=False)
            frames[name] = pd.read_parquet(out / "per_dialogue.parquet").set_index("dialogue_id")
            m = metrics[name]
            print(
                f"{name:>6}: {m.embedder}; {time.perf_counter() - t0:.1f} s, of which embedding "
                f"{m.timings.get('embed_utterances', 0.0):.1f} s ({m.counts.texts_embedded} texts)"
            )
        local, static = frames["local"], frames["static"].reindex(frames["local"].index)

        print("\nper-dialogue agreement (Spearman rho, local vs static)")
        for column in [c for c in local.columns if c.startswith("drift_")] + ["echo_score"]:
            rho = _spearman(local[column], static[column])
            print(
                f"  {column:<22} rho {_fmt(rho)}   mean local {_fmt(local[column].mean())}"
                f"  static {_fmt(static[column].mean())}"
            )
        same = float((local["echoing"] == static["echoing"]).mean())
        print(f"  echoing verdict: the same for {same:.1%} of dialogues")

        print("\nechoing rate (rule)                      local    static")
        rates = {
            name: {(r.pairing, r.condition): r.rate for r in metrics[name].echoing.rates}
            for name in EMBEDDERS
        }
        overall = {name: metrics[name].echoing.overall.rate for name in EMBEDDERS}
        for key in sorted(rates["local"]):
            print(f"  {key[0] + ' / ' + key[1]:<38} {_fmt(rates['local'][key], '.1%'):>7}"
                  f"  {_fmt(rates['static'].get(key), '.1%'):>7}")
        print(f"  {'overall':<38} {_fmt(overall['local'], '.1%'):>7}  {_fmt(overall['static'], '.1%'):>7}")

        print("\ndrift, ECP - CONCAT (pairing all)        local delta (d)      static delta (d)")
        comps = {
            name: {c.dimension: c for c in metrics[name].drift.comparisons if c.pairing == "all"}
            for name in EMBEDDERS
        }
        for dim, c in comps["local"].items():
            s = comps["static"].get(dim)
            print(
                f"  {dim:<38} {_fmt(c.delta, '+.4f')} ({_fmt(c.cohen_d, '+.2f')})"
                f"    {_fmt(s.delta if s else None, '+.4f')} ({_fmt(s.cohen_d if s else None, '+.2f')})"
            )

        print(f"\n{'separability':<26}" + "".join(
            f"{h:<17}" for h in ("silhouette", "Davies-Bouldin", "intra distance", "Acc@1", "Acc@5")
        ))
        print(" " * 26 + "local  static    " * 5)
        groups = {
            name: {(g.pairing, g.condition): g for g in metrics[name].separability} for name in EMBEDDERS
        }
        for key, g in sorted(groups["local"].items()):
            h = groups["static"][key]
            cells = [
                (g.silhouette, h.silhouette),
                (g.davies_bouldin, h.davies_bouldin),
                (g.intra_mean, h.intra_mean),
                (_at(g.acc_at_k, 0), _at(h.acc_at_k, 0)),
                (_at(g.acc_at_k, 4), _at(h.acc_at_k, 4)),
            ]
            print(f"  {key[0] + ' / ' + key[1]:<23}" + "".join(
                f"{_fmt(a, '.3f'):>6} {_fmt(b, '.3f'):>6}    " for a, b in cells
            ).rstrip())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
