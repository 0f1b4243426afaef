"""Per-backend rate limits: in-flight slots, RPM/TPM token buckets, and pacing to what the
provider accepts (anyio).

Besides a backend's configured ``max_concurrency``, ``rpm`` and ``tpm``, three things pace the
starts of its requests, each learned from the provider's answers:

* **The provider's headers** (:class:`ProviderBuckets`): ``x-ratelimit-limit-*``,
  ``x-ratelimit-remaining-*`` and ``x-ratelimit-reset-*`` (requests and tokens) describe the
  key's buckets; a mirror of each is kept in step with every answer that carries them, and a
  request starts when the mirror has room for it, so a provider that says what is left is
  paced *before* it refuses anything.
* **An adaptive rate** (:class:`AdaptiveRate`, AIMD) for 429s that carry no such headers: a
  429 lowers the rate of starts multiplicatively, once per congestion episode, then the rate
  climbs back (additively, then in doubling steps) and pacing ends once it is well above the
  rate that was refused. Each decrease is tested by its effect: when lowering the rate does not
  lower the share of 429s, they are not about the rate (an overloaded provider answers a share
  of all requests with 429s whatever the rate), so the decrease is undone and no more are made;
  those 429s are simply retried after the server's delay.
* **A hold for all** after a 429 whose headers say the whole key is spent (a remaining count
  of 0): no request of the backend starts before its ``Retry-After`` has passed. Any other
  ``Retry-After`` delays only the request that got it (:mod:`spasm.calls` sleeps it).

Everything here is decided on ``time.monotonic()``; :mod:`spasm.calls` calls :meth:`BackendLimits.admit`
before each request and :meth:`BackendLimits.answered` / :meth:`BackendLimits.refused` /
:meth:`BackendLimits.release` after it.
"""

from __future__ import annotations

import collections
import itertools
import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any, Literal

import anyio

__all__ = [
    "RATE_HEADERS",
    "AdaptiveRate",
    "BackendLimits",
    "ProviderBuckets",
    "RateHeaders",
    "Ticket",
    "TokenBucket",
    "parse_duration",
]

#: The response headers spasm reads to pace a backend (lower case); backends pass these on.
RATE_HEADERS: tuple[str, ...] = (
    "retry-after",
    "retry-after-ms",
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
)

#: Waits shorter than this are none: a refill computed back can fall short by a rounding error.
_EPSILON_S = 1e-6

