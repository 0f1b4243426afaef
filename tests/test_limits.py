"""Token buckets, on a fake clock (no wall-clock assertions)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from spasm import limits


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
