"""The engine's throughput per call with tools against the same run without.

What it measures, in one process and one invocation, against one test-server subprocess
(``python -m spasm.testing.server --latency L --call-tools``, so its CPU is never charged to
the engine):

1. **Without tools**: N dialogues of exactly U utterances (``termination.rules: false``), one
   scenario, ``max_concurrency`` C, the cache off: N × U calls.
2. **With tools**: the same config plus ``tools:`` (one Responder tool with a notice) and the
   scenario's world. The server calls the tool at every Responder turn's first step
   (:func:`spasm.testing.server.call_first_tool`), so each Responder turn is two calls: a tool
   step (the ToolBelt validates the arguments, runs the tool on a copy of the world in a worker
   thread, hashes the world, makes three events) and the utterance. N × U × 3/2 calls, and
   every dialogue writes its events and worlds rows.

Both at the same latency L and concurrency C, with as many dialogues in flight (the engine's
default). Each is reported as calls/s end to end (``Engine.run``'s wall time) and over the
window from the first call's start to the last call's end, and **with tools / without** as a
ratio: the per-call cost of acting. Goal: ≥ 0.95. A dialogue with tools is a longer chain of
calls (1.5 U instead of U), so with N a multiple of C both runs have the same number of waves
and the same schedule bound::

    .venv/bin/python benchmarks/tools_throughput.py                  # N=64, U=8, C=32, L=0.2
    .venv/bin/python benchmarks/tools_throughput.py --repeat 3
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any

import openai

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from benchmarks.throughput import (  # noqa: E402 - needs ROOT on sys.path
    Measure,
    server_process,
    timed_utterance_run,
    utterance_parser,
)

TOOL_MODULE = '''"""The tools benchmark's one tool."""
import spasm


@spasm.tool(owner="responder", notice="[The agent is looking something up]")
def lookup(world: dict, key: str) -> dict:
    """Look a key up in the shop's records.

    Args:
        key: What to look up.
    """
    return {"key": key, "found": world.get("records", {}).get(key)}
'''

SCENARIO = {
    "id": "lookup", "situation": "You want to know about your order.",
    "goal": "Learn what the shop knows about your order.",
    "expected_outcome": "The agent tells you about the order.",
}


def config(base_url: str, dialogues: int, concurrency: int, utterances: int,
           tools: Path | None) -> dict[str, Any]:
    """Exactly ``dialogues`` dialogues of exactly ``utterances`` utterances; with ``tools``
    (a tool module) the same run with tools and a world."""
    personas = max(d for d in range(1, 51) if dialogues % d == 0)
    scenario = dict(SCENARIO)
    data: dict[str, Any] = {
        "name": "bench", "seed": 7, "conditions": ["ecp"],
        "personas": {"n": personas}, "conversations_per_persona": dialogues // personas,
        "backends": {"srv": {"kind": "openai", "base_url": base_url, "model": "m",
                             "max_concurrency": concurrency}},
        "pairings": [{"client": "srv", "responder": "srv"}],
        "dialogue": {"max_turns_per_agent": utterances // 2, "max_tokens": 40,
                     "max_tool_steps": 2},
        "termination": {"rules": False, "judge": False},
        "scenarios_judge": {"enabled": False},
        "engine": {"cache": False},
    }
    if tools is not None:
        data["tools"] = [str(tools)]
        scenario["world"] = {"records": {f"k{i}": {"status": "shipped"} for i in range(50)}}
    data["scenarios"] = [scenario]
    return data


def main(argv: list[str] | None = None) -> int:
    args = utterance_parser(__doc__).parse_args(argv)
    n, u, c, lat = args.dialogues, args.utterances, args.concurrency, args.latency
    if u < 2 or u % 2:
        raise SystemExit("--utterances must be even and at least 2")
    plain_calls, tool_calls = n * u, n * u * 3 // 2
    bound = c / lat
    print(f"spasm tools throughput benchmark: N={n} dialogues × U={u} utterances; {plain_calls} calls "
          f"without tools, {tool_calls} with (a tool step every Responder turn); C={c}, "
          f"L={lat * 1000:.0f} ms, bound C/L = {bound:.1f} calls/s")
    print(f"machine: {os.cpu_count()} CPUs, Python {platform.python_version()}, openai {openai.__version__}, "
          f"load average {os.getloadavg()[0]:.2f} (other processes on these cores skew every figure)")
    runs: dict[str, list[Measure]] = {"without tools": [], "with tools": []}
    with tempfile.TemporaryDirectory(prefix="spasm-bench-tools-") as tmp:
        module = Path(tmp) / "bench_tools.py"
        module.write_text(TOOL_MODULE)
        with server_process(lat, "--call-tools") as srv:
            timed_utterance_run(config(srv.base_url, min(n, c), c, 2, module), min(n, c),
                                min(n, c) * 3, 2)  # warm-up (imports, the tool module)
            for _ in range(args.repeat):  # interleaved: a change in the machine's load hits both
                runs["without tools"].append(
                    timed_utterance_run(config(srv.base_url, n, c, u, None), n, plain_calls, u))
                runs["with tools"].append(
                    timed_utterance_run(config(srv.base_url, n, c, u, module), n, tool_calls, u))
    best = {k: max(v, key=lambda m: m.rate) for k, v in runs.items()}
    plain, acting = best["without tools"], best["with tools"]
    print()
    print(f"Throughput per call at L = {lat * 1000:.0f} ms, C = {c} (bound {bound:.1f} calls/s); "
          f"best of {args.repeat}")
    print(f"  {'':16} {'calls':>6} {'wall s':>7} {'calls/s':>8} {'/ (C/L)':>8} {'window calls/s':>15} "
          f"{'/ (C/L)':>8} {'CPU ms/call':>12}")
    for label, m in (("without tools", plain), ("with tools", acting)):
        w = m.window_rate or 0.0
        print(f"  {label:16} {m.calls:>6} {m.wall_s:>7.2f} {m.rate:>8.1f} {m.rate / bound:>8.3f} "
              f"{w:>15.1f} {w / bound:>8.3f} {m.cpu_ms_per_call:>12.2f}")
    ratio = acting.rate / plain.rate
    window_ratio = (acting.window_rate or 0.0) / (plain.window_rate or 1.0)
    print(f"  with tools / without, per call: {ratio:.3f} end to end, {window_ratio:.3f} first call "
          f"→ last call (goal ≥ 0.95)")
    if args.repeat > 1:
        print("  all runs, calls/s: " + "; ".join(
            f"{k} " + ", ".join(f"{m.rate:.1f}" for m in v) for k, v in runs.items()))
    if args.json:
        args.json.write_text(json.dumps({
            "args": {k: str(v) for k, v in vars(args).items()}, "bound": bound,
            "without_tools": vars(plain) | {"rate": plain.rate},
            "with_tools": vars(acting) | {"rate": acting.rate},
            "ratio": ratio, "window_ratio": window_ratio,
        }, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
