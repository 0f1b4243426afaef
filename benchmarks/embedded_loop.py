"""The two-agent ECP loop on the embedded model: per-agent KV contexts against one shared one,
and against plain generation, in one process.

Every path runs the same dialogue (a Client persona and a Responder, ECP projection, replies
cleaned as the run does, greedy decoding unless ``--temperature``) through
:class:`spasm.backends.embedded.EmbeddedBackend`:

* **shared** (the old path): one llama.cpp context for both agents and nothing saved, so each
  turn shares only the chat template's first tokens with the context's last prompt and
  re-evaluates the rest;
* **saved** (``--paths`` adds it): one context, each agent's KV cache saved while the other
  runs and restored for its next turn (what a harness role gets when streams outnumber contexts);
* **per-agent** (the previous path): ``ChatRequest.stream_key`` names the agent, each agent
  keeps its own context and a turn evaluates only the partner's new message and the template
  tokens; one loop on all cores;
* **lanes** (the current default): the backend as configured by default, with
  :func:`~spasm.backends.embedded.lane_plan` lanes of its share of the cores (2 × 1 thread on 2
  cores), running one dialogue per lane at once, as the engine does. The dialogues are the same
  one (same prompts and seeds), so their replies must agree with each other and with per-agent.

Then **plain generation**, the reference bound of one loop: the Client's first prompt evaluated
once and ``--plain-tokens`` tokens decoded one by one on all cores (no loop, no second agent).
One loop cannot reach it: every token one agent generates, the other must evaluate as prompt.

For each path it prints generated tokens/s, prompt tokens evaluated vs served from a context,
where the time went (llama.cpp decoding prompt batches, decoding generated tokens one at a time,
everything else: template, tokenizing, sampling, saving states, Python; seconds summed over the
lanes), and the load average. With greedy
decoding it then **replays** every per-agent turn from scratch (the whole prompt in one batch,
as full re-processing does) and counts the turns whose reply differs; at the first differing
token it prints the gap between the two tokens' logits (llama.cpp's batch sizes change the
floating-point sums, which can flip a near-tie)::

    .venv/bin/python benchmarks/embedded_loop.py                 # 20 utterances, 60 tokens each
    .venv/bin/python benchmarks/embedded_loop.py --utterances 30 --n-ctx 8192 --paths saved,per-agent,lanes

``--roles`` instead runs a short level-E dialogue (both agents wrapped, ``--utterances``
utterances) through :class:`spasm.engine.Engine` twice, with saved states and without, and
prints the prompt tokens served from a context per harness role, from the run's ``calls``
table: each role's stream (its system prompt) keeps its context or its saved state::

    .venv/bin/python benchmarks/embedded_loop.py --roles --utterances 8 --n-ctx 8192
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import anyio
import numpy as np

from spasm.agents import clean_reply, client_system_prompt, responder_system_prompt
from spasm.backends.base import ChatRequest
from spasm.backends.embedded import (
    EmbeddedBackend,
    SavedStates,
    StreamSlots,
    default_threads,
    stream_of,
)
from spasm.config import BackendConfig
from spasm.history import History, Speaker
from spasm.projection import Viewer, project

CARD = (
    "You are Dana Ortiz, 34, a nurse from Leeds. Your new phone contract doubled in price "
    "after three months and nobody told you. You are tired and a little annoyed, but polite."
)
ROLE = "customer-service agent"
VIEWERS: dict[Speaker, Viewer] = {
    "client": Viewer("client", client_system_prompt(CARD, ROLE)),
    "responder": Viewer("responder", responder_system_prompt(ROLE)),
}
PATHS = ("shared", "saved", "per-agent", "lanes")
#: The sampling settings of EmbeddedBackend._generate that the replay must repeat.
REPEAT_PENALTY = 1.1
PENALTY_LAST_N = 64  # llama-cpp-python's last_n_tokens_size


class DecodeClock:
    """Times llama.cpp's decode calls of some contexts: prompt batches vs single tokens."""

    def __init__(self) -> None:
        self.prompt_s = self.gen_s = 0.0

    def watch(self, llm: Any) -> None:
        """Charge ``llm``'s decode calls to this clock (contexts are shared between backends)."""
        ctx = llm._ctx
        if not hasattr(ctx, "_clock"):
            inner = ctx.decode

            def decode(batch: Any) -> Any:
                start = time.perf_counter()
                try:
                    return inner(batch)
                finally:
                    clock, dt = ctx._clock, time.perf_counter() - start
                    if batch.n_tokens() > 1:
                        clock.prompt_s += dt
                    else:
                        clock.gen_s += dt

            ctx.decode = decode
        ctx._clock = self


