"""Rate limits (spasm.limits): token buckets, the provider's headers, the adaptive rate and its
test of random 429s, on a fake clock (decisions, counts and states; no wall-clock assertions),
then through the real openai SDK over HTTP to the test server's limits and storms. Speed is
measured in benchmarks/ratelimit.py."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import anyio
import pandas as pd
import pytest

from spasm import limits
from spasm.backends.base import ChatRequest
from spasm.backends.registry import make_backend
from spasm.calls import Caller, CallScope
from spasm.config import BackendConfig
from spasm.engine import Engine
from spasm.run_summary import pacing_note
from spasm.status import run_status
from spasm.testing import FaultPlan, TestServer
from tests.conftest import config_from, endpoint_config


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    c = FakeClock()
    monkeypatch.setattr(limits.time, "monotonic", c.monotonic)
    monkeypatch.setattr(limits.anyio, "sleep", c.sleep)
    return c


def test_rpm_bucket_spaces_requests(clock: FakeClock) -> None:
    bucket = limits.TokenBucket(per_minute=60, capacity=2)

    async def main() -> None:
        for _ in range(5):
            await bucket.acquire(1)

    anyio.run(main)
    # Two from the initial capacity, then one per second at 60/min.
    assert clock.sleeps == pytest.approx([1.0, 1.0, 1.0])
    assert clock.now == pytest.approx(103.0)


def test_tpm_bucket_waits_for_large_requests(clock: FakeClock) -> None:
    bucket = limits.TokenBucket(per_minute=6000)  # 100 tokens per second, capacity 6000

    async def main() -> None:
        await bucket.acquire(6000)
        await bucket.acquire(500)

    anyio.run(main)
    assert sum(clock.sleeps) == pytest.approx(5.0)


def test_requests_bigger_than_capacity_do_not_deadlock(clock: FakeClock) -> None:
    bucket = limits.TokenBucket(per_minute=60, capacity=10)

    async def main() -> Any:
        await bucket.acquire(50)  # clipped to the capacity

    anyio.run(main)
    assert clock.sleeps == []


# --------------------------------------------------------------------------- provider headers


def test_reset_headers_read_as_openai_writes_them() -> None:
    assert limits.parse_duration("12ms") == pytest.approx(0.012)
    assert limits.parse_duration("6m0s") == pytest.approx(360.0)
    assert limits.parse_duration("1h2m3.5s") == pytest.approx(3723.5)
    assert limits.parse_duration("20") == 20.0 and limits.parse_duration("0.5") == 0.5
    for bad in ("soon", "-1", "1x", "", "nan"):
        assert limits.parse_duration(bad) is None, bad
    rh = limits.RateHeaders.parse({
        "retry-after": "2", "retry-after-ms": "1500", "x-ratelimit-limit-requests": "60",
        "x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1s",
        "x-ratelimit-remaining-tokens": "many"})
    assert rh.retry_after == 1.5  # retry-after-ms is the finer of the two
    assert (rh.limit_requests, rh.remaining_requests, rh.reset_requests) == (60, 0, 1.0)
    assert rh.remaining_tokens is None  # malformed: as if not sent
    assert rh.describes_limits and rh.key_spent
    assert not limits.RateHeaders.parse({"retry-after": "3"}).describes_limits
    room = limits.RateHeaders.parse({"x-ratelimit-remaining-requests": "7"})
    assert room.describes_limits and not room.key_spent


def _admit(bl: limits.BackendLimits, n: int = 1, prompt: int = 0,
           max_tokens: int = 0) -> list[limits.Ticket]:
    async def go() -> list[limits.Ticket]:
        return [await bl.admit(prompt, max_tokens) for _ in range(n)]

    return anyio.run(go)


def test_the_provider_headers_pace_starts_before_any_429(clock: FakeClock) -> None:
    bl = limits.BackendLimits(64, None, None)
    first, second = _admit(bl, 2)
    assert clock.sleeps == []  # nothing known yet: no pacing
    # The key allows 10 requests, 2 are left and it is full again in 0.8 s: 10 per second. The
    # second request is still in flight, so the mirror counts one left.
    bl.answered(first, {"x-ratelimit-limit-requests": "10", "x-ratelimit-remaining-requests": "2",
                        "x-ratelimit-reset-requests": "800ms"})
    mirror = bl.provider.requests
    assert mirror is not None and mirror.rate == pytest.approx(10 * mirror.MARGIN)
    assert mirror.level == 1
    _admit(bl, 3)  # one at once, then one per refill
    assert clock.sleeps == pytest.approx([1 / mirror.rate] * 2)
    assert bl.refusals == 0 and bl.adaptive.rate is None  # no 429 was needed
    assert bl.report()["source"] == "headers" and bl.report()["paced"]
    assert pacing_note({"srv": bl.report()}) == (
        "srv paced at 10.0 req/s (by its x-ratelimit headers)")  # the provider's rate
    del second


def test_token_headers_pace_by_the_estimate_calibrated_on_reported_usage(clock: FakeClock) -> None:
    bl = limits.BackendLimits(64, None, None)
    assert not bl.wants_tokens
    (t,) = _admit(bl, 1, prompt=100)
    # The provider counted 150 prompt tokens where we counted 100, and has 200 tokens left of
    # 1000, full again in 4 s (200 tokens per second).
    bl.answered(t, {"x-ratelimit-limit-tokens": "1000", "x-ratelimit-remaining-tokens": "200",
                    "x-ratelimit-reset-tokens": "4s"}, counted_prompt=100, reported_prompt=150)
    assert bl.wants_tokens and bl.estimate(100, 50) == pytest.approx(105 + 50)
    _admit(bl, 2, prompt=100, max_tokens=50)  # 155 each: the first fits in the 200 left, the second waits
    rate = 200 * limits._Mirror.MARGIN
    assert clock.sleeps == pytest.approx([(155 - 45) / rate])


def _reading(level: float, capacity: float, rate: float) -> tuple[float, float]:
    """What a provider's headers say of a bucket at ``level``: ``remaining`` rounded down to a
    whole unit, ``reset`` from the exact level and written in whole milliseconds."""
    return math.floor(level), round((capacity - level) / rate * 1000) / 1000


def test_the_header_rate_is_the_lowest_bound_of_the_window_not_the_last_reading() -> None:
    # A bucket of 20 refilled at 100 a second, read nearly full (one caller at a time): one
    # reading overstates the rate by up to one unit over a deficit of less than one.
    mirror = limits._Mirror()
    rng = random.Random(7)
    levels = [19 + rng.random() for _ in range(40)]
    overstated = []
    for i, level in enumerate(levels):
        remaining, reset = _reading(level, 20, 100)
        if reset > 0:  # "0ms" says nothing of the rate
            overstated.append((20 - remaining) / reset)
        mirror.sync(remaining, 20, reset, 0.0, now=i * 0.01)
    assert max(overstated) > 150  # what the last-reading estimate would have taken
    assert mirror.rate is not None
    assert 0.9 * 100 * mirror.MARGIN <= mirror.rate <= 1.05 * 100 * mirror.MARGIN
    # The provider doubles the rate: after a window without a lower reading, it is followed.
    for i, level in enumerate(levels):
        remaining, reset = _reading(level, 20, 200)
        mirror.sync(remaining, 20, reset, 0.0, now=1.0 + mirror.WINDOW_S + i * 0.01)
    assert 0.9 * 200 * mirror.MARGIN <= mirror.rate <= 1.05 * 200 * mirror.MARGIN
    # A new limit starts again at once.
    mirror.sync(10, 40, 0.05, 0.0, now=20.0)
    assert mirror.rate == pytest.approx(mirror.MARGIN * 30 / 0.05)


def test_a_429_that_says_the_key_is_spent_holds_everyone_others_delay_only_their_request(
    clock: FakeClock,
) -> None:
    bl = limits.BackendLimits(64, None, None)
    a, b = _admit(bl, 2)
    bl.refused(a, {"x-ratelimit-remaining-requests": "5", "retry-after": "3"}, retry_after=3.0)
    assert bl.holds == 0 and bl._hold == 0.0  # the key has room: only that request waits
    assert bl.adaptive.decreases == 0  # and a 429 the headers explain never lowers the rate
    bl.refused(b, {"x-ratelimit-remaining-requests": "0", "retry-after-ms": "2500"})
    assert bl.holds == 1
    clock.sleeps.clear()
    _admit(bl, 1)
    assert sum(clock.sleeps) == pytest.approx(2.5)
    assert bl.refusals == 2 and bl.report()["rate_limited"] == 2


# --------------------------------------------------------------------------- AIMD and the test


def _feed(rate: limits.AdaptiveRate, clock: FakeClock, outcomes: list[bool],
          step: float = 0.01) -> None:
    """Answers to requests that start and end now, one every ``step`` seconds."""
    for refused in outcomes:
        clock.now += step
        rate.started(clock.now)
        rate.answered(clock.now, refused, clock.now)


def test_429s_about_the_rate_lower_it_once_per_episode_and_it_climbs_back(clock: FakeClock) -> None:
    r = limits.AdaptiveRate(floor=0.2, ceiling=None)
    _feed(r, clock, [False] * 100, step=0.01)  # 100 starts a second, unpaced
    assert r.rate is None and r.state == "clean"
    # Sixteen 429s to requests sent before the decrease: one decrease, not sixteen.
    sent = clock.now
    for _ in range(16):
        r.answered(sent, True, clock.now)
    assert r.decreases == 1 and r.state == "testing"
    lowered = r.rate
    assert lowered is not None and 20 < lowered < 100
    # After the decrease no request is refused: the 429s were about the rate.
    _feed(r, clock, [False] * r.MIN_SAMPLE)
    assert r.state == "limited" and r.decreases == 1
    # A refusal from a request sent before the decrease does not count again ...
    r.answered(sent, True, clock.now)
    assert r.decreases == 1
    # ... one sent after it starts the next episode: a tenth off (the share is small now).
    before = r.current(clock.now)
    _feed(r, clock, [True])
    assert r.decreases == 2 and r.rate == pytest.approx(before * r.BETA * (1 - r._share(r.RECENT)), rel=0.01)
    _feed(r, clock, [False] * r.SAMPLE)
    assert r.state == "limited"
    # It climbs back: after CLIMB_S to the rate refused, then faster; pacing ends at UNPACE ×.
    base = r._base
    assert r.current(r.decreased_at + r.CLIMB_S) == pytest.approx(base / r.BETA)
    assert r.current(r.decreased_at + 2 * r.CLIMB_S) > base / r.BETA
    assert r.current(r.decreased_at + 10 * r.CLIMB_S) is None and r.state == "clean"


def test_the_rate_never_goes_below_the_floor_or_above_the_configured_rpm(clock: FakeClock) -> None:
    r = limits.AdaptiveRate(floor=0.5, ceiling=2.0)
    _feed(r, clock, [False] * 50, step=0.01)
    _feed(r, clock, [True])  # 100 starts a second, ceiling 2: straight down to the ceiling
    assert r.rate == 2.0
    for _ in range(20):  # nearly all refused again and again, a trickle passing
        _feed(r, clock, ([True] * 15 + [False]) * 2)
    assert r.rate == pytest.approx(0.5) and r.decreases > 2 and r.state != "overloaded"


def test_random_429s_are_told_from_rate_limits_by_their_effect(clock: FakeClock) -> None:
    r = limits.AdaptiveRate(floor=0.2, ceiling=None)
    storm = ([False] * 4 + [True]) * 40  # a fifth of all answers, whatever the rate
    _feed(r, clock, storm[:5])
    assert r.decreases == 1 and r.state == "testing" and r.rate is not None
    _feed(r, clock, storm[5:35])
    # Lowering the rate did not lower the share: once, so it is lowered and tested again ...
    assert r.decreases == 2 and r.state == "testing" and r.restored == 0
    _feed(r, clock, storm[35:80])
    # ... twice: both undone, and no more decreases.
    assert r.state == "overloaded" and r.rate is None and r.restored == 1
    assert r.background == pytest.approx(0.2, abs=0.1)
    _feed(r, clock, storm * 5)
    assert r.decreases == 2 and r.rate is None
    # The share rising well above the provider's own starts a new test.
    _feed(r, clock, [True, True, False] * 40)
    assert r.decreases == 3
    # Quiet for QUIET_S: clean again.
    _feed(r, clock, [False] * r.SAMPLE)
    clock.now += r.QUIET_S + 1
    _feed(r, clock, [False])
    assert r.state in ("clean", "limited")


def test_a_burst_that_refuses_everything_is_not_taken_for_a_rate(clock: FakeClock) -> None:
    r = limits.AdaptiveRate(floor=0.2, ceiling=None)
    _feed(r, clock, [False] * 100)
    # Every request refused. The first decrease is kept (one 429 in a hundred answers is too
    # few to tell), the next two change nothing: all are undone, and no more are made.
    _feed(r, clock, [True] * 100)
    assert r.state == "overloaded" and r.rate is None and r.decreases == 3 and r.restored == 1
    _feed(r, clock, [True] * 500)
    assert r.decreases == 3
    _feed(r, clock, [False] * 100)  # when it ends there is no pacing to climb out of
    assert r.rate is None


def test_far_above_a_limit_it_keeps_lowering_while_a_trickle_passes(clock: FakeClock) -> None:
    r = limits.AdaptiveRate(floor=0.2, ceiling=None)
    _feed(r, clock, [False] * 40, step=0.001)  # 1000 starts a second
    rates = []
    for _ in range(5):  # 19 of 20 refused: a limit far below, not an outage
        _feed(r, clock, ([True] * 19 + [False]) * 2, step=0.001)
        rates.append(r.rate)
    assert r.state != "overloaded" and r.decreases >= 4
    assert None not in rates and rates == sorted(rates, reverse=True)  # type: ignore[type-var]
    assert rates[-1] < rates[0] / 10


# --------------------------------------------------------------------------- over HTTP


def _load(plan: FaultPlan, calls: int, concurrency: int, sleep_scale: float
          ) -> tuple[Caller, dict[str, int], list[Any]]:
    """``calls`` calls through the Caller, ``concurrency`` at once, to a test server with ``plan``:
    the caller, the server's stats and the call-log rows."""
    async def go() -> tuple[Caller, dict[str, int], list[Any]]:
        with TestServer(plan) as srv:
            cfg = BackendConfig(kind="openai", base_url=srv.base_url, model="m",
                                max_concurrency=concurrency)
            backend = make_backend("srv", cfg)
            caller = Caller({"srv": backend}, {"srv": cfg}, sleep_scale=sleep_scale)
            scopes = [CallScope(dialogue_id=f"d{i}") for i in range(calls)]
            limiter = anyio.CapacityLimiter(concurrency)

            async def one(i: int) -> None:
                async with limiter:
                    req = ChatRequest(messages=({"role": "user", "content": f"hello {i}"},),
                                      temperature=0.0, max_tokens=8)
                    await caller.complete("client", "srv", req, scopes[i])

            try:
                async with anyio.create_task_group() as tg:
                    for i in range(calls):
                        tg.start_soon(one, i)
            finally:
                await backend.aclose()
            return caller, srv.stats, [r for s in scopes for r in s.records]

    return anyio.run(go)


