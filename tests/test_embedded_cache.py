"""Per-agent KV contexts on the embedded model: same replies, fewer prompt tokens evaluated."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from spasm.agents import clean_reply, client_system_prompt, responder_system_prompt
from spasm.backends import make_backend
from spasm.backends.base import ChatRequest, Completion
from spasm.backends.embedded import EmbeddedBackend, StreamSlots, slot_count, stream_of
from spasm.config import BackendConfig, parse_config
from spasm.engine import Engine
from spasm.history import History, Speaker
from spasm.projection import Viewer, project

CARD = "You are Sam, 41, a plumber. Your parcel is two weeks late and you want a refund."


def test_stream_slots_give_each_stream_its_context_and_evict_the_oldest() -> None:
    slots = StreamSlots(2)
    assert [slots.slot("a"), slots.slot("b"), slots.slot("a")] == [0, 1, 0]
    # "b" is now the least recently used: a new stream takes its context.
    assert slots.slot("c") == 1
    assert slots.slot("a") == 0


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


def test_a_sequential_backend_runs_one_dialogue_at_a_time(tmp_path: Path) -> None:
    raw: dict[str, Any] = {
        "name": "seq", "personas": {"n": 1},
        "backends": {"embedded": {"kind": "embedded"}},
        "pairings": [{"client": "embedded", "responder": "embedded"}],
    }
    config = parse_config(raw)
    engine = Engine(config, tmp_path / "run", progress=False)
    backends = {"embedded": make_backend("embedded", config.backends["embedded"])}
    assert engine.dialogues_in_flight(backends) == 1
    raw["engine"] = {"max_dialogues_in_flight": 3}
    assert Engine(parse_config(raw), tmp_path / "r2", progress=False).dialogues_in_flight(backends) == 3


async def _loop(backend: EmbeddedBackend, condition: str, keyed: bool) -> list[Completion]:
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
            max_tokens=12, seed=k, stream_key=f"t:{condition}:{speaker}" if keyed else None,
        )
        c = await backend.complete(request)
        history = history.append(speaker, clean_reply(c.text, c.finish_reason == "length") or "ok")
        out.append(c)
    return out


@pytest.mark.parametrize("condition", ["ecp", "concat"])
def test_per_agent_contexts_reply_as_full_reprocessing_does(condition: str) -> None:
    cfg = BackendConfig(kind="embedded", n_ctx=2048, n_threads=2)
    shared = EmbeddedBackend("embedded", cfg)
    shared.slots = StreamSlots(1)  # both agents on one context: every turn is re-evaluated
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
