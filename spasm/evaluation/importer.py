"""Convert the public SPASM release (JSONL) into spasm's run tables, and back.

A release record looks like::

    {"persona_id": "p001", "conversation_id": "c0001",
     "persona_fields": {"age": 42, "occupation": "nurse", ...},
     "persona_description": "You are a 42-year-old nurse ...",
     "turns": [{"speaker": "client", "turn_index": 0, "text": "..."},
               {"speaker": "tested", "turn_index": 1, "text": "..."}],
     "termination_reason": "natural"}

``tested`` becomes ``responder``. ``condition`` and ``pairing`` come from the record when it
has them, otherwise from the caller (``spasm import --condition/--pairing``). The original
``persona_fields`` are kept verbatim (``persona_fields_json``) so that
:func:`export_spasm_jsonl` gives the records back.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from spasm.errors import UserError
from spasm.evaluation.files import atomic_write_parquet, atomic_write_text

__all__ = ["ImportSummary", "export_spasm_jsonl", "import_spasm_jsonl"]

_SPEAKERS = {
    "client": "client",
    "user": "client",
    "persona": "client",
    "tested": "responder",
    "responder": "responder",
    "assistant": "responder",
    "agent": "responder",
}
# Release field names -> our personas columns.
_FIELD_ALIASES = {
    "location": "city",
    "interaction_domain": "domain",
    "topic": "domain",
    "concerns": "concern",
    "emotion_intensity": "intensity",
    "motivations": "motivation",
    "job": "occupation",
}
_PERSONA_COLUMNS = [
    "persona_id",
    "name",
    "age",
    "occupation",
    "city",
    "domain",
    "concern",
    "motivation",
    "emotion",
    "intensity",
    "verbosity",
    "directness",
    "cooperativeness",
    "formality",
    "card",
]
_DIALOGUE_COLUMNS = [
    "dialogue_id",
    "persona_id",
    "conversation_index",
    "condition",
    "harness_level",
    "pairing",
    "client_backend",
    "client_model",
    "responder_backend",
    "responder_model",
    "seed",
    "n_utterances",
    "termination_reason",
    "status",
]


class ImportSummary(dict[str, Any]):
    """Counts and paths of an import (a plain dict, also written to manifest.json)."""


def _records(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    with path.open(encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UserError(f"{path}:{line_no} is not valid JSON ({exc.msg}).") from exc
            if not isinstance(record, dict):
                raise UserError(f"{path}:{line_no} is not a JSON object.")
            yield line_no, record


def _scalar(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "; ".join(str(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False, sort_keys=True)
    return "" if value is None else str(value)


def _flatten_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in fields.items():
        name = _FIELD_ALIASES.get(str(key).lower(), str(key).lower())
        if isinstance(value, dict) and name in {
            "style",
            "behavioral_style",
            "behavioural_style",
            "behaviour",
            "behavior",
        }:
            for sub, v in value.items():
                flat[_FIELD_ALIASES.get(str(sub).lower(), str(sub).lower())] = _scalar(v)
        elif name == "age":
            try:
                flat["age"] = int(value)
            except (TypeError, ValueError):
                flat["age"] = None
        else:
            flat[name] = _scalar(value)
    return flat


def import_spasm_jsonl(
    path: str | Path,
    out_dir: str | Path,
    *,
    condition: str = "ecp",
    pairing: str = "unknown",
    overwrite: bool = False,
) -> ImportSummary:
    """Write personas/dialogues/turns Parquet tables and manifest.json from a release JSONL.

    Args:
        path: the JSONL file (one conversation per line).
        out_dir: the run directory to create.
        condition: for records without a ``condition`` field.
        pairing: for records without a ``pairing`` field.
        overwrite: replace tables already in ``out_dir``.

    Raises:
        UserError: the file is missing or malformed, or ``out_dir`` already holds a run.
    """
    src = Path(path)
    out = Path(out_dir)
    if not src.is_file():
        raise UserError(f"{src} does not exist; pass the path of a SPASM release .jsonl file.")
    condition = condition.lower()
    if condition not in ("ecp", "concat"):
        raise UserError(f"Unknown condition {condition!r}; use --condition ecp or concat.")
    existing = [t for t in ("personas", "dialogues", "turns") if (out / f"{t}.parquet").exists()]
    if existing and not overwrite:
        raise UserError(
            f"{out} already holds {', '.join(existing)}; choose another --out or "
            "pass --force to replace them."
        )

    personas: dict[str, dict[str, Any]] = {}
    dialogues: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    per_persona: Counter[str] = Counter()
    seen: dict[str, int] = {}
    for line_no, rec in _records(src):
        where = f"{src}:{line_no}"
        for key in ("persona_id", "conversation_id", "turns"):
            if key not in rec:
                raise UserError(f"{where} has no {key!r}; is this a SPASM release file?")
        pid = str(rec["persona_id"])
        did = str(rec["conversation_id"])
        if did in seen:
            raise UserError(f"{where} repeats conversation_id {did!r} (first on line {seen[did]}).")
        seen[did] = line_no
        fields = rec.get("persona_fields") or {}
        if not isinstance(fields, dict):
            raise UserError(f"{where}: persona_fields must be an object.")
        if pid not in personas:
            row: dict[str, Any] = {c: "" for c in _PERSONA_COLUMNS}
            row["age"] = None
            row.update(_flatten_fields(fields))
            row["persona_id"] = pid
            row["card"] = str(rec.get("persona_description") or "")
            row["persona_fields_json"] = json.dumps(fields, ensure_ascii=False)
            personas[pid] = row
        raw_turns = rec["turns"]
        if not isinstance(raw_turns, list):
            raise UserError(f"{where}: turns must be a list.")
        ordered = sorted(
            enumerate(raw_turns),
            key=lambda it: (
                it[1].get("turn_index", it[0]) if isinstance(it[1], dict) else it[0],
                it[0],
            ),
        )
        for new_index, (_, turn) in enumerate(ordered):
            if not isinstance(turn, dict) or "speaker" not in turn or "text" not in turn:
                raise UserError(f"{where}: every turn needs 'speaker' and 'text'.")
            speaker = _SPEAKERS.get(str(turn["speaker"]).lower())
            if speaker is None:
                raise UserError(
                    f"{where}: unknown speaker {turn['speaker']!r}; expected 'client' or 'tested'."
                )
            turns.append(
                {
                    "dialogue_id": did,
                    "turn_index": new_index,
                    "speaker": speaker,
                    "text": str(turn["text"] or ""),
                }
            )
        index = rec.get("conversation_index")
        dialogues.append(
            {
                "dialogue_id": did,
                "persona_id": pid,
                "conversation_index": int(index) if isinstance(index, int) else per_persona[pid],
                "condition": str(rec.get("condition") or condition).lower(),
                "harness_level": str(rec.get("harness_level") or ""),
                "pairing": str(rec.get("pairing") or pairing),
                "client_backend": str(rec.get("client_backend") or ""),
                "client_model": str(rec.get("client_model") or ""),
                "responder_backend": str(rec.get("responder_backend") or rec.get("tested_backend") or ""),
                "responder_model": str(rec.get("responder_model") or rec.get("tested_model") or ""),
                "seed": int(rec["seed"]) if isinstance(rec.get("seed"), int) else 0,
                "n_utterances": len(raw_turns),
                "termination_reason": str(rec.get("termination_reason") or ""),
                "status": "ok",
            }
        )
        per_persona[pid] += 1
    if not dialogues:
        raise UserError(f"{src} holds no records.")

    persona_df = pd.DataFrame(list(personas.values()))
    persona_df["age"] = pd.array(
        [
            None if a is None or (isinstance(a, float) and math.isnan(a)) else int(a)
            for a in persona_df["age"]
        ],
        dtype="Int64",
    )
    for column in persona_df.columns:
        if column != "age":
            persona_df[column] = persona_df[column].fillna("").astype(str)
    dialogue_df = pd.DataFrame(dialogues, columns=_DIALOGUE_COLUMNS)
    turn_df = pd.DataFrame(turns, columns=["dialogue_id", "turn_index", "speaker", "text"])
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_parquet(persona_df, out / "personas.parquet")
    atomic_write_parquet(dialogue_df, out / "dialogues.parquet")
    atomic_write_parquet(turn_df, out / "turns.parquet")
    summary = ImportSummary(
        kind="import",
        source=str(src),
        source_sha256=hashlib.sha256(src.read_bytes()).hexdigest(),
        imported_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        defaults={"condition": condition, "pairing": pairing},
        counts={"personas": len(persona_df), "dialogues": len(dialogue_df), "turns": len(turn_df)},
        tables=["personas.parquet", "dialogues.parquet", "turns.parquet"],
    )
    atomic_write_text(out / "manifest.json", json.dumps(summary, indent=2) + "\n")
    return summary


def export_spasm_jsonl(run_dir: str | Path, path: str | Path) -> int:
    """Write a run directory's dialogues as SPASM-release JSONL; returns the record count.

    The inverse of :func:`import_spasm_jsonl` (``responder`` becomes ``tested``; the
    original ``persona_fields`` are used when the personas table kept them).
    """
    from spasm.evaluation.loader import load_run

    data = load_run(run_dir)
    personas = data.persona_rows()
    rows = {str(r["dialogue_id"]): r for r in data.dialogues.to_dict("records")}
    lines = []
    for conv in data.conversations:
        row = rows[conv.dialogue_id]
        p = personas.get(conv.persona_id, {})
        raw = p.get("persona_fields_json")
        if isinstance(raw, str) and raw:
            fields = json.loads(raw)
        else:
            fields = {
                k: v
                for k, v in p.items()
                if k not in ("persona_id", "card") and not (isinstance(v, float) and math.isnan(v))
            }
        record = {
            "persona_id": conv.persona_id,
            "conversation_id": conv.dialogue_id,
            "persona_fields": fields,
            "persona_description": str(p.get("card") or ""),
            "turns": [
                {"speaker": "client" if s == "client" else "tested", "turn_index": i, "text": t}
                for i, (s, t) in enumerate(zip(conv.speakers, conv.texts, strict=True))
            ],
            "termination_reason": str(row.get("termination_reason") or ""),
        }
        lines.append(json.dumps(record, ensure_ascii=False, default=str))
    atomic_write_text(path, "\n".join(lines) + ("\n" if lines else ""))
    return len(lines)