async def dialogue(backend: EmbeddedBackend, args: argparse.Namespace, keyed: bool,
                   name: str = "bench") -> dict[str, Any]:
    """Run one ECP dialogue of ``args.utterances`` turns; returns its replies and usage."""
    history = History()
    replies: list[str] = []
    turns: list[dict[str, Any]] = []
    completion_tokens = prompt_tokens = cached = 0
    for k in range(args.utterances):
        speaker: Speaker = "client" if k % 2 == 0 else "responder"
        request = ChatRequest(
            messages=tuple(project(history, VIEWERS[speaker], "ecp")), temperature=args.temperature,
            max_tokens=args.max_tokens, seed=k, stream_key=f"{name}:{speaker}" if keyed else None,
        )
        c = await backend.complete(request)
        if backend.max_concurrency == 1:  # the context it used holds the turn's tokens
            llm = backend._llm(backend.slots.slot(stream_of(request)))
            ids = [int(t) for t in llm.input_ids[: llm.n_tokens]]
            turns.append({"prompt": ids[: c.prompt_tokens], "reply": ids[c.prompt_tokens:]})
        text = clean_reply(c.text, c.finish_reason == "length") or c.text.strip() or "..."
        history = history.append(speaker, text)
        replies.append(text)
        completion_tokens += c.completion_tokens
        prompt_tokens += c.prompt_tokens
        cached += c.cached_tokens
    return {"completion_tokens": completion_tokens, "prompt_tokens": prompt_tokens,
            "cached_prompt_tokens": cached, "replies": replies, "turns": turns}


async def run_path(backend: EmbeddedBackend, args: argparse.Namespace, keyed: bool,
                   dialogues: int) -> dict[str, Any]:
    """``dialogues`` dialogues at once on ``backend`` (one per lane); their sums and timing."""
    clock = DecodeClock()
    for i in range(backend.slots.size):
        clock.watch(backend._llm(i))  # loaded before the clock starts, like a warm run
    load = os.getloadavg()[0]
    results: list[dict[str, Any]] = [{} for _ in range(dialogues)]

    async def one(i: int) -> None:
        results[i] = await dialogue(backend, args, keyed, name=f"bench{i}")

    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for i in range(dialogues):
            tg.start_soon(one, i)
    wall = time.perf_counter() - start
    total = {k: sum(r[k] for r in results)
             for k in ("completion_tokens", "prompt_tokens", "cached_prompt_tokens")}
    return {
        **total, "wall_s": round(wall, 2), "dialogues": dialogues, "lanes": backend.max_concurrency,
        "threads_per_lane": backend.n_threads,
        "evaluated_prompt_tokens": total["prompt_tokens"] - total["cached_prompt_tokens"],
        "tokens_per_s": round(total["completion_tokens"] / wall, 1),
        "decode_prompt_s": round(clock.prompt_s, 2), "decode_generated_s": round(clock.gen_s, 2),
        # Decode seconds add up over the lanes: the rest of the lanes' time is everything else.
        "other_s": round(wall * dialogues - clock.prompt_s - clock.gen_s, 2),
        "restored": backend.stats["restored"],
        "loadavg_1min": [round(load, 2), round(os.getloadavg()[0], 2)],
        "replies": results[0]["replies"], "turns": results[0]["turns"],
        "replies_agree": all(r["replies"] == results[0]["replies"] for r in results),
    }


def plain_generation(llm: Any, prompt: list[int], n: int) -> dict[str, Any]:
    """Evaluate ``prompt`` once, then decode ``n`` greedy tokens one at a time (EOS ignored)."""
    llm.reset()
    llm._ctx.kv_cache_clear()
    llm.eval(prompt)
    sampler = llm._init_sampler(temp=0.0, repeat_penalty=REPEAT_PENALTY)
    start = time.perf_counter()
    for _ in range(n):
        llm.eval([sampler.sample(llm._ctx, -1)])
    wall = time.perf_counter() - start
    return {"tokens": n, "prompt_tokens": len(prompt), "wall_s": round(wall, 2),
            "tokens_per_s": round(n / wall, 1)}


