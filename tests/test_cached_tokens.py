"""Cached prompt tokens come from what the API reports and are billed at the configured price."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import anyio
import pandas as pd
import pytest
from openai.types import CompletionUsage

from spasm.backends.openai_compat import _cached_tokens
from spasm.config import Prices
from spasm.engine import Engine
from spasm.testing import TestServer
from spasm.testing.usage import Usage
from tests.conftest import config_from, endpoint_config

PRICES = {"input_per_1m": 2.0, "output_per_1m": 8.0, "cached_input_per_1m": 0.5}


def _run(tmp_path: Path, usage: Usage, **overrides: object) -> tuple[pd.DataFrame, dict[str, object]]:
    with TestServer(usage=usage) as srv:
        data = endpoint_config(srv.base_url, personas={"n": 2}, termination={"rules": False},
                               engine={"cache": False}, **overrides)
        data["backends"]["srv"]["prices"] = PRICES
        summary = anyio.run(Engine(config_from(data), tmp_path / "run", progress=False).run)
    assert summary.completed == summary.planned
    calls = pd.read_parquet(tmp_path / "run" / "calls.parquet")
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    return calls, manifest


def test_an_append_only_agent_is_served_its_previous_prompt_from_the_cache(tmp_path: Path) -> None:
    calls, _ = _run(tmp_path, Usage(prefix_cache=True))
    agents = calls[calls.role.isin(["client", "responder"])].sort_values("started_at")
    assert (agents.cached_tokens <= agents.prompt_tokens).all()
    for _, stream in agents.groupby(["dialogue_id", "role"]):
        prompts = stream.prompt_tokens.tolist()
        cached = stream.cached_tokens.tolist()
        # Under ECP an agent's prompt extends its previous one by whole messages: the cache
        # serves exactly the previous prompt, never more, never less.
        assert cached[1:] == prompts[:-1]
        assert all(b > a for a, b in itertools.pairwise(prompts))


def test_cached_tokens_are_billed_at_the_cached_price(tmp_path: Path) -> None:
    calls, manifest = _run(tmp_path, Usage(prefix_cache=True))
    assert calls.cached_tokens.sum() > 0
    prices = Prices(**PRICES)
    paid = calls[~calls.cache_hit]
    expected = sum(prices.cost(p, c, k) for p, c, k in
                   zip(paid.prompt_tokens, paid.completion_tokens, paid.cached_tokens, strict=True))
    full = sum(prices.cost(p, c) for p, c in zip(paid.prompt_tokens, paid.completion_tokens, strict=True))
    cost = manifest["usage"]["cost"]  # type: ignore[index]
    assert cost == pytest.approx(expected)
    assert cost < full  # the discount applied
    roles = manifest["usage"]["by_role"]  # type: ignore[index]
    assert sum(r["cached_tokens"] for r in roles.values()) == calls.cached_tokens.sum()


def test_without_a_reported_cache_nothing_is_discounted(tmp_path: Path) -> None:
    calls, manifest = _run(tmp_path, Usage())
    assert (calls.cached_tokens == 0).all()
    prices = Prices(**PRICES)
    paid = calls[~calls.cache_hit]
    full = sum(prices.cost(p, c) for p, c in zip(paid.prompt_tokens, paid.completion_tokens, strict=True))
    assert manifest["usage"]["cost"] == pytest.approx(full)  # type: ignore[index]


def test_a_provider_caching_only_long_prompts_in_blocks(tmp_path: Path) -> None:
    calls, _ = _run(tmp_path, Usage(prefix_cache=True, min_tokens=64, block=32))
    cached = calls.cached_tokens
    assert (cached % 32 == 0).all()
    assert ((cached == 0) | (cached >= 64)).all()
    assert cached.sum() > 0


def test_tiktoken_counting_counts_more_than_words_for_json(tmp_path: Path) -> None:
    usage = Usage(tokens="tiktoken")
    text = '{"dimension_scores": {"boundary": 95, "fact": 90}}'
    assert usage.count(text) > len(text.split())
    assert usage.count(usage.truncate("one two three four five six", 3)) <= 3


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        ({"prompt_tokens": 100, "completion_tokens": 5, "total_tokens": 105,
          "prompt_tokens_details": {"cached_tokens": 64}}, 64),
        # DeepSeek reports its cache hits at the top level.
        ({"prompt_tokens": 100, "completion_tokens": 5, "total_tokens": 105,
          "prompt_cache_hit_tokens": 40, "prompt_cache_miss_tokens": 60}, 40),
        ({"prompt_tokens": 100, "completion_tokens": 5, "total_tokens": 105}, 0),
        # A server claiming more cached tokens than the prompt had is not believed past the prompt.
        ({"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15,
          "prompt_tokens_details": {"cached_tokens": 99}}, 10),
        ({"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15,
          "prompt_tokens_details": {"cached_tokens": "lots"}}, 0),
    ],
)
def test_cached_tokens_are_read_from_every_usage_shape(usage: dict[str, object], expected: int) -> None:
    assert _cached_tokens(CompletionUsage.construct(**usage)) == expected  # SDK builds unvalidated


def test_prices_cost_bills_cached_tokens_apart() -> None:
    p = Prices(input_per_1m=1.0, output_per_1m=4.0, cached_input_per_1m=0.25)
    assert p.cost(1_000_000, 0, 400_000) == pytest.approx(0.6 + 0.1)
    assert Prices(input_per_1m=1.0).cost(1_000_000, 0, 400_000) == pytest.approx(1.0)
    assert p.cost(10, 0, 50) == pytest.approx(p.cost(10, 0, 10))
