"""Per-agent KV contexts on the embedded model: same replies, fewer prompt tokens evaluated."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from spasm.agents import clean_reply, client_system_prompt, responder_system_prompt
from spasm.backends import make_backend
from spasm.backends.base import ChatRequest, Completion
from spasm.backends.embedded import (
    EmbeddedBackend,
    SavedState,
    SavedStates,
    StreamSlots,
    default_threads,
    lane_plan,
    slot_count,
    stream_of,
)
from spasm.config import BackendConfig, parse_config
from spasm.engine import Engine
from spasm.history import History, Speaker
from spasm.projection import Viewer, project

pytestmark = pytest.mark.e2e

CARD = "You are Sam, 41, a plumber. Your parcel is two weeks late and you want a refund."


def test_stream_slots_give_each_stream_its_context_and_evict_the_oldest() -> None:
    slots = StreamSlots(2)
    assert [slots.slot("a"), slots.slot("b"), slots.slot("a")] == [0, 1, 0]
    # "b" is now the least recently used: a new stream takes its context.
    assert slots.slot("c") == 1
    assert slots.slot("a") == 0


def test_assign_names_the_stream_that_lost_its_context() -> None:
    slots = StreamSlots(1)
    assert slots.assign("a") == (0, None, True)
    assert slots.assign("a") == (0, None, False)
    assert slots.assign("b") == (0, "a", True)


def test_saved_states_keep_to_their_budget_oldest_out() -> None:
    def state(n: int) -> SavedState:
        return SavedState(tuple(range(n)), bytearray(n * 1024))

    states = SavedStates(budget_mb=1)
    states.put("a", state(600))
    states.put("b", state(300))
    states.put("c", state(300))  # 1.2 MB: the oldest ("a") goes
    assert len(states) == 2 and states.take("a") is None
    assert states.take("b") is not None and states.take("b") is None
    states.put("big", state(2000))  # larger than the whole budget: not kept
    assert states.take("big") is None


def test_stream_key_changes_neither_the_cache_key_nor_the_logged_params() -> None:
    base = ChatRequest(messages=({"role": "user", "content": "hi"},), temperature=0.0, max_tokens=8)
    keyed = ChatRequest(
        messages=base.messages, temperature=0.0, max_tokens=8, stream_key="d1:client"
    )
    assert keyed.cache_key("x") == base.cache_key("x")
    assert keyed.params() == base.params()


def test_requests_without_a_key_are_streamed_by_their_system_prompt() -> None:
    def req(system: str, user: str, key: str | None = None) -> ChatRequest:
        return ChatRequest(messages=({"role": "system", "content": system},
                                     {"role": "user", "content": user}),
                           temperature=0.0, max_tokens=8, stream_key=key)

    # A harness role keeps its instructions and policy first: one stream per agent and role.
    assert stream_of(req("checker for Sam", "draft 1")) == stream_of(req("checker for Sam", "draft 2"))
    assert stream_of(req("checker for Sam", "x")) != stream_of(req("reducer for Sam", "x"))
    assert stream_of(req("checker for Sam", "x", key="d1:client")) == "d1:client"


def test_the_contexts_fit_the_memory_budget() -> None:
    assert slot_count(2048) == 6 and slot_count(8192) == 3 and slot_count(65536) == 2


def test_the_cores_split_into_lanes() -> None:
    # Without n_threads: up to two lanes sharing the cores; with it, lanes of that many threads.
    assert lane_plan(None, cores=1) == (1, 1)
    assert lane_plan(None, cores=2) == (2, 1)
    assert lane_plan(None, cores=16) == (2, 8)
    assert lane_plan(2, cores=2) == (1, 2)
    assert lane_plan(1, cores=2) == (2, 1)
    assert lane_plan(4, cores=2) == (1, 4)


@pytest.mark.parametrize("n_threads", [None, default_threads()])
def test_the_embedded_model_runs_one_dialogue_per_lane(tmp_path: Path, n_threads: int | None) -> None:
    raw: dict[str, Any] = {
        "name": "seq", "personas": {"n": 1},
        "backends": {"embedded": {"kind": "embedded", "n_threads": n_threads}},
        "pairings": [{"client": "embedded", "responder": "embedded"}],
    }
    config = parse_config(raw)
    engine = Engine(config, tmp_path / "run", progress=False)
    backend = make_backend("embedded", config.backends["embedded"])
    lanes = lane_plan(n_threads)[0]
    assert backend.max_concurrency == lanes and (n_threads is None or lanes == 1)
    assert engine.dialogues_in_flight({"embedded": backend}) == lanes
    raw["engine"] = {"max_dialogues_in_flight": 3}
    engine = Engine(parse_config(raw), tmp_path / "r2", progress=False)
    assert engine.dialogues_in_flight({"embedded": backend}) == 3


def test_a_stream_never_starts_from_another_streams_tokens() -> None:
    """Two dialogues with the same prompts, the second on the first's contexts: its first turns
    are evaluated from nothing (no shared template prefix), so its replies cannot depend on
    which dialogue ran before it."""
    backend = EmbeddedBackend("embedded", BackendConfig(kind="embedded", n_ctx=2048, n_threads=2))
    backend.slots = StreamSlots(2)
    first = anyio.run(_loop, backend, "ecp", True, "d1")
    second = anyio.run(_loop, backend, "ecp", True, "d2")
    assert [c.cached_tokens for c in second[:2]] == [0, 0]
    assert [c.text for c in second] == [c.text for c in first]


def test_two_lanes_reply_as_one_does() -> None:
    """Two dialogues at once on one thread each give the replies of one on all cores."""
    one = EmbeddedBackend("embedded", BackendConfig(kind="embedded", n_ctx=2048, n_threads=2))
    two = EmbeddedBackend("embedded", BackendConfig(kind="embedded", n_ctx=2048, n_threads=1))
    two.max_concurrency, two.slots = 2, StreamSlots(2)  # two lanes, even on one core
    two._lanes = anyio.Semaphore(2)
    alone = anyio.run(_loop, one, "ecp", True)

    async def both() -> list[list[Completion]]:
        results: list[list[Completion]] = [[], []]

        async def run(i: int) -> None:
            results[i] = await _loop(two, "ecp", True, prefix=f"d{i}")

        async with anyio.create_task_group() as tg:
            tg.start_soon(run, 0)
            tg.start_soon(run, 1)
        return results

    pair = anyio.run(both)
    # Four streams on two contexts: each turn's agent comes back from its saved state.
    assert two.stats["restored"] >= 4
    for result in pair:
        assert [c.text for c in result] == [c.text for c in alone]


async def _loop(backend: EmbeddedBackend, condition: str, keyed: bool, prefix: str = "t") -> list[Completion]:
    """Four utterances of a greedy two-agent dialogue, replies cleaned as the run does."""
    role = "customer-service agent"
    viewers: dict[Speaker, Viewer] = {
        "client": Viewer("client", client_system_prompt(CARD, role)),
        "responder": Viewer("responder", responder_system_prompt(role)),
    }
    history = History()
    out: list[Completion] = []
    for k in range(4):
        speaker: Speaker = "client" if k % 2 == 0 else "responder"
        request = ChatRequest(
            messages=tuple(project(history, viewers[speaker], condition)), temperature=0.0,
            max_tokens=12, seed=k, stream_key=f"{prefix}:{condition}:{speaker}" if keyed else None,
        )
        c = await backend.complete(request)
        history = history.append(speaker, clean_reply(c.text, c.finish_reason == "length") or "ok")
        out.append(c)
    return out


@pytest.mark.parametrize("condition", ["ecp", "concat"])
def test_per_agent_contexts_reply_as_full_reprocessing_does(condition: str) -> None:
    cfg = BackendConfig(kind="embedded", n_ctx=2048, n_threads=2)
    shared = EmbeddedBackend("embedded", cfg)
    # Both agents on one context and nothing saved: every turn is re-evaluated.
    shared.slots, shared.states = StreamSlots(1), SavedStates(0)
    keyed = EmbeddedBackend("embedded", cfg)
    old = anyio.run(_loop, shared, condition, False)
    new = anyio.run(_loop, keyed, condition, True)
    assert [c.text for c in new] == [c.text for c in old]
    assert [c.prompt_tokens for c in new] == [c.prompt_tokens for c in old]
    cached_old = [c.extra["cached_tokens"] for c in old]
    cached_new = [c.extra["cached_tokens"] for c in new]
    # On the shared context the agents' system prompts differ: only template tokens match.
    assert max(cached_old[1:]) < 10
    if condition == "ecp":
        # An agent's second prompt extends its first: at least all of the first is served.
        assert cached_new[2] >= new[0].prompt_tokens - 1
        assert cached_new[3] >= new[1].prompt_tokens - 1
    else:
        # CONCAT rewrites the transcript into one message: a shorter prefix (the frame) is
        # reused and the rest evaluated, still with the same reply.
        assert 10 < cached_new[2] < new[2].prompt_tokens
    assert keyed.stats["cached_tokens"] == sum(cached_new)
    assert [c.cached_tokens for c in new] == cached_new  # what the calls table records


def test_a_stream_that_lost_its_context_comes_back_from_its_saved_state() -> None:
    cfg = BackendConfig(kind="embedded", n_ctx=2048, n_threads=2)
    shared = EmbeddedBackend("embedded", cfg)
    shared.slots, shared.states = StreamSlots(1), SavedStates(0)  # full re-processing
    saving = EmbeddedBackend("embedded", cfg)
    saving.slots = StreamSlots(1)  # both agents on one context, each saved while the other runs
    old = anyio.run(_loop, shared, "ecp", False)
    new = anyio.run(_loop, saving, "ecp", True)
    assert [c.text for c in new] == [c.text for c in old]
    assert saving.stats["restored"] == 2  # turns 3 and 4 found their agent's saved state
    cached = [c.cached_tokens for c in new]
    assert cached[2] >= new[0].prompt_tokens - 1 and cached[3] >= new[1].prompt_tokens - 1
