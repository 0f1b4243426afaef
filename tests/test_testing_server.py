"""Tests for spasm.testing.server, driven through the real ``openai`` SDK."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from enum import StrEnum
from functools import partial
from typing import Any, Literal

import anyio
import openai
import pydantic
import pytest
from openai.types.chat import ChatCompletionMessageParam

import spasm.testing
from spasm.testing import FaultPlan, TestServer
from spasm.testing.server import instance_from_schema, main

USER: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Hello there, how are you today?"}]


@pytest.fixture
def server() -> Iterator[TestServer]:
    with TestServer() as srv:
        yield srv


_open_clients: list[openai.OpenAI] = []


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _open_clients:
        _open_clients.pop().close()


def client_for(server: TestServer | str, timeout: float = 5.0) -> openai.OpenAI:
    """A real SDK client with retries off, closed when the test ends."""
    base_url = server if isinstance(server, str) else server.base_url
    client = openai.OpenAI(base_url=base_url, api_key="sk-secret-test", max_retries=0, timeout=timeout)
    _open_clients.append(client)
    return client


def chat(client: openai.OpenAI, **kwargs: Any) -> Any:
    params: dict[str, Any] = {"model": "m", "messages": USER}
    params.update(kwargs)
    return client.chat.completions.create(**params)


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


# -- public surface ------------------------------------------------------------------------


def test_public_names() -> None:
    assert spasm.testing.__all__ == ["FaultPlan", "TestServer"]
    assert TestServer.__test__ is False


def test_fault_plan_validates() -> None:
    with pytest.raises(pydantic.ValidationError):
        FaultPlan(rate_429=0.6, rate_500=0.6)
    with pytest.raises(pydantic.ValidationError):
        FaultPlan(rate_492=0.1)  # type: ignore[call-arg]
    with pytest.raises(pydantic.ValidationError):
        FaultPlan(rate_drop=-0.1)
    assert FaultPlan().pick(0.99) == "ok"


def test_port_needs_a_running_server() -> None:
    srv = TestServer()
    with pytest.raises(RuntimeError):
        _ = srv.port
    with srv:
        assert srv.base_url == f"http://127.0.0.1:{srv.port}/v1"


# -- happy paths ---------------------------------------------------------------------------


def test_plain_completion_fills_usage(server: TestServer) -> None:
    resp = chat(client_for(server))
    text = resp.choices[0].message.content
    assert resp.object == "chat.completion"
    assert resp.model == "m-testserver"
    assert resp.choices[0].message.role == "assistant"
    assert resp.choices[0].finish_reason == "stop"
    assert "Hello there, how are you today?" in text
    assert resp.usage is not None
    assert resp.usage.prompt_tokens == 6 + 4
    assert resp.usage.completion_tokens == len(text.split())
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens
    assert server.stats["ok"] == 1 and server.stats["requests"] == 1


def test_default_reply_is_deterministic_and_varies(server: TestServer) -> None:
    client = client_for(server)

    def ask(text: str, seed: int | None = None) -> str:
        messages = [{"role": "user", "content": text}]
        kwargs: dict[str, Any] = {} if seed is None else {"seed": seed}
        content = chat(client, messages=messages, **kwargs).choices[0].message.content
        assert isinstance(content, str)
        return content

    assert ask("tell me about cats") == ask("tell me about cats")
    prompts = [f"prompt number {i} about topic {i * 7}" for i in range(12)]
    replies = {ask(p) for p in prompts}
    assert len(replies) == len(prompts)
    templates = {ask("same words", seed=s).replace("same words", "") for s in range(20)}
    assert len(templates) > 1


def test_max_tokens_truncates(server: TestServer) -> None:
    resp = chat(client_for(server), max_tokens=3)
    assert len(resp.choices[0].message.content.split()) == 3
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage.completion_tokens == 3


def test_reply_callable_and_requests_recorded() -> None:
    def reply(body: dict[str, Any]) -> str:
        return f"echo {len(body['messages'])}"

    with TestServer(reply=reply) as srv:
        resp = chat(client_for(srv), temperature=0.3)
        assert resp.choices[0].message.content == "echo 1"
        (recorded,) = srv.requests
        assert recorded["temperature"] == 0.3
        assert "sk-secret-test" not in json.dumps(recorded)
        srv.reset()
        assert srv.requests == [] and srv.stats["requests"] == 0


class Mood(StrEnum):
    HAPPY = "happy"
    SAD = "sad"


class Turn(pydantic.BaseModel):
    speaker: Literal["client", "therapist"]
    text: str
    score: int = pydantic.Field(ge=3, le=9)


class Verdict(pydantic.BaseModel):
    mood: Mood
    confidence: float = pydantic.Field(gt=0.5, lt=1.0)
    done: bool
    note: str | None = None
    turns: list[Turn]
    best: Turn
    tags: list[str] = pydantic.Field(min_length=2)
    pair: tuple[int, str]
    extra: dict[str, int] = {}


def test_json_schema_reply_validates(server: TestServer) -> None:
    schema = Verdict.model_json_schema()
    response_format = {"type": "json_schema", "json_schema": {"name": "v", "schema": schema}}
    resp = chat(client_for(server), response_format=response_format)
    verdict = Verdict.model_validate_json(resp.choices[0].message.content)
    assert verdict.mood is Mood.HAPPY and verdict.done is True
    assert verdict.turns[0].score == 3


def test_sdk_parse_helper_round_trips(server: TestServer) -> None:
    completions = client_for(server).chat.completions
    parse = getattr(completions, "parse", None)
    if parse is None:  # older SDKs keep it under beta
        parse = client_for(server).beta.chat.completions.parse
    resp = parse(model="m", messages=USER, response_format=Verdict)
    assert isinstance(resp.choices[0].message.parsed, Verdict)


def test_json_object_reply(server: TestServer) -> None:
    resp = chat(client_for(server), response_format={"type": "json_object"})
    assert json.loads(resp.choices[0].message.content) == {}


def test_instance_from_schema_edge_cases() -> None:
    recursive = {
        "$defs": {"Node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/Node"}}}},
        "$ref": "#/$defs/Node",
    }
    assert isinstance(instance_from_schema(recursive), dict)
    assert instance_from_schema({"const": 7}) == 7
    assert instance_from_schema({"type": ["null", "integer"], "minimum": 4}) == 4
    assert instance_from_schema({"oneOf": [{"type": "null"}, {"type": "boolean"}]}) is True
    assert instance_from_schema({"type": "string", "format": "date"}) == "2024-01-01"
    assert instance_from_schema({"type": "array", "items": {"type": "number"}}) == [0.0]


def test_unresolvable_schema_is_a_bad_request(server: TestServer) -> None:
    schema = {"$ref": "#/$defs/Missing"}
    response_format = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    with pytest.raises(openai.BadRequestError):
        chat(client_for(server), response_format=response_format)


def test_stream_is_refused(server: TestServer) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        chat(client_for(server), stream=True)
    assert "stream" in info.value.message
    assert server.stats["bad_request"] == 1


def test_models_and_unknown_path() -> None:
    with TestServer(models=["a", "b"]) as srv:
        assert [m.id for m in client_for(srv).models.list()] == ["a", "b"]
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(srv.base_url + "/nope", timeout=5)
        assert info.value.code == 404
        assert json.loads(info.value.read())["error"]["code"] == "unknown_url"


# -- faults --------------------------------------------------------------------------------


def test_429_is_rate_limit_error_with_retry_after() -> None:
    plan = FaultPlan(rate_429=1.0, retry_after_s=0.25)
    with TestServer(plan) as srv, pytest.raises(openai.RateLimitError) as info:
        chat(client_for(srv))
    headers = info.value.response.headers
    assert headers["retry-after"] == "0.25"
    assert headers["retry-after-ms"] == "250"
    assert info.value.code == "rate_limit_exceeded"


def test_500_is_internal_server_error() -> None:
    with TestServer(FaultPlan(rate_500=1.0)) as srv, pytest.raises(openai.InternalServerError):
        chat(client_for(srv))


def test_drop_is_connection_error() -> None:
    plan = FaultPlan(rate_drop=1.0)
    with TestServer(plan) as srv, pytest.raises(openai.APIConnectionError) as info:
        chat(client_for(srv))
    assert not isinstance(info.value, openai.APITimeoutError)


def test_hang_is_timeout_error() -> None:
    # The server would hang for a minute; the client's 0.2 s timeout fires long before (the
    # bound is half the hang, not a speed threshold), and closing the server wakes the handler.
    with TestServer(FaultPlan(rate_hang=1.0, hang_s=60.0)) as srv:
        started = time.monotonic()
        with pytest.raises(openai.APITimeoutError):
            chat(client_for(srv, timeout=0.2))
        assert time.monotonic() - started < 30


def test_malformed_is_json_decode_error() -> None:
    # The SDK parses the body with response.json() and lets the decode error through.
    with TestServer(FaultPlan(rate_malformed=1.0)) as srv, pytest.raises(json.JSONDecodeError):
        chat(client_for(srv))


def test_empty_completion() -> None:
    with TestServer(FaultPlan(rate_empty=1.0)) as srv:
        resp = chat(client_for(srv))
    assert resp.choices[0].message.content == ""
    assert resp.usage.completion_tokens == 0


def test_stats_count_each_outcome() -> None:
    expected = {
        "429": (FaultPlan(rate_429=1.0), openai.RateLimitError),
        "500": (FaultPlan(rate_500=1.0), openai.InternalServerError),
        "drop": (FaultPlan(rate_drop=1.0), openai.APIConnectionError),
        "hang": (FaultPlan(rate_hang=1.0, hang_s=0.0), openai.APIConnectionError),
        "malformed": (FaultPlan(rate_malformed=1.0), json.JSONDecodeError),
    }
    with TestServer() as srv:
        client = client_for(srv)
        for plan, error in expected.values():
            srv.set_plan(plan)
            with pytest.raises(error):
                chat(client)
        srv.set_plan(FaultPlan(rate_empty=1.0))
        chat(client)
        srv.set_plan(FaultPlan())
        chat(client)
        client.embeddings.create(model="e", input="x")
        stats = srv.stats
    assert stats == {
        "requests": 8,
        "ok": 2,
        "429": 1,
        "500": 1,
        "drop": 1,
        "hang": 1,
        "malformed": 1,
        "empty": 1,
        "bad_request": 0,
        "trickle": 0,
    }


def outcome_sequence(seed: int, n: int = 40) -> list[str]:
    plan = FaultPlan(rate_429=0.2, rate_500=0.2, rate_drop=0.1, rate_empty=0.2, seed=seed)
    seen: list[str] = []
    with TestServer(plan) as srv:
        client = client_for(srv)
        for _ in range(n):
            try:
                resp = chat(client)
                seen.append("empty" if resp.choices[0].message.content == "" else "ok")
            except openai.APIStatusError as exc:
                seen.append(str(exc.status_code))
            except openai.APIConnectionError:
                seen.append("drop")
    return seen


def test_seed_makes_faults_reproducible() -> None:
    first = outcome_sequence(seed=1)
    assert first == outcome_sequence(seed=1)
    assert first != outcome_sequence(seed=2)
    assert set(first) == {"ok", "429", "500", "drop", "empty"}


# -- embeddings ----------------------------------------------------------------------------


def test_embeddings(server: TestServer) -> None:
    client = client_for(server)
    texts = ["the cat sat on the mat", "The cat sat on the mat!", "quantum finance rises sharply"]
    resp = client.embeddings.create(model="e", input=texts)  # the SDK asks for base64
    a, b, c = (d.embedding for d in resp.data)
    assert len(a) == 64
    assert a == b
    assert math.isclose(cosine(a, a), 1.0)
    assert abs(cosine(a, c)) < 0.2
    floats = client.embeddings.create(model="e", input=texts[0], encoding_format="float")
    assert floats.data[0].embedding == pytest.approx(a, abs=1e-6)
    assert resp.usage.prompt_tokens == 6 + 6 + 4
    assert resp.model == "e-testserver"


# -- throughput ----------------------------------------------------------------------------


def test_sustains_64_concurrent_requests() -> None:
    """The server answers 64 requests at once rather than one after another: with a latency far
    longer than it takes to start them all, all 64 are being answered at the same moment (a
    count the server keeps, not a wall-clock threshold; speed is benchmarks/throughput.py's)."""
    async def burst(base_url: str) -> None:
        client = openai.AsyncOpenAI(base_url=base_url, api_key="test", max_retries=0)
        async with anyio.create_task_group() as tg:
            for i in range(64):
                messages = [{"role": "user", "content": f"hello {i}"}]
                tg.start_soon(partial(client.chat.completions.create, model="m", messages=messages))
        await client.close()

    with TestServer(FaultPlan(latency_s=2.0)) as srv:
        anyio.run(burst, srv.base_url)
        assert srv.stats["ok"] == 64
        assert srv.max_in_flight == 64


def test_threads_share_one_client(server: TestServer) -> None:
    client = client_for(server)
    with ThreadPoolExecutor(16) as pool:
        replies = list(pool.map(lambda i: chat(client, seed=i).id, range(32)))
    assert len(set(replies)) == 32


# -- CLI -----------------------------------------------------------------------------------


def test_cli_rejects_bad_plan(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--rate-429", "0.7", "--rate-500", "0.7"]) == 2
    assert "sum" in capsys.readouterr().err


@pytest.mark.e2e
def test_cli_serves_until_interrupted() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "spasm.testing.server", "--port", "0", "--latency", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        base_url = proc.stdout.readline().strip()
        assert base_url.startswith("http://127.0.0.1:") and base_url.endswith("/v1")
        client = client_for(base_url)
        assert [m.id for m in client.models.list()] == ["test-model"]
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=5)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    assert json.loads(err.strip().splitlines()[-1])["ok"] == 1