def test_the_x_ratelimit_headers_over_http_pace_a_request_limit_without_a_429() -> None:
    # 100 requests a second, a burst of 20: one call at a time, as fast as the server answers.
    caller, stats, rows = _load(FaultPlan(limit_rps=100, limit_burst_s=0.2), calls=60,
                                concurrency=1, sleep_scale=1.0)
    bl = caller.limits["srv"]
    assert stats["ok"] == 60 and stats.get("limited", 0) == 0 and bl.refusals == 0
    assert {r.outcome for r in rows} == {"ok"}
    mirror = bl.provider.requests
    assert mirror is not None and mirror.limit == 20
    assert mirror.rate == pytest.approx(100 * mirror.MARGIN, rel=0.1)  # read from the headers
    # (Whether a start had to wait depends on how fast this machine sends: the pacing itself is
    # test_the_provider_headers_pace_starts_before_any_429.)
    assert caller.rate_limit_report()["srv"]["provider_headers"]
    assert bl.adaptive.decreases == 0


def test_a_429_with_the_key_spent_holds_all_one_with_room_left_does_not() -> None:
    # Eight at once against a burst of two refilled at five a second: 429s whose headers say
    # nothing is left.
    caller, stats, rows = _load(FaultPlan(limit_rps=5, limit_burst_s=0.4), calls=8,
                                concurrency=8, sleep_scale=1.0)
    bl = caller.limits["srv"]
    assert stats["ok"] == 8 and stats["limited"] == bl.refusals >= 1
    assert bl.holds >= 1 and bl.adaptive.decreases == 0  # the headers explain the 429s
    assert sum(r.outcome == "rate_limited" for r in rows) == bl.refusals
    # Random 429s while the key has plenty of room: no hold, no decrease, every call answered.
    caller, stats, rows = _load(FaultPlan(limit_rps=10_000, rate_429=0.5, seed=2), calls=40,
                                concurrency=1, sleep_scale=0.0)
    bl = caller.limits["srv"]
    assert stats["ok"] == 40 and bl.refusals == stats["429"] > 5
    assert bl.holds == 0 and bl.adaptive.decreases == 0 and bl.adaptive.rate is None


