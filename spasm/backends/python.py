"""Your agent under test as a backend: ``kind: python`` calls a Python function for each reply.

::

    backends:
      bot: {kind: python, target: "examples/responder.py:respond"}   # or "my_pkg.agent:respond"

The function is called as ``fn(messages, context)``:

* ``messages``: the agent's projected frame as a list of ``{"role", "content"}`` dicts, exactly
  what a model in its place would be sent (its system prompt first); a fresh copy each call;
* ``context``: an :class:`AgentContext` (read-only): the dialogue id, the speaker, the index of
  the utterance it writes, the request's seed, the scenario id when the dialogue has one, the
  sampling settings and, for a structured call (a judge, a harness layer), the JSON schema the
  reply must follow. Outside a turn (the persona stage, the judge) the dialogue fields are
  ``None``.

It returns the reply text: a ``str``, or, to report its token usage, a mapping or an object
with ``text`` and optionally ``prompt_tokens`` and ``completion_tokens``. In a run with tools
(``context.tools`` lists the ones it may call in this step) it may return
``{"tool_calls": [{"name", "arguments"}]}`` instead: the calls run, and the function is called
again with their results as ``tool`` messages, until it returns text. It may be ``async``.

Your code never runs on spasm's event loop, so no call outlives its bound (``timeout_s``) and
the process exits when the run is done: a plain function runs in a daemon thread of its own
per call, at most ``max_concurrency`` at once *counting calls that timed out and are still
running* (set ``max_concurrency: 1`` for a function that is not thread-safe); an ``async``
function runs on the backend's own event loop, in a daemon thread, so one that blocks its loop
(``time.sleep``, blocking I/O) makes its calls time out, says so, and leaves spasm's loop, its
timeouts and Ctrl-C/SIGTERM working. A call that timed out is abandoned (its thread is never
waited for). A ``SystemExit`` (``sys.exit()``) or ``KeyboardInterrupt`` your function raises
is its failure, never spasm's exit: a :class:`~spasm.errors.FatalBackendError` naming where it
was raised (the dialogue is quarantined).

It is called through :class:`~spasm.calls.Caller` like any backend: the call is limited,
logged in the ``calls`` table (latency, outcome, tokens when reported) and retried. An exception
it raises is a :class:`~spasm.errors.TransientBackendError` naming the target, the exception
and where it was raised (retried up to ``max_attempts``, then the dialogue is quarantined);
a :class:`~spasm.errors.BackendError` it raises is kept as is (raise
:class:`~spasm.errors.FatalBackendError` to skip the retries); a return that is not text is a
:class:`~spasm.errors.FatalBackendError`; a call longer than ``timeout_s`` a timeout. Replies are
not cached unless the config says ``deterministic: true`` (the reply depends on the messages
and the seed alone).

The target is imported when the backend is made (at the start of a run, before any call): a
missing file, module or function is a :class:`~spasm.errors.ConfigError` naming it (exit 2), and
so is a module that calls ``sys.exit()`` while it is imported.
A file target is loaded as a module of its own (``path/to/file.py``, relative to the working
directory); a module target must be importable (installed, or on ``PYTHONPATH``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import hashlib
import importlib
import importlib.util
import inspect
import json
import sys
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel

from spasm.backends.base import Backend, ChatRequest, Completion, ToolCall
from spasm.backends.registry import register_backend
from spasm.config import BackendConfig, check_target
from spasm.errors import (
    BackendError,
    ConfigError,
    ConnectionBackendError,
    FatalBackendError,
    TimeoutBackendError,
    TransientBackendError,
)
from spasm.tokens import count_tokens

__all__ = ["AgentContext", "AgentExit", "PythonBackend", "exit_text", "exited_on_import", "load_target",
           "off_loop"]


@dataclass(frozen=True, slots=True)
class AgentContext:
    """What a ``python`` backend's function is told besides the messages (read-only)."""

    #: The dialogue the call belongs to (``None`` outside a dialogue's turns).
    dialogue_id: str | None
    #: ``client`` or ``responder``: the side whose utterance is written.
    speaker: str | None
    #: The index of the utterance being written in the dialogue (0 is the first).
    turn_index: int | None
    #: The request's seed (the turn's, derived from the dialogue's seed).
    seed: int | None
    #: The dialogue's scenario, when it has one.
    scenario_id: str | None
    #: The sampling settings a model would get.
    temperature: float
    max_tokens: int
    #: For a structured call: the JSON schema the reply must follow (read-only); else ``None``.
    json_schema: Mapping[str, Any] | None = None
    #: The backend's name in the run config.
    backend: str = ""
    #: The tools the agent may call in this step, as OpenAI ``tools`` items (read-only; empty
    #: without tools). Return ``{"tool_calls": [{"name", "arguments"}]}`` to call them.
    tools: tuple[Mapping[str, Any], ...] = ()


