"""The backend interface: one async method, usage recorded on the returned object."""

from __future__ import annotations

import hashlib
import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Literal, NotRequired, TypedDict

from spasm.errors import FatalBackendError


class FunctionCall(TypedDict):
    """The function part of a tool call as the OpenAI protocol writes it."""

    name: str
    #: The arguments as JSON text.
    arguments: str


class ToolCallMessage(TypedDict):
    """One tool call of an ``assistant`` message (the OpenAI ``tool_calls`` items)."""

    id: str
    type: Literal["function"]
    function: FunctionCall


class Message(TypedDict):
    """One chat message as the OpenAI protocol takes it."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str
    #: The speaker of a ``user`` message in a group dialogue whose participants are named by
    #: the protocol's ``name`` field (``group.speaker_names: name_field``); absent otherwise.
    name: NotRequired[str]
    #: An ``assistant`` message that calls tools; absent otherwise.
    tool_calls: NotRequired[list[ToolCallMessage]]
    #: A ``tool`` message: the id of the call it answers.
    tool_call_id: NotRequired[str]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call a model asked for: its id, the tool's name and the arguments as JSON text
    (as the model wrote them: they may not parse, which the tool's result then says)."""

    id: str
    name: str
    arguments: str

    def message(self) -> ToolCallMessage:
        """The call as an ``assistant`` message's ``tool_calls`` item."""
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True, slots=True)
class CallContext:
    """Where in a dialogue a request comes from: the dialogue, the speaker and the index of
    the utterance it writes (and the dialogue's scenario, when it has one). Set by the agent
    that drafts an utterance; ``None`` on calls outside a turn (judge, personas). A backend
    may read it (the ``python`` backend hands it to the function); it never changes the reply's
    identity: it is left out of :meth:`ChatRequest.params` and :meth:`ChatRequest.cache_key`."""

    dialogue_id: str | None = None
    speaker: str | None = None
    turn_index: int | None = None
    scenario_id: str | None = None


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """Everything that determines a completion; its hash is the cache key."""

    messages: tuple[Message, ...]
    temperature: float
    max_tokens: int
    seed: int | None = None
    #: A JSON schema the reply must follow (structured output), or ``None`` for free text.
    json_schema: dict[str, Any] | None = None
    #: Distinguishes deliberate repeats of an identical request (e.g. re-sampling).
    sample_index: int = 0
    #: Names the append-only stream this request continues (e.g. one agent of one dialogue),
    #: so a backend with a local KV cache can keep one per stream. It never changes the reply:
    #: it is left out of :meth:`params` and :meth:`cache_key`.
    stream_key: str | None = field(default=None, compare=False)
    #: Where in a dialogue the request comes from (:class:`CallContext`); left out of
    #: :meth:`params` and :meth:`cache_key` like ``stream_key``.
    context: CallContext | None = field(default=None, compare=False)
    #: The tools the model may call, as the OpenAI protocol's ``tools`` items
    #: (``{"type": "function", "function": {"name", "description", "parameters"}}``), or
    #: ``None`` (a request without tools: no ``tools`` in its params or cache key).
    tools: tuple[dict[str, Any], ...] | None = None

    def params(self) -> dict[str, Any]:
        """The sampling parameters, as logged in the call table."""
        out: dict[str, Any] = {
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "seed": self.seed,
            "structured": self.json_schema is not None,
            "sample_index": self.sample_index,
        }
        if self.tools is not None:
            out["tools"] = [t["function"]["name"] for t in self.tools]
        return out

    def cache_key(self, identity: str) -> str:
        """sha256 over the backend identity and the exact request."""
        data: dict[str, Any] = {
            "backend": identity,
            "messages": list(self.messages),
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "seed": self.seed,
            "json_schema": self.json_schema,
            "sample_index": self.sample_index,
        }
        if self.tools is not None:  # without tools the key is what it always was
            data["tools"] = list(self.tools)
        blob = json.dumps(data, sort_keys=True, ensure_ascii=False).encode()
        return hashlib.sha256(blob).hexdigest()


