"""Peak memory of ``spasm merge`` and of the end-of-run compaction as the run grows.

For each size (default 5,000 and 45,000 dialogues) it builds, untimed:

* a synthetic run (:func:`spasm.dataset.synthetic.synthesize_run`: 9-utterance dialogues, 25
  per persona) plus a synthetic ``calls`` table, one call per utterance, as generation logs;
* that run split by persona into ``--shards`` complete shard directories (``persona_index %
  N``, what ``--shard I/N`` does), each written batch by batch and compacted like a finished
  shard;
* the same rows as one uncompacted run: a part per ``--flush-every`` dialogues, as the engine
  leaves a run just before its end-of-run compaction.

Then a fresh Python process per measurement runs one step and reports its peak resident set
size (``VmHWM``): **merge** (:func:`spasm.dataset.merge.merge_runs` of the shards) and
**compact** (``RunStore.compact_all`` of the uncompacted run). **baseline** is a process that
only imports them. ``--control`` adds the previous, in-memory compaction (read every part,
sort, de-duplicate) on the same runs, to show that the measurement does see memory that grows
with the run. Prints a table and the largest/smallest ratios; ``--json FILE`` writes them::

    .venv/bin/python benchmarks/merge_memory.py            # ~3 min on 2 cores
    .venv/bin/python benchmarks/merge_memory.py --sizes 5000,45000 --shards 3 --control
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from benchmarks._rss import peak_rss_mib  # noqa: E402 - needs ROOT on sys.path

TABLES = ("personas", "dialogues", "turns", "calls")


# -- building the inputs (untimed, in the parent process) -------------------------------------
def _calls(turns: list[dict[str, Any]], dialogues: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One logged call per utterance, shaped like the engine's calls rows."""
    t0 = datetime(2025, 1, 1, tzinfo=UTC)
    rows = []
    for i, t in enumerate(turns):
        d = dialogues[t["dialogue_id"]]
        digest = hashlib.sha256(f"{t['dialogue_id']}/{t['turn_index']}".encode()).hexdigest()
        rows.append({
            "call_id": f"20250101T000000000000:{t['dialogue_id']}#{t['turn_index'] + 1:04d}",
            "dialogue_id": t["dialogue_id"], "persona_id": d["persona_id"], "role": t["speaker"],
            "backend": "srv", "model": "m", "resolved_model": "m-2025", "request_hash": digest,
            "params": '{"max_tokens": 80, "temperature": 0.7}', "attempt": 1,
            "prompt_tokens": 40 * (t["turn_index"] + 1), "completion_tokens": len(t["text"]) // 4,
            "latency_s": 0.2, "outcome": "ok", "started_at": t0 + timedelta(milliseconds=i),
        })
    return rows


def _write(store: Any, rows: dict[str, list[dict[str, Any]]], personas: list[dict[str, Any]],
           flush_every: int) -> None:
    """Write like the engine: personas first, then a batch per ``flush_every`` dialogues."""
    store.write_batch("personas", {"personas": personas, "persona_rejections": []})
    ids = [d["dialogue_id"] for d in rows["dialogues"]]
    by_dialogue: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for table in ("dialogues", "turns", "calls"):
        for r in rows[table]:
            by_dialogue.setdefault(r["dialogue_id"], {}).setdefault(table, []).append(r)
    for b, i in enumerate(range(0, len(ids), flush_every)):
        batch: dict[str, list[dict[str, Any]]] = {"dialogues": [], "turns": [], "calls": []}
        for did in ids[i : i + flush_every]:
            for table in batch:
                batch[table] += by_dialogue[did].get(table, [])
        store.write_batch(f"{b + 1:06d}", batch)


