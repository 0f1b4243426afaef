"""The two-agent ECP loop on the embedded model: per-agent KV contexts against one shared one.

Both paths run the same dialogue (a Client persona and a Responder, ECP projection, replies
cleaned as the run does, greedy decoding unless ``--temperature``) through
:class:`spasm.backends.embedded.EmbeddedBackend`, one after the other in one process:

* **shared** (the old path): one llama.cpp context for both agents, so each turn shares only
  the chat template's first tokens with the context's last prompt and re-evaluates the rest;
* **per-agent**: ``ChatRequest.stream_key`` names the agent, each agent keeps its own context
  and a turn evaluates only the partner's new message (and its own last reply).

It prints generated tokens/s, prompt tokens evaluated vs served from a context, wall time, the
load average, the ratio per-agent / shared, and how many replies differ between the two paths
(with greedy decoding they should not; llama.cpp may split batches differently, which can move
logits slightly)::

    .venv/bin/python benchmarks/embedded_loop.py                 # 20 utterances, 60 tokens each
    .venv/bin/python benchmarks/embedded_loop.py --utterances 30 --n-ctx 4096
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from typing import Any

from spasm.agents import clean_reply, client_system_prompt, responder_system_prompt
from spasm.backends.base import ChatRequest
from spasm.backends.embedded import EmbeddedBackend, StreamSlots
from spasm.config import BackendConfig
from spasm.history import History, Speaker
from spasm.projection import Viewer, project

CARD = (
    "You are Dana Ortiz, 34, a nurse from Leeds. Your new phone contract doubled in price "
    "after three months and nobody told you. You are tired and a little annoyed, but polite."
)


async def dialogue(backend: EmbeddedBackend, utterances: int, max_tokens: int, temperature: float,
                   keyed: bool) -> dict[str, Any]:
    """Run one ECP dialogue of ``utterances`` turns; returns its replies and usage."""
    role = "customer-service agent"
    viewers: dict[Speaker, Viewer] = {
        "client": Viewer("client", client_system_prompt(CARD, role)),
        "responder": Viewer("responder", responder_system_prompt(role)),
    }
    history = History()
    replies: list[str] = []
    completion_tokens = prompt_tokens = cached = 0
    start = time.perf_counter()
    for k in range(utterances):
        speaker: Speaker = "client" if k % 2 == 0 else "responder"
        request = ChatRequest(
            messages=tuple(project(history, viewers[speaker], "ecp")), temperature=temperature,
            max_tokens=max_tokens, seed=k, stream_key=f"bench:{speaker}" if keyed else None,
        )
        c = await backend.complete(request)
        text = clean_reply(c.text, c.finish_reason == "length") or c.text.strip() or "..."
        history = history.append(speaker, text)
        replies.append(text)
        completion_tokens += c.completion_tokens
        prompt_tokens += c.prompt_tokens
        cached += int(c.extra.get("cached_tokens", 0))
    wall = time.perf_counter() - start
    return {
        "wall_s": round(wall, 2), "completion_tokens": completion_tokens,
        "prompt_tokens": prompt_tokens, "cached_prompt_tokens": cached,
        "tokens_per_s": round(completion_tokens / wall, 1), "replies": replies,
    }


def main() -> None:
    """Run both paths and print the comparison."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--utterances", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=60)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    cfg = BackendConfig(kind="embedded", n_ctx=args.n_ctx, n_threads=args.threads)
    load_before = os.getloadavg()
    results: dict[str, Any] = {}
    for name, keyed in (("shared", False), ("per-agent", True)):
        backend = EmbeddedBackend("embedded", cfg)
        if not keyed:
            backend.slots = StreamSlots(1)  # the old path: every request on one context
        results[name] = asyncio.run(
            dialogue(backend, args.utterances, args.max_tokens, args.temperature, keyed)
        )
    old, new = results["shared"], results["per-agent"]
    differ = [i for i, (a, b) in enumerate(zip(old["replies"], new["replies"], strict=True)) if a != b]
    summary = {
        "utterances": args.utterances, "max_tokens": args.max_tokens, "n_ctx": args.n_ctx,
        "threads": backend.n_threads, "cores": os.cpu_count(),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "ratio_tokens_per_s": round(new["tokens_per_s"] / old["tokens_per_s"], 2),
        "replies_differ": len(differ), "first_differing_reply": differ[0] if differ else None,
    }
    print(f"{'path':<10} {'tokens/s':>9} {'generated':>9} {'prompt':>7} {'cached':>7} {'wall s':>7}")
    for name, r in results.items():
        print(f"{name:<10} {r['tokens_per_s']:>9} {r['completion_tokens']:>9} {r['prompt_tokens']:>7} "
              f"{r['cached_prompt_tokens']:>7} {r['wall_s']:>7}")
    print(json.dumps(summary))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"summary": summary, **results}, f, indent=2)


if __name__ == "__main__":
    main()
