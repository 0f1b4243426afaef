"""Training-ready data from a run: formats, QA scans with redaction, splits and a dataset card
(docs/export.md: ``spasm export`` / ``spasm qa`` / ``spasm card``).

==================  ===========================================================================
Module              What it owns
==================  ===========================================================================
``stream``          a run's dialogues one at a time, in bounded memory (through ``open_run``)
``scans``           the utterance QA scans (a registry of pure functions) and :func:`redact`
``dedup``           exact and near-duplicate dialogues (MinHash LSH from datasketch)
``qa``              ``spasm qa``: every scan over a run, findings to its ``qa`` table
``formats``         an example from a role's ECP perspective; openai / sharegpt / hf (a registry)
``check``           ``spasm export --check``: OpenAI's chat fine-tuning format checks
``select``          which dialogues an export keeps, and why the others were dropped
``split``           seeded persona-level train/validation/test splits
``card``            the card's statistics, each computed from the tables
``card_render``     the card's Markdown with the Hub's YAML header
``runcard``         ``spasm card``: the card of a whole run
``pipeline``        ``spasm export``: staged, streamed, moved into place whole
``cli``             the three sub-commands
==================  ===========================================================================

docs/export.md describes the output and every option.
"""

from __future__ import annotations

from spasm.export.check import CheckReport, check_openai_file
from spasm.export.formats import Example, FormatOptions, format_names, perspective, register_format
from spasm.export.pipeline import ExportOptions, ExportSummary, export_run
from spasm.export.qa import QAResult, QASummary, scan_run, write_qa
from spasm.export.runcard import run_card
from spasm.export.scans import Finding, Replacement, ScanContext, redact, register_scan, scan_text
from spasm.export.select import Selection
from spasm.export.split import assign_splits

__all__ = [
    "CheckReport",
    "Example",
    "ExportOptions",
    "ExportSummary",
    "Finding",
    "FormatOptions",
    "QAResult",
    "QASummary",
    "Replacement",
    "ScanContext",
    "Selection",
    "assign_splits",
    "check_openai_file",
    "export_run",
    "format_names",
    "perspective",
    "redact",
    "register_format",
    "register_scan",
    "run_card",
    "scan_run",
    "scan_text",
    "write_qa",
]