def build(size: int, shards: int, flush_every: int, work: Path) -> dict[str, Any]:
    """The synthetic shards and the uncompacted run of ``size`` dialogues."""
    from spasm.dataset.reader import open_run
    from spasm.dataset.store import RunStore
    from spasm.dataset.synthetic import synthesize_run
    from spasm.personas.schema import load_schema
    from spasm.runplan import Shard

    src = synthesize_run(work / f"src-{size}", n_dialogues=size, n_personas=max(1, size // 25))
    run = open_run(src)
    personas = run.table("personas").to_pylist()
    dialogues = run.table("dialogues").to_pylist()
    turns = run.table("turns").to_pylist()
    calls = _calls(turns, {d["dialogue_id"]: d for d in dialogues})
    schema = load_schema(None)
    fields = (schema.field_names, schema.integer_fields())
    index = {p["persona_id"]: p["persona_index"] for p in personas}
    whole = RunStore(work / f"uncompacted-{size}")
    whole.create()
    whole.set_persona_fields(*fields)
    _write(whole, {"dialogues": dialogues, "turns": turns, "calls": calls}, personas, flush_every)
    dirs = []
    for i in range(shards):
        shard = Shard(i, shards)
        mine = {p["persona_id"] for p in personas if shard.owns(p)}
        rows = {"dialogues": [d for d in dialogues if d["persona_id"] in mine]}
        keep = {d["dialogue_id"] for d in rows["dialogues"]}
        rows["turns"] = [t for t in turns if t["dialogue_id"] in keep]
        rows["calls"] = [c for c in calls if c["dialogue_id"] in keep]
        store = RunStore(work / f"shards-{size}" / shard.dirname)
        store.create()
        store.set_persona_fields(*fields)
        _write(store, rows, shard.select(personas), flush_every)
        store.compact_all()
        store.write_json("config.json", {"fingerprint": "benchmark", "config": {}})
        store.write_json("manifest.json", {
            "schema_version": run.schema_version, "status": "complete",
            "shard": shard.record(personas),
            "counts": {"planned": len(keep), "completed": len(keep)},
        })
        dirs.append(str(store.dir))
    assert all(index[d["persona_id"]] >= 0 for d in dialogues)
    return {"shards": dirs, "uncompacted": str(whole.dir), "rows": {
        "dialogues": len(dialogues), "turns": len(turns), "calls": len(calls)}}


# -- one measurement per fresh process ---------------------------------------------------------
def _measure(step: str, args: list[str]) -> dict[str, Any]:
    """Run in the child: one step, then report the peak RSS of this process."""
    from spasm.dataset.merge import merge_runs
    from spasm.dataset.store import RunStore

    t0 = time.perf_counter()
    if step == "merge":
        *shards, out = args
        merge_runs(shards, out)
    elif step == "compact":
        RunStore(Path(args[0])).compact_all()
    elif step == "control":  # the previous method: the whole table in memory, sorted
        import pyarrow as pa

        from spasm.dataset.store import table_keys
        from spasm.dataset.streaming import dedupe_sorted, sort_rows

        store = RunStore(Path(args[0]))
        for table in TABLES:
            data = store.read(table)
            if data is not None:
                keys = table_keys(table)
                kept = dedupe_sorted(sort_rows(data, keys), keys)
                assert isinstance(kept, pa.Table)
    elif step != "baseline":
        raise SystemExit(f"unknown step {step}")
    return {"peak_mib": peak_rss_mib(), "seconds": time.perf_counter() - t0}


def _child(step: str, *args: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, __file__, "--child", step, *args],
                          capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="5000,45000", help="dialogue counts (comma-separated)")
    parser.add_argument("--shards", type=int, default=3)
    parser.add_argument("--flush-every", type=int, default=32,
                        help="dialogues per part of the uncompacted run (the engine's default)")
    parser.add_argument("--control", action="store_true",
                        help="also measure the previous in-memory compaction")
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    parser.add_argument("--work", type=Path,
                        help="build the inputs here and keep them (reused when already built)")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_measure(args.child[0], args.child[1:])))
        return 0
    sizes = [int(s) for s in args.sizes.split(",")]
    results: dict[str, Any] = {"baseline": _child("baseline"), "sizes": {}}
    with tempfile.TemporaryDirectory(prefix="spasm-merge-bench-") as tmp:
        for size in sizes:
            work = (args.work or Path(tmp)) / f"{size}-{args.shards}-{args.flush_every}"
            t0 = time.perf_counter()
            index = work / "built.json"
            if index.exists():
                built = json.loads(index.read_text())
            else:
                shutil.rmtree(work, ignore_errors=True)
                built = build(size, args.shards, args.flush_every, work)
                index.write_text(json.dumps(built))
            row: dict[str, Any] = {"rows": built["rows"], "build_s": time.perf_counter() - t0}
            shutil.rmtree(work / "merged", ignore_errors=True)
            row["merge"] = _child("merge", *built["shards"], str(work / "merged"))
            if args.control:
                row["control"] = _child("control", built["uncompacted"])
            # Compaction replaces the parts, so it runs on a copy (the inputs stay reusable).
            shutil.rmtree(work / "compacting", ignore_errors=True)
            shutil.copytree(built["uncompacted"], work / "compacting")
            row["compact"] = _child("compact", str(work / "compacting"))
            results["sizes"][size] = row
    _report(results, sizes, args.control)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


def _report(results: dict[str, Any], sizes: list[int], control: bool) -> None:
    steps = ["merge", "compact"] + (["control"] if control else [])
    print(f"baseline (imports only): {results['baseline']['peak_mib']:.0f} MiB peak RSS")
    head = "  ".join(f"{s + ' MiB (s)':>18}" for s in steps)
    print(f"{'dialogues':>10} {'turns':>9} {'calls':>9}  {head}")
    for size in sizes:
        r = results["sizes"][size]
        cells = "  ".join(f"{r[s]['peak_mib']:>10.0f} ({r[s]['seconds']:5.1f})" for s in steps)
        print(f"{size:>10,} {r['rows']['turns']:>9,} {r['rows']['calls']:>9,}  {cells}")
    lo, hi = results["sizes"][sizes[0]], results["sizes"][sizes[-1]]
    for s in steps:
        ratio = hi[s]["peak_mib"] / lo[s]["peak_mib"]
        results.setdefault("ratios", {})[s] = ratio
        print(f"{s}: peak RSS at {sizes[-1]:,} / at {sizes[0]:,} dialogues = {ratio:.2f}")


if __name__ == "__main__":
    raise SystemExit(main())
