"""Calls lost to a fault storm: rate limits waited out vs rate limits spending attempts.

N calls through :class:`spasm.calls.Caller` (C in flight, default ``max_attempts`` 6) to the
loopback test server answering 20% 429s (no ``Retry-After``), 5% 500s and 5% malformed bodies,
with sleeps scaled to 0 (the counts, not the waits, are measured). Two runs:

* ``budget 0``: every 429 spends an attempt (no rate-limit budget);
* ``budget 300`` (the default): 429s are waited out and only the other errors spend attempts.

For each it prints the calls that failed all their attempts (each a quarantined dialogue in a
run), the attempts logged and the server's counts::

    .venv/bin/python benchmarks/rate_limit_storm.py              # N=20000, ~2 min on 2 cores
    .venv/bin/python benchmarks/rate_limit_storm.py --calls 2000
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import anyio

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from spasm.backends.base import ChatRequest  # noqa: E402
from spasm.backends.registry import make_backend  # noqa: E402
from spasm.calls import RATE_LIMIT_BUDGET_S, Caller, CallScope  # noqa: E402
from spasm.config import BackendConfig  # noqa: E402
from spasm.testing import FaultPlan, TestServer  # noqa: E402


async def storm(calls: int, concurrency: int, budget: float, seed: int) -> dict[str, float]:
    plan = FaultPlan(rate_429=0.2, retry_after_s=None, rate_500=0.05, rate_malformed=0.05, seed=seed)
    with TestServer(plan) as srv:
        cfg = BackendConfig(kind="openai", base_url=srv.base_url, model="m",
                            max_concurrency=concurrency)
        backend = make_backend("srv", cfg)
        caller = Caller({"srv": backend}, {"srv": cfg}, sleep_scale=0.0, rate_limit_budget_s=budget)
        failed = attempts = 0
        limiter = anyio.CapacityLimiter(2 * concurrency)

        async def one(i: int) -> None:
            nonlocal failed, attempts
            scope = CallScope(dialogue_id=f"d{i}")
            request = ChatRequest(messages=({"role": "user", "content": f"hello {i}"},),
                                  temperature=0.0, max_tokens=8)
            async with limiter:
                try:
                    await caller.complete("client", "srv", request, scope)
                except Exception:  # a call that failed all its attempts
                    failed += 1
            attempts += len(scope.records)

        start = time.perf_counter()
        try:
            async with anyio.create_task_group() as tg:
                for i in range(calls):
                    tg.start_soon(one, i)
        finally:
            await backend.aclose()
        stats = srv.stats
    return {"failed": failed, "attempts": attempts, "429": stats["429"], "500": stats["500"],
            "malformed": stats["malformed"], "wall_s": time.perf_counter() - start}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=20_000)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    print(f"{args.calls} calls, C={args.concurrency}, 20% 429 / 5% 500 / 5% malformed, "
          "max_attempts 6")
    print(f"{'429 budget per call':>22} {'failed':>7} {'attempts':>9} {'429s':>6} {'500s':>6} "
          f"{'malformed':>9} {'wall s':>7}")
    for budget in (0.0, RATE_LIMIT_BUDGET_S):
        r = anyio.run(storm, args.calls, args.concurrency, budget, args.seed)
        print(f"{budget:>20.0f} s {r['failed']:>7.0f} {r['attempts']:>9.0f} {r['429']:>6.0f} "
              f"{r['500']:>6.0f} {r['malformed']:>9.0f} {r['wall_s']:>7.1f}")


if __name__ == "__main__":
    main()