def _frozen(value: Any) -> Any:
    """A read-only deep copy of a JSON value (mappings as ``MappingProxyType``, lists as tuples)."""
    if isinstance(value, Mapping):
        return MappingProxyType({k: _frozen(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(_frozen(v) for v in value)
    return value


def _where(exc: BaseException) -> str:
    """Where an exception was raised, as `` at file:line``: the file and line a SyntaxError
    names (its traceback ends in importlib's frozen frames), else the innermost frame outside
    importlib's own."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f" at {exc.filename}:{exc.lineno}" if exc.lineno else f" in {exc.filename}"
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith("<frozen ")]
    return f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""


def describe_error_site(exc: BaseException) -> str:
    """Where an exception was raised, as `` at file:line`` (empty when unknown)."""
    return _where(exc)


def exited_on_import(what: str, where: object, exc: SystemExit) -> ConfigError:
    """The error of a module that called ``sys.exit()`` while spasm imported it (a script's
    ``main()`` at module level): exit 2 naming it, never spasm exiting with its code."""
    return ConfigError(
        f"{what}: importing {where} called sys.exit({exc.code!r}){_where(exc)}: a module spasm "
        "imports must not exit. Put its script part under `if __name__ == \"__main__\":`.")


def _load_file(path: Path, target: str, backend: str) -> Any:
    return load_module_file(path, f"Backend {backend!r}: target {target!r}", wrap=False)


def load_module_file(path: Path, what: str, *, wrap: bool = True) -> Any:
    """Load a ``.py`` file as a module of its own (once per file and process); ``what`` names
    it in messages. A missing file is a ConfigError; with ``wrap``, so is any failure while
    the module runs (naming the exception and where it was raised)."""
    resolved = path.resolve()
    if not resolved.is_file():
        problem = "is not a file" if resolved.exists() else "does not exist"
        raise ConfigError(f"{what}: {path} {problem} (a relative path is read from the working "
                          f"directory, {Path.cwd()}).")
    digest = hashlib.sha256(str(resolved).encode()).hexdigest()[:12]
    name = f"_spasm_target_{resolved.stem}_{digest}"
    if name in sys.modules:  # one module per file and process (another backend, a rerun)
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, resolved)
    if spec is None or spec.loader is None:
        raise ConfigError(f"{what}: {path} cannot be loaded as a Python module.")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before running it: dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    except ConfigError:
        sys.modules.pop(name, None)
        raise
    except BaseException as exc:
        sys.modules.pop(name, None)
        if isinstance(exc, SystemExit):
            raise exited_on_import(what, path, exc) from None
        if wrap and isinstance(exc, Exception):
            raise ConfigError(f"{what}: importing {path} failed: {type(exc).__name__}: {exc}"
                              f"{_where(exc)}") from None
        raise
    return module


def load_target(target: str, backend: str = "python") -> Callable[..., Any]:
    """Import ``target`` (``package.module:function`` or ``path/to/file.py:function``) and
    return the function; anything that keeps it from loading is a ConfigError naming it."""
    try:
        where, _, attr = check_target(target).rpartition(":")
    except ValueError as exc:
        raise ConfigError(f"Backend {backend!r}: {exc}") from None
    try:
        if where.endswith(".py"):
            module = _load_file(Path(where), target, backend)
        else:
            module = importlib.import_module(where)
    except ConfigError:
        raise
    except SystemExit as exc:
        raise exited_on_import(f"Backend {backend!r}: target {target!r}", repr(where), exc
                               ) from None
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if where.endswith(".py") or not (where == missing or where.startswith(missing + ".")):
            # The target was found; a module it imports was not.
            raise ConfigError(
                f"Backend {backend!r}: target {target!r}: importing {where!r} failed: it imports "
                f"{exc.name!r}, which is not installed{_where(exc)}. Install it (in this "
                "environment), or fix that import.") from None
        raise ConfigError(
            f"Backend {backend!r}: target {target!r}: cannot import {where!r} ({exc}). Install it, "
            "put its folder on PYTHONPATH, or name the file: 'path/to/file.py:function'."
        ) from None
    except Exception as exc:  # the user's module failed while importing (a SyntaxError, ...)
        raise ConfigError(
            f"Backend {backend!r}: target {target!r}: importing {where!r} failed: "
            f"{type(exc).__name__}: {exc}{_where(exc)}"
        ) from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(
                f"Backend {backend!r}: target {target!r}: {where!r} has no {part!r}"
                + (f"; it defines {_public(module)}" if obj is module and _public(module) else "")
            )
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(f"Backend {backend!r}: target {target!r} is {_describe(obj)}, not a "
                          "function; name the function that replies.")
    return obj  # type: ignore[no-any-return]


def _public(module: Any) -> str:
    names = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
             and getattr(v, "__module__", None) == module.__name__]
    return ", ".join(sorted(names)[:8])


def _is_async(fn: Callable[..., Any]) -> bool:
    # A function, or an object whose __call__ is a coroutine function.
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)


def _count(value: Any, name: str, target: str) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise FatalBackendError(f"{target} reported {name}={value!r}; token counts are "
                                "non-negative integers")
    return value


class AgentExit(Exception):
    """A ``SystemExit`` or ``KeyboardInterrupt`` the agent's function raised during a call,
    carried as an ordinary exception: it ends that call (the agent's failure), never spasm."""

    def __init__(self, raised: BaseException) -> None:
        super().__init__(repr(raised))
        self.raised = raised


def _call_into(future: concurrent.futures.Future[Any], fn: Callable[..., Any],
               *args: Any) -> None:
    """Run ``fn(*args)`` (in a thread of its own) and leave the outcome in ``future``."""
    if not future.set_running_or_notify_cancel():
        return  # abandoned before it started
    try:
        result = fn(*args)
    except (SystemExit, KeyboardInterrupt) as exc:
        future.set_exception(AgentExit(exc))
    except BaseException as exc:
        future.set_exception(exc)
    else:
        future.set_result(result)


async def _guarded(awaitable: Awaitable[Any]) -> Any:
    """Await the agent's coroutine on its own loop; its SystemExit or KeyboardInterrupt would
    stop that loop (asyncio re-raises them), so they become :class:`AgentExit`."""
    try:
        return await awaitable
    except (SystemExit, KeyboardInterrupt) as exc:
        raise AgentExit(exc) from None


class AgentLoop:
    """An event loop of the agent's own, in a daemon thread: an ``async`` function runs here,
    so one that blocks its loop never blocks spasm's (whose timeouts then hold). The loop
    beats every :data:`BEAT_S`, so a call that timed out can tell a blocked loop."""

    BEAT_S = 0.25

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.beat = time.monotonic()
        self.thread = threading.Thread(target=self._run, name=f"spasm-agent-loop-{name}",
                                       daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._tick)
        self.loop.run_forever()

    def _tick(self) -> None:
        self.beat = time.monotonic()
        self.loop.call_later(self.BEAT_S, self._tick)

    def submit(self, awaitable: Awaitable[Any]) -> concurrent.futures.Future[Any]:
        return asyncio.run_coroutine_threadsafe(_guarded(awaitable), self.loop)

    def blocked_for(self) -> float:
        """Seconds the loop has not come round (0 when it runs)."""
        return max(0.0, time.monotonic() - self.beat - self.BEAT_S)

    def stop(self) -> None:
        """Stop the loop once it comes round (a blocked loop dies with the process)."""
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.loop.stop)


async def _outcome(future: concurrent.futures.Future[Any], on_done: Callable[[], None]) -> Any:
    """Wait for ``future`` without blocking spasm's loop; cancelled (a timeout), the call is
    abandoned: ``future`` is cancelled if it can be and never waited for. ``on_done`` runs on
    spasm's loop when the call really ends (even after it was abandoned)."""
    token = anyio.lowlevel.current_token()
    here = threading.get_ident()
    done = anyio.Event()

    def finished() -> None:
        done.set()
        on_done()

    def wake(_: concurrent.futures.Future[Any]) -> None:
        if threading.get_ident() == here:
            finished()
            return
        # RuntimeError: spasm's loop has ended (the run is over, nobody waits for this call).
        with contextlib.suppress(RuntimeError):
            anyio.from_thread.run_sync(finished, token=token)

    future.add_done_callback(wake)
    try:
        await done.wait()
    except BaseException:
        future.cancel()
        raise
    return future.result()


#: The event loops of async user code other than agents (tools), one per name.
_LOOPS: dict[str, AgentLoop] = {}


async def off_loop(fn: Callable[..., Any], *args: Any, name_: str = "spasm-user-code",
                   **kwargs: Any) -> Any:
    """Run the user's ``fn(*args, **kwargs)`` (a tool) off spasm's event loop, as
    :class:`PythonBackend` runs an agent: a plain function in a daemon thread of its own (named
    ``name_``), an ``async`` one on an :class:`AgentLoop` of that name (a tool that blocks its
    loop blocks no other). Cancelled (a timeout), the call is abandoned and never waited for, so
    it cannot keep the process alive or block spasm's loop; a ``SystemExit`` or
    ``KeyboardInterrupt`` it raises comes back as :class:`AgentExit`."""
    if _is_async(fn):
        loop = _LOOPS.get(name_)
        if loop is None:
            loop = _LOOPS[name_] = AgentLoop(name_)
        return await _outcome(loop.submit(fn(*args, **kwargs)), lambda: None)
    future: concurrent.futures.Future[Any] = concurrent.futures.Future()
    call = functools.partial(fn, *args, **kwargs)
    threading.Thread(target=_call_into, args=(future, call), name=name_, daemon=True).start()
    return await _outcome(future, lambda: None)


def exit_text(exc: AgentExit) -> str:
    """What the user's code did, as messages say it: "called sys.exit(0)" or "raised
    KeyboardInterrupt", with where."""
    raised = exc.raised
    what = (f"called sys.exit({raised.code!r})" if isinstance(raised, SystemExit)
            else f"raised {type(raised).__name__}")
    return what + _where(raised)


@register_backend("python")
class PythonBackend(Backend):
    """Calls a Python function for each reply (see the module docstring)."""

    def __init__(self, name: str, cfg: BackendConfig) -> None:
        if cfg.target is None:  # the config refuses this; a direct caller may not
            raise ConfigError(f"Backend {name!r}: a 'python' backend needs target")
        self.name = name
        self.model = cfg.model
        self.target = cfg.target
        self.max_concurrency = cfg.max_concurrency
        self.timeout_s = cfg.timeout_s
        self.cacheable = cfg.deterministic
        self.fn = load_target(cfg.target, name)
        self._async = _is_async(self.fn)
        #: Threads of plain functions running now, timed-out ones too (see the docstring): a
        #: limiter of the event loop that made it (a backend may serve more than one run).
        self._threads: tuple[object, anyio.CapacityLimiter] | None = None
        self._loop: AgentLoop | None = None

    @property
    def identity(self) -> str:
        return f"PythonBackend:{self.target}"

    def _context(self, request: ChatRequest) -> AgentContext:
        where = request.context
        return AgentContext(
            dialogue_id=where.dialogue_id if where else None,
            speaker=where.speaker if where else None,
            turn_index=where.turn_index if where else None,
            seed=request.seed,
            scenario_id=where.scenario_id if where else None,
            temperature=request.temperature,
            max_tokens=request.max_tokens,
            json_schema=None if request.json_schema is None else _frozen(request.json_schema),
            backend=self.name,
            tools=_frozen(list(request.tools)) if request.tools else (),
        )

    def _agent_loop(self) -> AgentLoop:
        if self._loop is None:
            self._loop = AgentLoop(self.name)
        return self._loop

    async def _invoke(self, messages: list[dict[str, Any]], context: AgentContext) -> Any:
        """Call the function off spasm's loop: on the agent's loop when async, else in a daemon
        thread of its own (see the module docstring)."""
        if self._async:
            return await _outcome(self._agent_loop().submit(self.fn(messages, context)),
                                  lambda: None)
        threads, borrower = self._limiter(), object()
        await threads.acquire_on_behalf_of(borrower)
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        try:
            threading.Thread(target=_call_into, args=(future, self.fn, messages, context),
                             name=f"spasm-agent-{self.name}", daemon=True).start()
        except BaseException:
            threads.release_on_behalf_of(borrower)
            raise
        result = await _outcome(future, lambda: threads.release_on_behalf_of(borrower))
        if inspect.isawaitable(result):  # a plain callable that hands back a coroutine
            result = await _outcome(self._agent_loop().submit(result), lambda: None)
        return result

    def _limiter(self) -> anyio.CapacityLimiter:
        token = anyio.lowlevel.current_token()
        if self._threads is None or self._threads[0] is not token.native_token:
            self._threads = (token.native_token, anyio.CapacityLimiter(self.max_concurrency))
        return self._threads[1]

    def _late(self) -> str:
        """What became of a call that did not return in time."""
        if not self._async:
            return ("; the call is abandoned: its thread runs on until the function returns, "
                    "holding one of its max_concurrency slots (spasm never waits for it)")
        if self._loop is not None and self._loop.blocked_for() >= 1.0:
            return (f"; its event loop has been blocked for {self._loop.blocked_for():.0f}s (an "
                    "async function must not call blocking code such as time.sleep or blocking "
                    "I/O: await it, or make the function a plain one, which runs in a thread)")
        return ""

    async def aclose(self) -> None:
        if self._loop is not None:
            self._loop.stop()
            self._loop = None

    async def complete(self, request: ChatRequest) -> Completion:
        """One call of the function; its failures mapped to :mod:`spasm.errors` classes."""
        # A fresh copy: what the function does to it never reaches the dialogue.
        messages = [_plain(m) for m in request.messages]
        t0 = time.perf_counter()
        result: Any = None
        try:
            with anyio.move_on_after(self.timeout_s) as scope:
                result = await self._invoke(messages, self._context(request))
        except TimeoutError as exc:
            raise TimeoutBackendError(f"{self.target} raised TimeoutError: {exc}{_where(exc)}") from exc
        except AgentExit as exc:
            raise FatalBackendError(
                f"{self.target} {exit_text(exc)} during a call: an agent returns its reply "
                "or raises an exception; spasm does not exit on its behalf") from None
        except BackendError:
            raise  # the function chose the kind of failure (fatal, rate limited ...)
        except ConnectionError as exc:
            raise ConnectionBackendError(
                f"{self.target} raised {type(exc).__name__}: {exc}{_where(exc)}") from exc
        except Exception as exc:  # the agent's bug or its own dependency failing: retried
            raise TransientBackendError(
                f"{self.target} raised {type(exc).__name__}: {exc}{_where(exc)}") from exc
        if scope.cancelled_caught:
            raise TimeoutBackendError(f"{self.target} did not return within timeout_s="
                                      f"{self.timeout_s:g}s (backend {self.name!r}){self._late()}")
        return held_to(self._completion(result, time.perf_counter() - t0), request.max_tokens)

    def _completion(self, result: Any, latency: float) -> Completion:
        """Read what the function returned: text, or text with its token usage."""
        if isinstance(result, str):
            return Completion(text=result, prompt_tokens=0, completion_tokens=0,
                              resolved_model=self.model, latency_s=latency)
        calls: tuple[ToolCall, ...] = ()
        if isinstance(result, Mapping) and "tool_calls" in result:
            calls = self._calls(result["tool_calls"])
            result = {**result, "text": result.get("text") or ""}
        if isinstance(result, Mapping):
            text, prompt, completion = (result.get("text"), result.get("prompt_tokens"),
                                        result.get("completion_tokens"))
        else:
            text = getattr(result, "text", None)
            prompt = getattr(result, "prompt_tokens", None)
            completion = getattr(result, "completion_tokens", None)
        if not isinstance(text, str):
            raise FatalBackendError(
                f"{self.target} returned {_describe(result)}, not the reply: return a str, or a "
                "mapping or object with a 'text' str (and optionally 'prompt_tokens' and "
                "'completion_tokens')")
        return Completion(
            text=text, prompt_tokens=_count(prompt, "prompt_tokens", self.target),
            completion_tokens=_count(completion, "completion_tokens", self.target),
            resolved_model=self.model, latency_s=latency, tool_calls=calls,
        )

    def _calls(self, raw: Any) -> tuple[ToolCall, ...]:
        """``{"tool_calls": [{"name", "arguments"}]}`` as tool calls (the agent gives them ids
        when they have none); anything else is a FatalBackendError saying the shape."""
        shape = ('return {"tool_calls": [{"name": "<tool>", "arguments": {...}}]} (arguments a '
                 "mapping or JSON text)")
        if not isinstance(raw, list | tuple) or not raw:
            raise FatalBackendError(f"{self.target} returned tool_calls={_describe(raw)}; {shape}")
        out = []
        for c in raw:
            if not isinstance(c, Mapping) or not isinstance(c.get("name"), str):
                raise FatalBackendError(f"{self.target} returned a tool call {_describe(c)}; {shape}")
            arguments = c.get("arguments", {})
            try:
                text = arguments if isinstance(arguments, str) else json.dumps(arguments)
            except (TypeError, ValueError) as exc:
                raise FatalBackendError(f"{self.target}: the arguments of {c['name']!r} are not "
                                        f"JSON ({exc}); {shape}") from None
            out.append(ToolCall(str(c.get("id") or ""), c["name"], text))
        return tuple(out)


def _plain(m: Mapping[str, Any]) -> dict[str, Any]:
    """A message as the function gets it: role and content, and a tool step's ``tool_calls``
    and ``tool_call_id`` when it has them (a fresh copy)."""
    out: dict[str, Any] = {"role": m["role"], "content": m["content"]}
    if "tool_calls" in m:
        out["tool_calls"] = json.loads(json.dumps(m["tool_calls"]))
    if "tool_call_id" in m:
        out["tool_call_id"] = m["tool_call_id"]
    return out


def held_to(completion: Completion, max_tokens: int | None) -> Completion:
    """The reply cut to ``max_tokens`` tokens (:func:`spasm.tokens.count_tokens`), as a model's
    would be (``finish_reason`` ``length``, ``completion_tokens`` the tokens kept): code that
    returns more than a turn may hold never stores it whole."""
    text = completion.text
    if max_tokens is None or len(text) <= max_tokens:  # a token holds at least one character
        return completion
    window = max_tokens * 64  # and, in a reply, at most a few dozen
    if len(text) <= window and count_tokens(text) <= max_tokens:
        return completion
    # The longest prefix within max_tokens.
    low, high = 0, min(len(text), window)
    while low < high:
        mid = (low + high + 1) // 2
        if count_tokens(text[:mid]) <= max_tokens:
            low = mid
        else:
            high = mid - 1
    kept = text[:low]
    return replace(completion, text=kept, finish_reason="length",
                   completion_tokens=count_tokens(kept))


def _describe(value: Any) -> str:
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:59] + "…"
    kind = type(value).__name__
    return f"{'an' if kind[0] in 'aeiouAEIOU' else 'a'} {kind} ({shown})"
