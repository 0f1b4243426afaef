"""Export and QA of a synthetic SPASM-size run: time and peak memory.

Builds a synthetic run of ``--dialogues`` dialogues (default 45,000, SPASM's full size; 4,500
personas × 10 conversations; ``--utterances`` each) with planted duplicates, then measures, each
in a **fresh process** so that its peak resident set size (``ru_maxrss``) is its own:

* ``qa``: ``spasm qa`` (every scan, then the ``qa`` table replaced);
* ``export``: ``spasm export`` with all three formats, role responder, split 0.9/0.05/0.05
  (its own QA scan included: the whole command a user runs);
* ``minhash``: the duplicate index alone (:class:`spasm.export.dedup.DuplicateIndex`, the
  method QA uses: datasketch MinHash signatures in a matrix, banded by sorting) over the streamed
  dialogues;
* ``lsh_index``: the same signatures in datasketch's own ``MinHashLSH`` index (query, then
  insert, one dialogue at a time);
* ``blocked``: exact Jaccard of word 5-gram sets over candidate pairs blocked by persona (a
  cheap blocking key), with the sets kept as sorted uint32 arrays.

The planted duplicates (``--planted`` of each): exact copies under another persona, near copies
(two words changed) under **the same** persona and near copies under **another** persona. Each
method's recall on them is printed with the pairs it found in total. The baseline is the peak
of a process that only imported spasm.export and opened the run.

    .venv/bin/python benchmarks/export.py                     # 45,000 × 9 utterances
    .venv/bin/python benchmarks/export.py --utterances 20     # longer dialogues
    .venv/bin/python benchmarks/export.py --dialogues 5000    # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
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

_TIKTOKEN = ROOT.parent / "shared" / "data" / "tiktoken"
if _TIKTOKEN.is_dir():
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(_TIKTOKEN))


# --------------------------------------------------------------------------------- the run

def _near(texts: list[str], rng: random.Random) -> list[str]:
    out = list(texts)
    for k in rng.sample(range(len(out)), 2):
        words = out[k].split()
        words[rng.randrange(len(words))] = "changed"
        out[k] = " ".join(words)
    return out


def build_run(run_dir: Path, dialogues: int, personas: int, utterances: int, planted: int) -> dict[str, Any]:
    """A synthetic run with ``3 * planted`` planted copies (see the module docstring)."""
    from spasm.dataset import open_run
    from spasm.dataset.synthetic import synthesize_run, write_run

    base = run_dir.with_name(run_dir.name + "-base")
    synthesize_run(base, n_dialogues=dialogues - 3 * planted, n_personas=personas,
                   n_utterances=utterances, seed=11)
    run = open_run(base)
    people = run.table("personas").to_pylist()
    rows = {r["dialogue_id"]: r for r in run.table("dialogues").to_pylist()}
    texts: dict[str, list[str]] = {}
    for batch in run.batches("turns", columns=["dialogue_id", "text"]):
        for d, t in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(), strict=True):
            texts.setdefault(d, []).append(t)
    rng = random.Random(5)
    sources = rng.sample(sorted(texts), 3 * planted)
    kinds = ("exact", "near_same_persona", "near_other_persona")
    expected: dict[str, list[tuple[str, str]]] = {k: [] for k in kinds}
    extra = []
    for k, src in enumerate(sources):
        kind = list(expected)[k % 3]
        other = people[(int(rng.random() * len(people)))]["persona_id"]
        persona = rows[src]["persona_id"] if kind == "near_same_persona" else other
        copy = [t.upper() for t in texts[src]] if kind == "exact" else _near(texts[src], rng)
        new_id = f"z{k:05d}-{kind}"
        same = {c: rows[src][c] for c in ("condition", "pairing", "client_backend", "responder_backend")}
        extra.append({**same, "dialogue_id": new_id, "persona_id": persona, "texts": copy})
        expected[kind].append((new_id, src))
    records = [{**{c: rows[d][c] for c in ("dialogue_id", "persona_id", "conversation_index", "condition",
                                             "pairing", "client_backend", "responder_backend", "seed")},
                "texts": texts[d]} for d in sorted(texts)]
    keep = [p for p in people]
    for p in keep:
        for col in ("persona_index", "seed", "card_source", "verdicts", "schema_name", "schema_version",
                    "policy", "policy_version", "persona_fields"):
            p.pop(col, None)
    del texts, rows
    write_run(run_dir, keep, records + extra)
    shutil.rmtree(base)
    return expected


# --------------------------------------------------------------------------------- children

def child_baseline(run_dir: Path) -> dict[str, Any]:
    import spasm.export  # noqa: F401
    from spasm.dataset import open_run

    open_run(run_dir).manifest  # noqa: B018
    return {}


def child_qa(run_dir: Path) -> dict[str, Any]:
    from spasm.dataset import open_run
    from spasm.export.qa import scan_run, write_qa

    t0 = time.perf_counter()
    result = scan_run(open_run(run_dir))
    write_qa(run_dir, result)
    return {"wall_s": time.perf_counter() - t0, "findings": result.summary.findings,
            "turns": result.summary.turns}


def child_export(run_dir: Path, out: Path) -> dict[str, Any]:
    from spasm.export.pipeline import ExportOptions, export_run

    t0 = time.perf_counter()
    summary = export_run(run_dir, out, ExportOptions(overwrite=True))
    wall = time.perf_counter() - t0
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file()) / 2**20
    return {"wall_s": wall, "examples": summary.stats.examples, "dropped": summary.stats.dropped,
            "splits": {k: v.examples for k, v in summary.stats.splits.items()}, "output_mib": size}


def _stream(run_dir: Path) -> Any:
    from spasm.dataset import open_run
    from spasm.export.stream import iter_dialogues, turn_index

    run = open_run(run_dir)
    return iter_dialogues(run, turn_index(run))


def child_minhash(run_dir: Path) -> dict[str, Any]:
    from spasm.export.dedup import DuplicateIndex

    t0 = time.perf_counter()
    index = DuplicateIndex()
    for did, turns in _stream(run_dir):
        index.add(did, turns)
    found = [(f.dialogue_id, f.other, f.kind) for f in index.findings()]
    return {"wall_s": time.perf_counter() - t0, "pairs": found}


def child_lsh_index(run_dir: Path) -> dict[str, Any]:
    """The same signatures queried and inserted one by one in datasketch's MinHashLSH index."""
    import datasketch
    import numpy as np

    from spasm.export.dedup import NUM_PERM, SHINGLE_WORDS, gram_hashes, word_hashes
    from spasm.export.scans import words_of

    t0 = time.perf_counter()
    perm = datasketch.MinHash(num_perm=NUM_PERM, seed=1).permutations
    lsh = datasketch.MinHashLSH(threshold=0.8, num_perm=NUM_PERM)
    sigs: dict[str, Any] = {}
    found = []
    for did, turns in _stream(run_dir):
        words = word_hashes(w for t in turns for w in words_of(t.text))
        m = datasketch.MinHash(num_perm=NUM_PERM, permutations=perm, scheme="affine32", hashfunc=lambda x: x)
        m.update_batch(np.unique(gram_hashes(words, SHINGLE_WORDS) >> np.uint64(32)).tolist())
        sig = datasketch.LeanMinHash(m)
        for other in lsh.query(sig):
            if np.mean(sig.hashvalues == sigs[other].hashvalues) >= 0.8:
                same = bool((sig.hashvalues == sigs[other].hashvalues).all())
                found.append((max(did, other), min(did, other), "duplicate" if same else "near_duplicate"))
        lsh.insert(did, sig)
        sigs[did] = sig
    return {"wall_s": time.perf_counter() - t0, "pairs": found}