def penalised(logit: float, token: int, recent: list[int]) -> float:
    """A logit as llama.cpp's repeat penalty leaves it (tokens among the last 64 generated)."""
    if token not in recent[-PENALTY_LAST_N:]:
        return logit
    return logit * REPEAT_PENALTY if logit <= 0 else logit / REPEAT_PENALTY


def replay(llm: Any, turn: dict[str, Any]) -> dict[str, Any] | None:
    """Re-generate one turn with the whole prompt in one batch (greedy); ``None`` if the reply
    is the same, else where it first differs and, there, by how much the replayed logits
    (after the repeat penalty, which greedy decoding ranks) prefer their token to the cached
    path's: a small margin is a near-tie that floating-point differences flipped."""
    llm.reset()
    llm._ctx.kv_cache_clear()
    sampler = llm._init_sampler(temp=0.0, repeat_penalty=REPEAT_PENALTY)
    llm.eval(turn["prompt"])
    n_vocab = llm.n_vocab()
    for j, cached_token in enumerate(turn["reply"]):
        logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,)).copy()
        token = sampler.sample(llm._ctx, -1)
        if token != cached_token:
            recent = turn["reply"][:j]
            ours = penalised(float(logits[token]), token, recent)
            theirs = penalised(float(logits[cached_token]), cached_token, recent)
            top = float(np.max(np.abs(logits)))
            return {"token": j, "of": len(turn["reply"]), "margin": round(ours - theirs, 4),
                    "relative_margin": round((ours - theirs) / top, 5)}
        llm.eval([token])
    return None


def run_paths(args: argparse.Namespace) -> dict[str, Any]:
    """Run each requested path; returns its figures by name."""
    results: dict[str, Any] = {}
    all_cores = args.threads or default_threads()
    for name in args.paths.split(","):
        if name not in PATHS:
            raise SystemExit(f"unknown path {name!r}: use {','.join(PATHS)}")
        # One loop uses every core; the lanes path splits them as the backend does by default.
        threads = args.threads if name == "lanes" else all_cores
        backend = EmbeddedBackend("embedded", BackendConfig(kind="embedded", n_ctx=args.n_ctx,
                                                            n_threads=threads))
        if name in ("shared", "saved"):
            backend.slots = StreamSlots(1)  # every request on one context
        if name == "shared":
            backend.states = SavedStates(0)  # and nothing saved: the old path
        dialogues = backend.max_concurrency if name == "lanes" else 1
        results[name] = anyio.run(run_path, backend, args, name != "shared", dialogues)
    return results