@dataclass(slots=True)
class Completion:
    """A model's reply with the usage the backend reported."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    resolved_model: str
    finish_reason: str = "stop"
    latency_s: float = 0.0
    #: Prompt tokens the backend served from its prefix cache, as it reported them (0 when it
    #: reports none); billed at the backend's cached-token price.
    cached_tokens: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    #: The tool calls the model asked for instead of (or besides) writing text.
    tool_calls: tuple[ToolCall, ...] = ()
    #: The answer's rate headers (``x-ratelimit-*``: what the provider says is left of the key),
    #: read by :mod:`spasm.limits` to pace the backend; never cached or logged.
    rate_headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class EmbeddingRequest:
    """Texts to embed in one request (:meth:`Backend.embed`): what :mod:`spasm.calls` sends,
    retries and logs like a chat request. ``max_tokens`` and ``seed`` are there for the call
    path's pacing and log (an embedding generates no tokens and samples nothing)."""

    texts: tuple[str, ...]
    max_tokens: int = 0
    seed: int | None = None
    json_schema: dict[str, Any] | None = None

    def params(self) -> dict[str, Any]:
        """``calls.params`` of an embeddings request (:class:`~spasm.dataset.columns.CallParams`):
        temperature 0 and max_tokens 0, since it samples and generates nothing; its texts are
        in ``request_hash``."""
        return {"temperature": 0, "max_tokens": 0}

    def cache_key(self, identity: str) -> str:
        """sha256 over the backend identity and the texts (the call table's request hash)."""
        blob = json.dumps({"backend": identity, "embed": list(self.texts)}, ensure_ascii=False)
        return hashlib.sha256(blob.encode()).hexdigest()


@dataclass(slots=True)
class Embeddings:
    """One vector per text of an :class:`EmbeddingRequest`, in order, with the usage the
    backend reported (embeddings are priced by their prompt tokens)."""

    vectors: list[list[float]]
    prompt_tokens: int
    resolved_model: str
    latency_s: float = 0.0
    completion_tokens: int = 0
    cached_tokens: int = 0
    #: As :attr:`Completion.rate_headers`: read by :mod:`spasm.limits`, never logged.
    rate_headers: dict[str, str] = field(default_factory=dict)


class Backend(ABC):
    """A model that answers chat requests. Implementations raise :mod:`spasm.errors` types."""

    #: The backend's name in the run config.
    name: str
    #: The model name as configured.
    model: str
    #: How many requests may be in flight at once.
    max_concurrency: int = 1
    #: Whether a reply may be cached and replayed (:mod:`spasm.calls`): a model's reply is a
    #: function of the request; a ``python`` backend's only when its config says so.
    cacheable: bool = True
    #: A person answers (``kind: human``): the reply is typed text, not a model's tokens, so
    #: the caller counts it apart from the run's token totals, cost and caps (:mod:`spasm.calls`).
    typed_by_person: bool = False

    @property
    def identity(self) -> str:
        """What makes two backends interchangeable for caching (model and endpoint)."""
        return f"{type(self).__name__}:{self.model}"

    @property
    def structured_mode(self) -> str | None:
        """How structured requests are sent (``json_schema``, ``json_object``, ``text``);
        ``None`` while ``auto`` has not found a mode yet (no structured call so far)."""
        return None

    @property
    def structured_steps(self) -> list[dict[str, Any]]:
        """The modes the server rejected this run, in order, with its status and message."""
        return []

    @abstractmethod
    async def complete(self, request: ChatRequest) -> Completion:
        """Run one request, once (retries belong to :mod:`spasm.calls`)."""

    async def embed(self, request: EmbeddingRequest) -> Embeddings:
        """Embed ``request.texts``, once (retries belong to :mod:`spasm.calls`); a backend
        without an embeddings endpoint refuses (not retried)."""
        raise FatalBackendError(f"backend {self.name!r} ({type(self).__name__}) serves no embeddings")

    async def preflight(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Check at start-up that the backend can be used; raise UserError if not."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release connections or models."""