_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(value: str | None) -> float | None:
    """Seconds in a reset header: a plain number of seconds (``"20"``, ``"0.5"``) or a Go
    duration as OpenAI sends them (``"12ms"``, ``"6m0s"``, ``"1h2m3.5s"``); ``None`` when it is
    neither (or negative)."""
    if value is None:
        return None
    text = value.strip().lower()
    try:
        seconds = float(text)
    except ValueError:
        parts = _DURATION.findall(text)
        if not parts or "".join(n + u for n, u in parts) != text:
            return None
        seconds = sum(float(n) * _UNIT_S[u] for n, u in parts)
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def _number(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        number = float(value.strip())
    except ValueError:
        return None
    return number if math.isfinite(number) and number >= 0 else None


def _retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds the server asked us to wait: ``retry-after-ms``, else ``retry-after`` (seconds
    or an HTTP date)."""
    ms = _number(headers.get("retry-after-ms"))
    if ms is not None:
        return ms / 1000.0
    value = headers.get("retry-after")
    seconds = _number(value)
    if seconds is not None or value is None:
        return seconds
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return max(0.0, when.timestamp() - time.time())


@dataclass(frozen=True)
class RateHeaders:
    """What one answer's headers say of the key's rate limits (``None``: not sent)."""

    retry_after: float | None = None
    limit_requests: float | None = None
    remaining_requests: float | None = None
    reset_requests: float | None = None
    limit_tokens: float | None = None
    remaining_tokens: float | None = None
    reset_tokens: float | None = None

    @classmethod
    def parse(cls, headers: Mapping[str, str] | None) -> RateHeaders:
        """Read :data:`RATE_HEADERS` from a mapping with lower-case names; malformed values
        count as not sent."""
        if not headers:
            return cls()
        return cls(
            retry_after=_retry_after(headers),
            limit_requests=_number(headers.get("x-ratelimit-limit-requests")),
            remaining_requests=_number(headers.get("x-ratelimit-remaining-requests")),
            reset_requests=parse_duration(headers.get("x-ratelimit-reset-requests")),
            limit_tokens=_number(headers.get("x-ratelimit-limit-tokens")),
            remaining_tokens=_number(headers.get("x-ratelimit-remaining-tokens")),
            reset_tokens=parse_duration(headers.get("x-ratelimit-reset-tokens")),
        )

    @property
    def describes_limits(self) -> bool:
        """Whether the answer says what is left of the key (requests or tokens)."""
        return self.remaining_requests is not None or self.remaining_tokens is not None

    @property
    def key_spent(self) -> bool:
        """Whether the answer says the whole key is spent (nothing left of one of its limits)."""
        return any(r is not None and r < 1 for r in (self.remaining_requests, self.remaining_tokens))


class TokenBucket:
    """A bucket refilled continuously at ``per_minute / 60`` units per second.

    Waiters are served in arrival order (the lock is held while waiting), so a big request is
    not starved by a stream of small ones.
    """

    def __init__(self, per_minute: float, capacity: float | None = None) -> None:
        self.rate = per_minute / 60.0
        self.capacity = capacity if capacity is not None else per_minute
        self.level = self.capacity
        self.updated = time.monotonic()
        self._lock = anyio.Lock()

    def _refill(self) -> None:
        now = time.monotonic()
        self.level = min(self.capacity, self.level + (now - self.updated) * self.rate)
        self.updated = now

    async def acquire(self, amount: float = 1.0) -> None:
        """Wait until ``amount`` units are available and take them."""
        amount = min(amount, self.capacity)
        async with self._lock:
            while True:
                self._refill()
                if self.level >= amount:
                    self.level -= amount
                    return
                await anyio.sleep((amount - self.level) / self.rate)


class _Mirror:
    """The client's copy of one provider bucket (requests or tokens), set by the headers.

    ``remaining`` is the level the server reported; ``limit`` its capacity; ``reset`` the
    seconds until it is full again, so the refill rate is ``(limit - remaining) / reset``
    (a bucket refilled continuously, as OpenAI's are). Without a limit the rate is unknown
    and an empty mirror waits for the reset instead.

    Providers report ``remaining`` in whole units (rounded down) and ``reset`` from the exact
    level, so one answer's ``(limit - remaining) / reset`` overstates the rate by up to one
    unit over the deficit: 30% and more when the bucket is nearly full (a single caller that
    waits on each answer). Every answer bounds the rate from above, so the mirror takes the
    lowest bound of the last :attr:`WINDOW_S` seconds (a new limit, or a window without a
    lower one, starts again: a raised limit is followed). tests/test_limits.py pins it.
    """

    #: Share of the provider's refill rate the mirror assumes: a little under, so starts that
    #: the network bunches together do not arrive at an empty bucket.
    MARGIN = 0.97
    #: How long the lowest rate read from the headers stands against higher readings.
    WINDOW_S = 10.0

    def __init__(self) -> None:
        self.level = 0.0
        self.limit: float | None = None
        self.rate: float | None = None  # units per second
        self.full_at = 0.0  # when a bucket of unknown rate is full again (monotonic)
        self.updated = 0.0
        self._bound: float | None = None  # the lowest (limit - remaining) / reset of the window
        self._bound_at = 0.0

    def sync(self, remaining: float, limit: float | None, reset: float | None, pending: float,
             now: float) -> None:
        """Take the server's figures (``pending``: what requests in flight, sent after the one
        that brought them, will take)."""
        if limit is not None:
            limit = max(limit, remaining)
            if limit != self.limit:
                self._bound = None  # another limit: the old readings bound nothing
            self.limit = limit
        if reset is not None:
            self.full_at = now + reset
            if self.limit is not None and reset > 0 and self.limit > remaining:
                bound = (self.limit - remaining) / reset
                if (self._bound is None or bound <= self._bound
                        or now - self._bound_at > self.WINDOW_S):
                    self._bound, self._bound_at = bound, now
                self.rate = self.MARGIN * self._bound
        self.level = remaining - pending
        self.updated = now

    def _refill(self, now: float) -> None:
        if self.rate is not None:
            top = self.limit if self.limit is not None else math.inf
            self.level = min(top, self.level + (now - self.updated) * self.rate)
        elif now >= self.full_at and self.limit is not None:
            self.level = max(self.level, self.limit)
        self.updated = now

    def delay(self, amount: float, now: float) -> float:
        """Seconds until ``amount`` fits (0: now)."""
        self._refill(now)
        if self.limit is not None:
            amount = min(amount, self.limit)
        if self.level >= amount:
            return 0.0
        if self.rate:
            return (amount - self.level) / self.rate
        # No refill rate known: empty until the reset the server gave (if it gave one).
        return max(0.0, self.full_at - now)

    def take(self, amount: float) -> None:
        if self.rate or self.updated < self.full_at:
            self.level -= amount  # (a mirror that knows neither rate nor reset never waits)


class ProviderBuckets:
    """Pacing from the provider's ``x-ratelimit-*`` headers: one :class:`_Mirror` for requests
    and one for tokens, each made the first time an answer reports that limit."""

    def __init__(self) -> None:
        self.requests: _Mirror | None = None
        self.tokens: _Mirror | None = None

    @property
    def active(self) -> bool:
        return self.requests is not None or self.tokens is not None

    def sync(self, rh: RateHeaders, pending_requests: float, pending_tokens: float,
             now: float) -> None:
        if rh.remaining_requests is not None:
            self.requests = self.requests or _Mirror()
            self.requests.sync(rh.remaining_requests, rh.limit_requests, rh.reset_requests,
                               pending_requests, now)
        if rh.remaining_tokens is not None:
            self.tokens = self.tokens or _Mirror()
            self.tokens.sync(rh.remaining_tokens, rh.limit_tokens, rh.reset_tokens,
                             pending_tokens, now)

    def delay(self, tokens: float, now: float) -> float:
        waits = [0.0]
        if self.requests is not None:
            waits.append(self.requests.delay(1.0, now))
        if self.tokens is not None:
            waits.append(self.tokens.delay(tokens, now))
        return max(waits)

    def take(self, tokens: float) -> None:
        if self.requests is not None:
            self.requests.take(1.0)
        if self.tokens is not None:
            self.tokens.take(tokens)

    def rate(self, tokens_per_request: float) -> float | None:
        """The request rate the mirrors allow at their refill rates (``None``: unknown)."""
        rates = []
        if self.requests is not None and self.requests.rate:
            rates.append(self.requests.rate / self.requests.MARGIN)
        if self.tokens is not None and self.tokens.rate and tokens_per_request > 0:
            rates.append(self.tokens.rate / self.tokens.MARGIN / tokens_per_request)
        return min(rates) if rates else None


State = Literal["clean", "testing", "limited", "overloaded"]

#: What a test restores when a decrease changed nothing: rate, base, decreased_at, state.
_Saved = tuple[float | None, float, float, State]


@dataclass
class _Test:
    """A decrease whose effect is being measured on the answers to requests sent after it."""

    since: float  # when the decrease was made: later starts are its sample
    share_before: float
    n: int = 0
    refused: int = 0


class AdaptiveRate:
    """An AIMD request rate for 429s that carry no rate headers, with a test of each decrease.

    States: ``clean`` (no pacing), ``testing`` (a decrease is being measured), ``limited``
    (paced: the last decrease lowered the share of 429s, so they are about the rate) and
    ``overloaded`` (a decrease changed nothing: the 429s are random, as from an overloaded
    provider; no decrease is made while their share stays near the one measured).

    **Decrease.** On a 429 to a request sent after the last decrease (one decrease per
    episode, none while one is tested) the rate is multiplied by ``max(MIN_FACTOR, BETA *
    (1 - share))``, ``share`` being the share of 429s among the last :attr:`RECENT` answers:
    a rate ten times too high is cut fast, one a little over by a tenth. The rate decreased
    from is the pacing rate, or without pacing the rate of the last starts (their median gap). Never
    below ``floor``, never above ``ceiling`` (the configured ``rpm``).

    **Increase.** After a decrease to ``r0`` the rate grows back additively, by ``r0 (1 - BETA)
    / BETA`` every :attr:`CLIMB_S` seconds, for :attr:`LINEAR` such periods, and then in steps
    that double every :attr:`CLIMB_S`; once it is :attr:`UNPACE` × ``r0`` (about 36 s without a
    429) the limit has gone and pacing ends.

    **Test.** Let ``s`` be the share of 429s over the last :attr:`WATCH` answers before the
    decrease and ``a`` the share among the answers to requests sent after it. The 429s are
    about the rate when ``a`` is clearly below ``s`` (by 2σ of its ``n`` answers, or to a
    quarter of it over the whole sample), when
    ``s`` is small (< :attr:`MIN_SHARE`: too few to tell, and a decrease of a tenth costs
    little), or when nearly everything is still refused while some requests pass (far above a
    limit, lowering a few times is needed before the share moves). Otherwise lowering the rate
    did not lower the share, and when that happens :attr:`STRIKES` times in a row the
    decreases since the backend was last unpaced (or overloaded) are undone and the backend is
    ``overloaded``: its 429s are retried after the server's
    delay and no decrease is made until their share rises :attr:`RETEST_MARGIN` above the
    share it keeps measuring. A rate verdict needs :attr:`MIN_SAMPLE` answers, a random one
    :attr:`SAMPLE`.
    """

    BETA = 0.9
    MIN_FACTOR = 0.25
    CLIMB_S = 5.0
    #: Periods of CLIMB_S the increase stays additive before its steps start doubling.
    LINEAR = 3.0
    UNPACE = 4.0
    RECENT = 32
    SAMPLE = 24
    MIN_SAMPLE = 8
    MIN_SHARE = 0.05
    #: Decreases in a row that must change nothing before the 429s count as random.
    STRIKES = 2
    #: Answers over which the share of 429s is measured before a decrease and watched in the
    #: ``overloaded`` state, and how far above the share measured it must rise for another
    #: decrease to be tried.
    WATCH = 128
    RETEST_MARGIN = 0.15
    #: Seconds without a 429 after which an ``overloaded`` backend is ``clean`` again.
    QUIET_S = 30.0

    def __init__(self, *, floor: float, ceiling: float | None = None) -> None:
        self.floor = floor
        self.ceiling = ceiling
        self.state: State = "clean"
        self.rate: float | None = None  # starts per second; None: not paced
        self._base = 0.0  # the rate set by the last decrease
        self.decreased_at = -math.inf
        self.decreases = 0
        self.restored = 0  # tests that found their decrease changed nothing
        self.background = 0.0  # the share of random 429s measured
        self.test: _Test | None = None
        self._chain: _Saved | None = None  # the state before this chain of decreases
        self._strikes = 0  # tests in a row whose decrease changed nothing
        self._answers: collections.deque[bool] = collections.deque(maxlen=self.WATCH)
        self._starts: collections.deque[float] = collections.deque(maxlen=4096)
        self._first_start: float | None = None
        self._last_429 = -math.inf

    # -- the rate ------------------------------------------------------------------------
    def current(self, now: float) -> float | None:
        """Starts per second allowed now (``None``: not paced)."""
        if self.rate is None:
            return None
        x = (now - self.decreased_at) / self.CLIMB_S
        steps = x if x <= self.LINEAR else self.LINEAR + (2 ** (x - self.LINEAR) - 1) / math.log(2)
        grown = self._base * (1 + (1 - self.BETA) / self.BETA * steps)
        if self.test is None and grown >= self.UNPACE * self._base:
            self.rate = None  # well above what was refused: the limit has gone
            self._chain = None
            if self.state == "limited":
                self.state = "clean"
            return None
        if self.ceiling is not None:
            grown = min(grown, self.ceiling)
        self.rate = max(self.floor, grown)
        return self.rate

    def started(self, now: float) -> None:
        if self._first_start is None:
            self._first_start = now
        self._starts.append(now)

    def _start_rate(self, now: float) -> float:
        """Starts per second: one over the median gap between the last :attr:`RECENT` starts
        (a process that stalled for seconds, or a pause between dialogues, does not make it
        look slow), or with fewer starts their count over the time since the first."""
        starts = list(self._starts)[-(self.RECENT + 1):]
        if len(starts) > self.MIN_SAMPLE:
            gaps = sorted(b - a for a, b in itertools.pairwise(starts))
            median = gaps[len(gaps) // 2]
            if median > 0:
                return max(self.floor, 1.0 / median)
        first = self._first_start if self._first_start is not None else now
        window = min(1.0, max(now - first, 0.01))
        return max(self.floor, len(starts) / window)

    def _share(self, n: int) -> float:
        recent = list(self._answers)[-n:]
        return sum(recent) / len(recent) if recent else 0.0

    # -- answers -------------------------------------------------------------------------
    def answered(self, started: float, refused: bool, now: float, *, about_rate: bool = True) -> None:
        """An answer to a request that started at ``started``: a 429 (``refused``) or not.
        ``about_rate=False``: a 429 the headers explain (the key has room, or the provider's
        buckets pace it already), which never decreases the rate."""
        self._answers.append(refused)
        if self.state == "overloaded":  # follow the provider's share of random 429s
            self.background += (refused - self.background) / self.WATCH
        test = self.test
        if test is not None and started > test.since:
            test.n += 1
            test.refused += refused
            self._maybe_conclude(test)
        if not refused:
            if self.state == "overloaded" and now - self._last_429 > self.QUIET_S:
                self.state = "clean" if self.rate is None else "limited"
            return
        self._last_429 = now
        if not about_rate or self.test is not None or started <= self.decreased_at:
            return  # explained, being tested, or sent before the last decrease
        if self.state == "overloaded" and self._share(self.WATCH) <= (
                self.background + self.RETEST_MARGIN):
            return  # as many 429s as the provider answers at any rate
        self._decrease(now)

    def _decrease(self, now: float) -> None:
        if self.state in ("clean", "overloaded"):
            self._chain = (self.rate, self._base, self.decreased_at, self.state)
        before = self.current(now) or self._start_rate(now)
        new = max(self.floor, before * max(self.MIN_FACTOR, self.BETA * (1 - self._share(self.RECENT))))
        if self.ceiling is not None:
            new = min(new, self.ceiling)
        self.test = _Test(since=now, share_before=self._share(self.WATCH))
        self.rate, self._base, self.decreased_at = new, new, now
        self.state = "testing"
        self.decreases += 1

    def _maybe_conclude(self, test: _Test) -> None:
        n, before = test.n, test.share_before
        if n < self.MIN_SAMPLE:
            return
        after = test.refused / n
        sigma = math.sqrt(max(before * (1 - before), 0.01) / n)
        # Checked on every answer: 2σ of n (so a few lucky answers decide nothing), or, with
        # the whole sample in, a quarter of the share before.
        dropped = after < before - 2 * sigma or (n >= self.SAMPLE and after <= before / 4)
        far_above = after >= 0.9 and test.refused < n
        if before < self.MIN_SHARE or dropped or far_above:
            self.test = None
            self.state = "limited"
            self._strikes = 0
        elif n >= self.SAMPLE and self._strikes < self.STRIKES - 1:
            # No effect, once: far above a limit one decrease may not be enough to show, so
            # the next 429 lowers the rate again and that decrease is tested too.
            self.test = None
            self.state = "limited"
            self._strikes += 1
        elif n >= self.SAMPLE:
            # Lowering the rate did not lower the share of 429s: they are not about the rate.
            self.test = None
            self._strikes = 0
            if self._chain is not None:
                self.rate, self._base, self.decreased_at, _ = self._chain
            self._chain = None
            self.state = "overloaded"
            self.background = after
            self.restored += 1


@dataclass
class Ticket:
    """One request admitted by :meth:`BackendLimits.admit` (until it is answered)."""

    seq: int
    started: float
    tokens: float
    done: bool = False


class BackendLimits:
    """The limits of one backend: concurrency slots, the configured RPM and TPM buckets, the
    provider's buckets as its headers describe them (:class:`ProviderBuckets`), the adaptive
    rate for 429s without them (:class:`AdaptiveRate`) and holds; and the counts a run reports
    (429s, seconds waited)."""

    #: The lowest adaptive rate (starts per second) unless the configured ``rpm`` is lower:
    #: slow enough for any provider's limit, fast enough that a run keeps moving.
    MIN_RATE = 0.2
    #: Seconds after the provider's buckets last made a start wait that it still counts as
    #: paced by them.
    REPORT_RECENT_S = 5.0

    def __init__(self, max_concurrency: int, rpm: int | None, tpm: int | None,
                 scale: float = 1.0) -> None:
        self.slots = anyio.CapacityLimiter(max_concurrency)
        self.rpm = TokenBucket(rpm) if rpm else None
        self.tpm = TokenBucket(tpm) if tpm else None
        self.scale = scale
        ceiling = rpm / 60.0 if rpm else None
        floor = min(self.MIN_RATE, ceiling) if ceiling else self.MIN_RATE
        self.adaptive = AdaptiveRate(floor=floor, ceiling=ceiling)
        self.provider = ProviderBuckets()
        self._lock = anyio.Lock()
        self._next = 0.0  # when the next start may be (the adaptive rate's gap)
        self._hold = 0.0  # no start before this (a Retry-After for the whole key)
        self._seq = 0
        self._in_flight: dict[int, Ticket] = {}
        #: Server prompt tokens per counted prompt token (the provider counts its own way).
        self._token_ratio = 1.0
        self._tokens_per_request = 0.0
        self._provider_waited_at = -math.inf
        #: 429s answered; seconds of the run during which starts were held by the pacing;
        #: seconds requests waited for it, summed over requests; seconds they waited after a
        #: 429 (summed; added by :mod:`spasm.calls`); 429s that held the whole key.
        self.refusals = 0
        self.held_s = 0.0
        self.queued_s = 0.0
        self.retry_wait_s = 0.0
        self.holds = 0

    @property
    def wants_tokens(self) -> bool:
        """Whether requests need a token estimate (a TPM bucket or the provider's tokens)."""
        return self.tpm is not None or self.provider.tokens is not None

    def estimate(self, counted_prompt: int, max_tokens: int) -> float:
        """What the provider will likely charge a request: its prompt tokens as the provider
        counts them (the counted ones, scaled by what the provider has reported) plus
        ``max_tokens``, as OpenAI reserves them."""
        return self._token_ratio * counted_prompt + max_tokens

    def _paced(self, now: float) -> bool:
        return self._hold > now or self.provider.active or self.adaptive.rate is not None

    async def admit(self, counted_prompt: int = 0, max_tokens: int = 0) -> Ticket:
        """Wait for the pacing and the configured buckets (call inside ``async with
        self.slots``); returns the request's :class:`Ticket`.

        Starts wait in arrival order (the pacing lock is held while waiting). Waits are
        multiplied by ``scale``; below 1 (tests) each is slept once, scaled, and not checked
        again, since the clock it was computed on does not move as fast."""
        provider_tokens = self.estimate(counted_prompt, max_tokens)
        now = time.monotonic()
        if self._paced(now):
            t0 = now
            async with self._lock:
                t_lock = time.monotonic()
                while True:
                    now = time.monotonic()
                    rate = self.adaptive.current(now)
                    by_provider = self.provider.delay(provider_tokens, now)
                    wait = max(self._hold - now, by_provider,
                               self._next - now if rate is not None else 0.0)
                    if by_provider > _EPSILON_S:
                        self._provider_waited_at = now
                    if wait <= _EPSILON_S:  # (float rounding never leaves a start waiting)
                        break
                    await anyio.sleep(wait * self.scale)
                    if self.scale < 1.0:
                        now = time.monotonic()
                        break
                self.provider.take(provider_tokens)
                if rate is not None:
                    self._next = max(now, self._next) + 1.0 / rate
                # Under the lock no other start happens: this is time the backend was held.
                self.held_s += time.monotonic() - t_lock
            self.queued_s += time.monotonic() - t0
        if self.rpm is not None:
            await self.rpm.acquire(1)
        if self.tpm is not None:
            await self.tpm.acquire(counted_prompt + max_tokens)
        now = time.monotonic()
        self.adaptive.started(now)
        self._seq += 1
        ticket = Ticket(self._seq, now, provider_tokens)
        self._in_flight[ticket.seq] = ticket
        self._tokens_per_request += 0.1 * (provider_tokens - self._tokens_per_request)
        return ticket

    def _pending(self, ticket: Ticket) -> tuple[float, float]:
        later = [t for t in self._in_flight.values() if t.seq > ticket.seq]
        return float(len(later)), sum(t.tokens for t in later)

    def _close(self, ticket: Ticket, headers: Mapping[str, str] | None) -> RateHeaders:
        rh = RateHeaders.parse(headers)
        if rh.describes_limits:
            requests, tokens = self._pending(ticket)
            self.provider.sync(rh, requests, tokens, time.monotonic())
        self.release(ticket)
        return rh

    def answered(self, ticket: Ticket, headers: Mapping[str, str] | None = None, *,
                 counted_prompt: int = 0, reported_prompt: int = 0) -> None:
        """The request was answered (not with a 429); ``headers``: its rate headers."""
        self._close(ticket, headers)
        if counted_prompt > 0 and reported_prompt > 0:
            self._token_ratio += 0.1 * (reported_prompt / counted_prompt - self._token_ratio)
        self.adaptive.answered(ticket.started, False, time.monotonic())

    def refused(self, ticket: Ticket, headers: Mapping[str, str] | None = None,
                retry_after: float | None = None) -> None:
        """The request was answered 429. A 429 whose headers say the key is spent holds every
        request for its ``Retry-After``; one whose headers say the key has room is not about
        the rate; one whose headers describe the key paces through the provider's buckets;
        only one without such headers lowers the adaptive rate."""
        self.refusals += 1
        rh = self._close(ticket, headers)
        now = time.monotonic()
        if rh.key_spent:
            delay = rh.retry_after if rh.retry_after is not None else retry_after
            if delay:
                self.holds += 1
                self._hold = max(self._hold, now + delay)
        self.adaptive.answered(ticket.started, True, now, about_rate=not rh.describes_limits)

    def release(self, ticket: Ticket) -> None:
        """The request is over (any outcome); idempotent."""
        if not ticket.done:
            ticket.done = True
            self._in_flight.pop(ticket.seq, None)

    def report(self) -> dict[str, Any]:
        """What the run reports of this backend's rate limits (manifest, status, summary):
        whether its starts are paced now and at what rate (by the adaptive rate after 429s,
        or by the provider's headers when they made a start wait in the last few seconds),
        its 429s, the seconds of the run it was held (``held_s``) and the seconds its requests
        waited, summed over them: for their start (``queued_s``) and after 429s
        (``retry_wait_s``)."""
        now = time.monotonic()
        adaptive = self.adaptive.current(now)
        provider = (self.provider.rate(self._tokens_per_request)
                    if now - self._provider_waited_at < self.REPORT_RECENT_S else None)
        rates = [r for r in (adaptive, provider) if r is not None]
        paced_at = min(rates) if rates else None
        source = None if paced_at is None else "429s" if paced_at == adaptive else "headers"
        return {
            "paced": paced_at is not None or self._hold > now,
            "rate_rps": round(paced_at, 3) if paced_at is not None else None,
            "source": source,
            "state": self.adaptive.state,
            "rate_limited": self.refusals,
            "held_s": round(self.held_s, 3),
            "queued_s": round(self.queued_s, 3),
            "retry_wait_s": round(self.retry_wait_s, 3),
            "decreases": self.adaptive.decreases,
            "decreases_undone": self.adaptive.restored,
            "holds": self.holds,
            "provider_headers": self.provider.active,
        }
