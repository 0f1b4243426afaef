"""Evaluation of simulated dialogues: persona drift, echoing and persona separability.

Typical use::

    from spasm.evaluation import evaluate
    metrics = evaluate("runs/demo")            # writes runs/demo/eval/{metrics.json,report.html}
    print(metrics.echoing.overall.rate)

Modules, one per concern: :mod:`~spasm.evaluation.embeddings` (a package: the interface, one
module per model, the cache),
:mod:`~spasm.evaluation.loader` (run tables), :mod:`~spasm.evaluation.drift`,
:mod:`~spasm.evaluation.echoing` (the rule), :mod:`~spasm.evaluation.judge` (the LLM judge),
:mod:`~spasm.evaluation.llm` (how the probe and the judge reach a model: the engine's caller),
:mod:`~spasm.evaluation.summary` (rates and agreement), :mod:`~spasm.evaluation.separability`,
:mod:`~spasm.evaluation.lexical` and :mod:`~spasm.evaluation.diagnostics` (realism, gathered by
:mod:`~spasm.evaluation.realism`), :mod:`~spasm.evaluation.onset` (when echoing starts),
:mod:`~spasm.evaluation.consistency`, :mod:`~spasm.evaluation.ensemble` and
:mod:`~spasm.evaluation.judges` (LLM-judged consistency and judge ensembles),
:mod:`~spasm.evaluation.report` (its figures as data: :mod:`~spasm.evaluation.figures`),
:mod:`~spasm.dataset.importer`, :mod:`~spasm.evaluation.compare` and :mod:`~spasm.evaluation.cli`.

Public names are imported lazily (PEP 562): ``import spasm.evaluation.cli`` — which the
main CLI does at start-up — must not pay for numpy, scipy and matplotlib.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spasm.dataset.importer import export_spasm_jsonl, import_spasm_jsonl
    from spasm.evaluation.compare import comparison_text
    from spasm.evaluation.embeddings import (
        CachedEmbedder,
        Embedder,
        EmbeddingCache,
        LocalOnnxEmbedder,
        OpenAIEmbedder,
        SentenceTransformerEmbedder,
        available_embedders,
        create_embedder,
        register_embedder,
    )
    from spasm.evaluation.loader import Conversation, RunData, load_run
    from spasm.evaluation.metrics import Metrics
    from spasm.evaluation.pipeline import evaluate, load_metrics
    from spasm.evaluation.report import render_report, write_report

_WHERE = {
    "comparison_text": "compare",
    "CachedEmbedder": "embeddings",
    "Embedder": "embeddings",
    "EmbeddingCache": "embeddings",
    "LocalOnnxEmbedder": "embeddings",
    "OpenAIEmbedder": "embeddings",
    "SentenceTransformerEmbedder": "embeddings",
    "available_embedders": "embeddings",
    "create_embedder": "embeddings",
    "register_embedder": "embeddings",
    "export_spasm_jsonl": "spasm.dataset.importer",
    "import_spasm_jsonl": "spasm.dataset.importer",
    "Conversation": "loader",
    "RunData": "loader",
    "load_run": "loader",
    "Metrics": "metrics",
    "evaluate": "pipeline",
    "load_metrics": "pipeline",
    "render_report": "report",
    "write_report": "report",
}

__all__ = [
    "CachedEmbedder",
    "Conversation",
    "Embedder",
    "EmbeddingCache",
    "LocalOnnxEmbedder",
    "Metrics",
    "OpenAIEmbedder",
    "RunData",
    "SentenceTransformerEmbedder",
    "available_embedders",
    "comparison_text",
    "create_embedder",
    "evaluate",
    "export_spasm_jsonl",
    "import_spasm_jsonl",
    "load_metrics",
    "load_run",
    "register_embedder",
    "render_report",
    "write_report",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'spasm.evaluation' has no attribute {name!r}")
    path = module if "." in module else f"spasm.evaluation.{module}"
    value = getattr(importlib.import_module(path), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
