"""Any OpenAI-compatible endpoint through ``openai.AsyncOpenAI``.

The SDK's own retries are switched off (``max_retries=0``): spasm has one retry policy, in
:mod:`spasm.calls`, so retries are never stacked and every attempt appears in the call log.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import openai
from openai.types.chat import ChatCompletion

from spasm.backends.base import Backend, ChatRequest, Completion
from spasm.config import BackendConfig
from spasm.errors import (
    FatalBackendError,
    MissingKeyError,
    RateLimitedError,
    TransientBackendError,
    UserError,
)


def _retry_after(headers: Any) -> float | None:
    """Seconds the server asked us to wait (``retry-after-ms`` or ``retry-after``)."""
    if headers is None:
        return None
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            return max(0.0, float(value) * scale)
        except ValueError:
            continue  # an HTTP date: rare; fall back to our own backoff
    return None


def resolve_api_key(cfg: BackendConfig, name: str) -> str:
    """Read the key from the named environment variable; never log or store it."""
    if cfg.api_key_env is None:
        # Local servers (vLLM, llama.cpp, Ollama) accept any key; the SDK insists on one.
        return "not-needed"
    key = os.environ.get(cfg.api_key_env)
    if not key:
        raise MissingKeyError(cfg.api_key_env, name)
    return key


class OpenAIBackend(Backend):
    """A backend that speaks the OpenAI chat-completions protocol over HTTP."""

    def __init__(self, name: str, cfg: BackendConfig) -> None:
        self.name = name
        self.model = cfg.model
        self.cfg = cfg
        self.max_concurrency = cfg.max_concurrency
        self._client = openai.AsyncOpenAI(
            base_url=cfg.base_url,
            api_key=resolve_api_key(cfg, name),
            max_retries=0,
            timeout=cfg.timeout_s,
        )

    @property
    def identity(self) -> str:
        return f"openai:{self.cfg.base_url}:{self.model}"

    async def preflight(self) -> None:
        """Fail fast, before any file is written, if the endpoint cannot be reached."""
        try:
            await self._client.with_options(timeout=min(10.0, self.cfg.timeout_s)).models.list()
        except openai.AuthenticationError:
            raise UserError(
                f"Backend {self.name!r} at {self.cfg.base_url} rejected the API key "
                f"(from ${self.cfg.api_key_env}). Check the key in that variable."
            ) from None
        except openai.APIConnectionError as exc:
            raise UserError(
                f"Backend {self.name!r}: cannot connect to {self.cfg.base_url} "
                f"({exc.__cause__ or exc}). Is the server running and the URL right?"
            ) from None
        except openai.APIStatusError:
            pass  # reachable; some servers do not implement /models

    async def complete(self, request: ChatRequest) -> Completion:
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": list(request.messages),
            "temperature": request.temperature,
            "max_tokens": request.max_tokens,
        }
        if request.seed is not None:
            kwargs["seed"] = request.seed
        if request.json_schema is not None:
            kwargs["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "reply", "schema": request.json_schema},
            }
        start = time.perf_counter()
        try:
            # The SDK's documented raw path (``client.post``) skips its per-request parameter
            # transformation (~0.5 ms of CPU per call, a quarter of its cost: see
            # benchmarks/README.md); the body is already plain JSON, and the reply is parsed into
            # the same typed ChatCompletion.
            resp = await self._client.post("/chat/completions", body=kwargs, cast_to=ChatCompletion)
        except openai.RateLimitError as exc:
            raise RateLimitedError(
                f"429 from {self.name}: {exc.message}", retry_after=_retry_after(exc.response.headers)
            ) from exc
        except openai.APITimeoutError as exc:
            raise TransientBackendError(f"timeout after {self.cfg.timeout_s}s from {self.name}") from exc
        except openai.APIConnectionError as exc:
            raise TransientBackendError(f"connection error to {self.name}: {exc.__cause__ or exc}") from exc
        except openai.InternalServerError as exc:
            raise TransientBackendError(
                f"{exc.status_code} from {self.name}: {exc.message}", status=exc.status_code
            ) from exc
        except openai.APIStatusError as exc:
            if exc.status_code in (408, 409) or exc.status_code >= 500:
                raise TransientBackendError(
                    f"{exc.status_code} from {self.name}: {exc.message}", status=exc.status_code
                ) from exc
            raise FatalBackendError(
                f"{exc.status_code} from {self.name}: {exc.message}", status=exc.status_code
            ) from exc
        except (openai.APIResponseValidationError, json.JSONDecodeError, ValueError) as exc:
            raise TransientBackendError(f"malformed response body from {self.name}: {exc}") from exc
        latency = time.perf_counter() - start
        if not resp.choices:
            raise TransientBackendError(f"response from {self.name} has no choices")
        choice = resp.choices[0]
        usage = resp.usage
        return Completion(
            text=choice.message.content or "",
            prompt_tokens=usage.prompt_tokens if usage else 0,
            completion_tokens=usage.completion_tokens if usage else 0,
            resolved_model=resp.model or self.model,
            finish_reason=choice.finish_reason or "stop",
            latency_s=latency,
        )

    async def aclose(self) -> None:
        await self._client.close()
