"""How fast `spasm view` answers on a run of 45,000 dialogues, and how much memory it holds.

Synthesises a run (``spasm.dataset.synthetic.synthesize_run``: 45,000 dialogues of 9
utterances, 2,000 personas, ECP and CONCAT, two pairings; ~30 s) unless ``--run`` names one
already there, starts ``spasm view RUN --port 0 --no-browser`` as a **separate process**, and
times sequential HTTP requests from this one (urllib, keep-alive off: the worst case):

* ``list+filter``: the dialogue list filtered by condition and pairing, at a random page;
* ``list+persona+sort``: filtered by a persona field and an age range, sorted by tokens;
* ``list+search``: full-text search in all 405,000 utterances, with a filter;
* ``dialogue``: one dialogue page (its turns, what each agent saw verified for every turn,
  the persona, prev/next in the filtered list);
* ``seen``: the "what the agent saw" panel of one turn; ``compare``: the side-by-side page;
* ``overview``; ``label``: posting one label (a committed batch through the run store).

The server's peak resident memory is read from ``/proc/PID/status`` (``VmHWM``) at the end.

    .venv/bin/python benchmarks/viewer.py [--run DIR] [--dialogues 45000] [--requests 30]

Target: list with a filter and dialogue page each under 300 ms on 2 cores, and
the server under 500 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any


def _get(url: str) -> float:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as r:
        r.read()
        if r.status != 200:
            raise RuntimeError(f"{url}: HTTP {r.status}")
    return time.perf_counter() - t0


def _post(url: str, body: dict[str, Any]) -> float:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(request, timeout=60) as r:
        r.read()
    return time.perf_counter() - t0


def _status(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmHWM", "VmRSS")):
            key, value = line.split(":", 1)
            out[key] = int(value.split()[0]) // 1024
    return out


def _summary(times: list[float]) -> dict[str, float]:
    ms = sorted(t * 1000 for t in times)
    p95 = ms[min(len(ms) - 1, round(0.95 * (len(ms) - 1)))]
    return {"n": len(ms), "median_ms": round(statistics.median(ms), 1), "p95_ms": round(p95, 1),
            "max_ms": round(ms[-1], 1)}


def _requests(base: str, n_dialogues: int, n: int, rng: random.Random) -> dict[str, list[str]]:
    pairs = n_dialogues // 2

    def did() -> str:
        return f"d{rng.randrange(pairs):05d}-{rng.choice(['ecp', 'concat'])}"

    def q(did_: str) -> str:
        return urllib.parse.quote(did_, safe="")

    cities = ["Leeds", "Lyon", "Austin", "Porto", "Osaka", "Gdansk", "Cork", "Denver"]
    words = ["supervisor", "refund", "written summary", "formal review", "reference", "broadband"]
    return {
        "list+filter": [f"{base}/dialogues?condition=concat&pairing=gpt%2Fgpt&page={rng.randint(1, 200)}"
                        for _ in range(n)],
        "list+persona+sort": [f"{base}/dialogues?p.city={rng.choice(cities)}&pmin.age=30&pmax.age=50"
                              f"&sort=tokens&desc=1&page={rng.randint(1, 5)}" for _ in range(n)],
        "list+search": [f"{base}/dialogues?condition=ecp&q={urllib.parse.quote(rng.choice(words))}"
                        for _ in range(n)],
        "dialogue": [f"{base}/d/{q(did())}?from=condition%3Dconcat" for _ in range(n)],
        "seen": [f"{base}/d/{q(did())}/seen/{rng.randint(0, 8)}?fragment=1" for _ in range(n)],
        "compare": [f"{base}/compare/{q(did())}" for _ in range(n)],
        "overview": [f"{base}/" for _ in range(max(3, n // 5))],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, default=None,
                        help="synthesise the run here once and reuse it (the server runs on a copy)")
    parser.add_argument("--dialogues", type=int, default=45_000)
    parser.add_argument("--personas", type=int, default=2_000)
    parser.add_argument("--requests", type=int, default=30, help="requests per kind (default 30)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()

    from spasm.dataset import open_run
    from spasm.dataset.synthetic import synthesize_run

    tmp = Path(tempfile.mkdtemp(prefix="spasm-view-bench-"))
    source = args.run or tmp / "source"
    try:
        if not (source / "dialogues.parquet").exists():
            t0 = time.perf_counter()
            synthesize_run(source, n_dialogues=args.dialogues, n_personas=args.personas)
            print(f"synthesised {args.dialogues} dialogues in {time.perf_counter() - t0:.1f} s -> {source}")
        run_dir = tmp / "run"  # a copy: the labels the benchmark posts never touch the source
        shutil.copytree(source, run_dir)
        n = len(open_run(run_dir).dialogues)
        print(f"run: {run_dir} ({n} dialogues); cores: {os.cpu_count()}")
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "spasm", "view", str(run_dir), "--port", "0",
                                 "--no-browser"], stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            found = re.search(r"(http://127\.0\.0\.1:\d+)/", proc.stdout.readline())
            if not found:
                raise RuntimeError("spasm view printed no URL")
            base = found.group(1)
            _get(base + "/")
            startup = time.perf_counter() - t0
            print(f"server pid {proc.pid}: index built and first page in {startup:.1f} s")
            rng = random.Random(0)
            plan = _requests(base, n, args.requests, rng)
            for urls in plan.values():  # one warm-up request per kind
                _get(urls[0])
            results: dict[str, Any] = {}
            for kind, urls in plan.items():
                results[kind] = _summary([_get(u) for u in urls])
            label = [_post(base + "/api/labels", {"dialogue_id": f"d{i:05d}-ecp", "annotator": "bench",
                                                  "echoing": "none"}) for i in range(args.requests)]
            results["label"] = _summary(label)
            memory = _status(proc.pid)
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        print(f"\n{'request':<20}{'n':>4}{'median ms':>11}{'p95 ms':>9}{'max ms':>9}")
        for kind, r in results.items():
            print(f"{kind:<20}{r['n']:>4}{r['median_ms']:>11}{r['p95_ms']:>9}{r['max_ms']:>9}")
        print(f"\nserver memory: peak {memory['VmHWM']} MB, at the end {memory['VmRSS']} MB")
        ok = (results["list+filter"]["p95_ms"] < 300 and results["dialogue"]["p95_ms"] < 300
              and memory["VmHWM"] < 500)
        verdict = "met" if ok else "NOT met"
        print(f"acceptance (list+filter and dialogue p95 < 300 ms, peak < 500 MB): {verdict}")
        if args.json:
            args.json.write_text(json.dumps({"dialogues": n, "startup_s": round(startup, 2),
                                             "requests": results, "memory_mb": memory}, indent=2))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