def roles(args: argparse.Namespace) -> None:
    """Cache hits per role on a short level-E embedded run, with and without saved states."""
    import tempfile
    from pathlib import Path

    import anyio

    from spasm import open_run, parse_config
    from spasm.engine import Engine

    raw = {
        "name": "roles", "seed": 3, "personas": {"n": 1},
        "backends": {"embedded": {"kind": "embedded", "n_ctx": args.n_ctx,
                                  "n_threads": args.threads}},
        "pairings": [{"client": "embedded", "responder": "embedded"}],
        "dialogue": {"max_turns_per_agent": max(1, args.utterances // 2),
                     "max_tokens": args.max_tokens},
        "termination": {"rules": False},
        "harness": {"levels": ["E"], "extract_policy": False, "reducer_max_tokens": 96,
                    "checker_max_tokens": 96},
    }
    config = parse_config(raw)
    for saved in (True, False):
        backend = EmbeddedBackend("embedded", config.backends["embedded"])
        if not saved:
            backend.states = SavedStates(0)
        out = Path(tempfile.mkdtemp(prefix="roles-")) / "run"
        start = time.perf_counter()
        engine = Engine(config, out, progress=False, backends={"embedded": backend})
        summary = anyio.run(engine.run)
        calls = open_run(out).table("calls").to_pandas()
        by_role = calls.groupby("role")[["prompt_tokens", "cached_tokens"]].sum()
        by_role["calls"] = calls.groupby("role").size()
        by_role["served"] = (by_role.cached_tokens / by_role.prompt_tokens).round(3)
        print(f"saved states {'on' if saved else 'off'}: {backend.slots.size} contexts, "
              f"{backend.stats['restored']} restores, {summary.line()}, "
              f"{time.perf_counter() - start:.1f} s wall, load {os.getloadavg()[0]:.2f}")
        print(by_role.to_string())


def main() -> None:
    """Run the paths, the plain-generation bound and the replay; print the comparison."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--utterances", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=60)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--paths", default="shared,per-agent,lanes", help=",".join(PATHS))
    ap.add_argument("--plain-tokens", type=int, default=200)
    ap.add_argument("--no-replay", action="store_true")
    ap.add_argument("--roles", action="store_true", help="cache hits per harness role (level E)")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    if args.roles:
        roles(args)
        return
    load_before = os.getloadavg()
    results = run_paths(args)
    single = next(r for r in results.values() if r["turns"])
    reference = EmbeddedBackend("embedded", BackendConfig(
        kind="embedded", n_ctx=args.n_ctx, n_threads=args.threads or default_threads()))
    llm = reference._llm(reference.slots.size)  # a context of its own
    plain = plain_generation(llm, single["turns"][0]["prompt"], args.plain_tokens)
    summary: dict[str, Any] = {
        "utterances": args.utterances, "max_tokens": args.max_tokens, "n_ctx": args.n_ctx,
        "cores": os.cpu_count(), "loadavg_before": [round(x, 2) for x in load_before],
        "plain_generation_tokens_per_s": plain["tokens_per_s"],
    }
    for name, r in results.items():
        summary[f"{name}_vs_plain"] = round(r["tokens_per_s"] / plain["tokens_per_s"], 2)
    for new, old in (("per-agent", "shared"), ("lanes", "per-agent"), ("lanes", "shared")):
        if new in results and old in results:
            a, b = results[new], results[old]
            summary[f"ratio_{new}_vs_{old}"] = round(a["tokens_per_s"] / b["tokens_per_s"], 2)
            summary[f"replies_differ_{new}_vs_{old}"] = sum(
                x != y for x, y in zip(a["replies"], b["replies"], strict=True))
    if "lanes" in results:
        summary["lanes_dialogues_agree"] = results["lanes"]["replies_agree"]
    if args.temperature == 0.0 and not args.no_replay:
        current = results.get("per-agent", single)
        diffs = [d for d in (replay(llm, t) for t in current["turns"]) if d is not None]
        summary["replay_turns_differ"] = f"{len(diffs)}/{len(current['turns'])}"
        summary["replay_differences"] = diffs
    summary["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    print(f"{'path':<10} {'lanes':>7} {'tokens/s':>8} {'generated':>9} {'prompt':>7} {'cached':>7} "
          f"{'evaluated':>9} {'wall s':>7} {'prompt-decode s':>15} {'gen-decode s':>12} {'other s':>7} "
          f"{'load 1m':>11}")
    for name, r in results.items():
        lanes = f"{r['lanes']}x{r['threads_per_lane']}t"
        print(f"{name:<10} {lanes:>7} {r['tokens_per_s']:>8} {r['completion_tokens']:>9} "
              f"{r['prompt_tokens']:>7} {r['cached_prompt_tokens']:>7} {r['evaluated_prompt_tokens']:>9} "
              f"{r['wall_s']:>7} {r['decode_prompt_s']:>15} {r['decode_generated_s']:>12} "
              f"{r['other_s']:>7} {'→'.join(map(str, r['loadavg_1min'])):>11}")
    print(f"{'plain':<10} {'1x' + str(reference.n_threads) + 't':>7} {plain['tokens_per_s']:>8} "
          f"{plain['tokens']:>9} {plain['prompt_tokens']:>7} {'':>7} {'':>9} {plain['wall_s']:>7}"
          f"   (one prompt, {plain['tokens']} tokens decoded one at a time)")
    print(json.dumps(summary))
    if args.json:
        for r in results.values():
            r.pop("turns")
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"summary": summary, "plain": plain, **results}, f, indent=2)


if __name__ == "__main__":
    main()