def child_blocked(run_dir: Path) -> dict[str, Any]:
    import numpy as np

    from spasm.dataset import open_run
    from spasm.export.dedup import SHINGLE_WORDS, gram_hashes, word_hashes
    from spasm.export.scans import words_of

    t0 = time.perf_counter()
    dialogues = open_run(run_dir).table("dialogues", ["dialogue_id", "persona_id"])
    ids, owners = (dialogues.column(c).to_pylist() for c in ("dialogue_id", "persona_id"))
    persona = dict(zip(ids, owners, strict=True))
    sets: dict[str, np.ndarray] = {}
    for did, turns in _stream(run_dir):
        words = word_hashes(w for t in turns for w in words_of(t.text))
        sets[did] = np.unique((gram_hashes(words, SHINGLE_WORDS) >> np.uint64(32)).astype(np.uint32))
    blocks: dict[str, list[str]] = {}
    for d in sorted(sets):
        blocks.setdefault(persona[d], []).append(d)
    found, compared = [], 0
    for ids in blocks.values():
        for i, a in enumerate(ids):
            for b in ids[:i]:
                compared += 1
                inter = np.intersect1d(sets[a], sets[b], assume_unique=True).size
                union = sets[a].size + sets[b].size - inter
                if union and inter / union >= 0.8:
                    found.append((max(a, b), min(a, b), "duplicate" if inter == union else "near_duplicate"))
    return {"wall_s": time.perf_counter() - t0, "pairs": found, "compared": compared}


