"""How evaluation talks to an LLM: a plain async callable, plus structured-output re-asking.

Evaluation does not depend on spasm's backend layer. Anything that maps
``(messages, temperature) -> text`` can drive the probe and the judge::

    async def chat(messages: list[dict[str, str]], temperature: float) -> str: ...

A ``ChatFn`` should raise :class:`spasm.errors.RunError` (or a subclass) for a failed
call it wants tolerated: such a failure counts as a fallback, anything else propagates.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from spasm.errors import BackendError, MissingKeyError, RunError

__all__ = ["ChatFn", "ask_structured", "openai_chat_fn"]

ChatFn = Callable[[list[dict[str, str]], float], Awaitable[str]]
"""``async (messages, temperature) -> completion text``."""

T = TypeVar("T", bound=BaseModel)

_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)


def _extract_json(text: str) -> Any:
    """Parse the JSON object in a reply, tolerating code fences and prose around it."""
    fenced = _FENCE.search(text)
    candidate = fenced.group(1) if fenced else text
    start, end = candidate.find("{"), candidate.rfind("}")
    if start == -1 or end <= start:
        raise ValueError("no JSON object found in the reply")
    return json.loads(candidate[start : end + 1])


async def ask_structured(
    chat: ChatFn,
    messages: list[dict[str, str]],
    model: type[T],
    *,
    temperature: float,
    retries: int = 1,
) -> tuple[T | None, int]:
    """Ask until the reply validates as ``model``; re-ask ``retries`` times with the error.

    Returns ``(parsed or None, number of calls made)``. ``None`` means the caller should
    fall back (malformed output after every re-ask, or a :class:`RunError` from ``chat``).
    """
    convo = list(messages)
    calls = 0
    for _ in range(retries + 1):
        calls += 1
        try:
            reply = await chat(convo, temperature)
        except RunError:
            return None, calls
        try:
            return model.model_validate(_extract_json(reply)), calls
        except (ValueError, ValidationError) as exc:  # JSONDecodeError is a ValueError
            convo = [
                *convo,
                {"role": "assistant", "content": reply},
                {
                    "role": "user",
                    "content": f"That reply could not be used: {exc}. Answer again with only "
                    "the JSON object, in exactly the requested format.",
                },
            ]
    return None, calls


def openai_chat_fn(
    *,
    model: str,
    base_url: str | None = None,
    api_key_env: str | None = "OPENAI_API_KEY",
    max_tokens: int = 400,
    timeout: float = 120.0,
    max_retries: int = 2,
) -> ChatFn:
    """A :data:`ChatFn` over any OpenAI-compatible chat endpoint (for ``--mode probe``/``--judge``).

    ``api_key_env`` is the *name* of the variable holding the key (``None``: no key needed).
    Failed calls (after the SDK's ``max_retries``) raise :class:`BackendError`, which the
    probe and the judge count as fallbacks.
    """
    import openai

    if api_key_env is None:
        key = "not-needed"
    else:
        key = os.environ.get(api_key_env, "")
        if not key:
            raise MissingKeyError(api_key_env, f"evaluation LLM ({model})")
    client = openai.AsyncOpenAI(base_url=base_url, api_key=key, timeout=timeout, max_retries=max_retries)

    async def chat(messages: list[dict[str, str]], temperature: float) -> str:
        try:
            response = await client.chat.completions.create(
                model=model,
                messages=messages,  # type: ignore[arg-type]
                temperature=temperature,
                max_tokens=max_tokens,
            )
        except openai.APIError as exc:
            raise BackendError(f"evaluation LLM {model!r} failed: {exc}") from exc
        return response.choices[0].message.content or ""

    return chat