def test_a_random_429_storm_through_the_engine_is_told_from_a_limit_and_reported(
    tmp_path: Path,
) -> None:
    plan = FaultPlan(rate_429=0.4, retry_after_s=None, rate_500=0.02, seed=11)
    run = tmp_path / "run"
    with TestServer(plan) as srv:
        data = endpoint_config(srv.base_url, personas={"n": 6}, conditions=["ecp", "concat"],
                               backends={"srv": {"kind": "openai", "base_url": srv.base_url,
                                                 "model": "m", "max_concurrency": 1}})
        summary = anyio.run(Engine(config_from(data), run, progress=False, sleep_scale=0.0).run)
        stats = srv.stats
    assert summary.errors == 0 and summary.completed == summary.planned == 12, summary.line()
    report = summary.rate_limits["srv"]
    # Lowering the rate did not lower the share of 429s: the decrease was undone and the
    # backend is not paced; its 429s were retried after their own waits.
    assert report["decreases_undone"] >= 1 and report["state"] == "overloaded"
    assert not report["paced"] and report["rate_rps"] is None
    calls = pd.read_parquet(run / "calls.parquet")
    assert report["rate_limited"] == (calls.outcome == "rate_limited").sum() == stats["429"] > 20
    assert f"429s: srv {stats['429']:,} (random: not about the rate)" in summary.line()
    lines = "\n".join(run_status(run).lines())
    assert f"rate limits:  srv: not paced at the end; {stats['429']:,} 429s" in lines
    assert "random 429s: not about the rate" in lines