def child_build(run_dir: Path, spec: str) -> dict[str, Any]:
    dialogues, personas, utterances, planted = (int(x) for x in spec.split(","))
    return {"expected": build_run(run_dir, dialogues, personas, utterances, planted)}


CHILDREN = {"baseline": child_baseline, "qa": child_qa, "minhash": child_minhash,
            "lsh_index": child_lsh_index, "blocked": child_blocked}


def child(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    if args.child == "export":
        result = child_export(run_dir, Path(args.out))
    elif args.child == "build":
        result = child_build(run_dir, args.out)
    else:
        result = CHILDREN[args.child](run_dir)
    result["peak_mib"] = peak_rss_mib()
    print(json.dumps(result), flush=True)
    return 0


# --------------------------------------------------------------------------------- the parent

def _run_child(name: str, run_dir: Path, out: Path | str) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", name, "--run-dir", str(run_dir), "--out", str(out)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed:\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    result["process_s"] = time.perf_counter() - t0
    return result


def _recall(pairs: list[list[str]], expected: dict[str, list[tuple[str, str]]]) -> dict[str, str]:
    """Near copies found (exact copies are found by their digest whatever the near method)."""
    found = {(a, b) for a, b, _ in pairs} | {(b, a) for a, b, _ in pairs}
    return {kind: f"{sum((n, s) in found for n, s in exp)}/{len(exp)}" for kind, exp in expected.items()
            if kind != "exact"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dialogues", type=int, default=45_000)
    p.add_argument("--personas", type=int, default=4_500)
    p.add_argument("--utterances", type=int, default=9, help="utterances per dialogue (default 9)")
    p.add_argument("--planted", type=int, default=100, help="planted copies of each kind (default 100)")
    p.add_argument("--skip-alternatives", action="store_true",
                   help="do not measure the alternatives to QA's near-duplicate method")
    p.add_argument("--keep", type=Path, help="build the run here and keep it (default: a temp dir)")
    p.add_argument("--json", type=Path, help="also write the figures as JSON")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--run-dir", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(args)
    tmp = Path(tempfile.mkdtemp(prefix="spasm-bench-export-"))
    run_dir = (args.keep or tmp) / "run"
    try:
        t0 = time.perf_counter()
        spec = f"{args.dialogues},{args.personas},{args.utterances},{args.planted}"
        built = _run_child("build", run_dir, spec)
        expected = {k: [tuple(pair) for pair in v] for k, v in built["expected"].items()}
        print(f"built {args.dialogues} dialogues × {args.utterances} utterances, {args.personas} personas "
              f"({3 * args.planted} planted copies) in {time.perf_counter() - t0:.0f} s")
        names = ["baseline", "qa", "export", "minhash"]
        names += [] if args.skip_alternatives else ["lsh_index", "blocked"]
        results = {n: _run_child(n, run_dir, tmp / "export") for n in names}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    base = results["baseline"]["peak_mib"]
    print(f"\n{platform.python_implementation()} {platform.python_version()}, {os.cpu_count()} CPUs; "
          f"baseline (imports + open_run) {base:.0f} MiB")
    print(f"{'measurement':<14} {'wall s':>8} {'peak MiB':>9} {'over base':>10}  notes")
    for name in names[1:]:
        r = results[name]
        note = ""
        if name == "qa":
            note = f"{r['turns']} utterances; findings {r['findings']}"
        elif name == "export":
            note = f"{r['examples']} examples {r['splits']}, {r['output_mib']:.0f} MiB written"
        else:
            near = sum(1 for pair in r["pairs"] if pair[2] == "near_duplicate")
            note = f"{near} near pairs; recall {_recall(r['pairs'], expected)}"
            if "compared" in r:
                note += f"; {r['compared']} pairs compared"
        print(f"{name:<14} {r['wall_s']:>8.1f} {r['peak_mib']:>9.0f} {r['peak_mib'] - base:>10.0f}  {note}")
    if args.json:
        for r in results.values():
            r.pop("pairs", None)
        figures = {"args": {k: str(v) for k, v in vars(args).items()}, "results": results,
                   "expected": {k: len(v) for k, v in expected.items()}}
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
