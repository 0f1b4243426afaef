"""Conversations from files into a run directory: the public SPASM release (JSONL, and back),
and people's conversations with a model (ShareGPT JSON/JSONL, OpenAI messages JSONL) as a run
with human seats (:func:`import_conversations`).

A release record, as the release's dataset card documents it::

    {"persona_id": "P-001", "conversation_id": 0,
     "persona_fields": {"age": 42, "occupation": "nurse", "location": "Leeds", ...},
     "persona_description": "You are a 42-year-old nurse ...",
     "turns": [{"speaker": "client", "turn_index": 0, "text": "..."},
               {"speaker": "tested", "turn_index": 1, "text": "..."}],
     "termination_reason": "natural"}

``conversation_id`` numbers a persona's conversations (0–9 in the release): the pair
(``persona_id``, ``conversation_id``) is unique, not ``conversation_id`` alone. The dialogue id
is ``<persona_id>-k<conversation_id>`` and ``conversation_index`` is the number (a string id is
kept as the dialogue id's tail, and the index counts that persona's conversations in file
order). ``tested`` becomes ``responder``. ``condition`` and ``pairing`` come from the record
when it has them, otherwise from the caller (``spasm import --condition/--pairing``).

Persona fields map to the columns every spasm run has (docs/format.md has the table); the
original ``persona_fields`` are kept verbatim in the ``persona_fields`` column, so
:func:`export_spasm_jsonl` gives the records back, and fields with no column are not lost.
The tables are written through :class:`~spasm.dataset.store.RunStore`, staged beside the
target and moved in whole: a failed import leaves nothing behind, and ``--force`` replaces an
earlier import only once the new one is complete.
"""

from __future__ import annotations

import datetime as dt
import json
import unicodedata
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, cast

from spasm.dataset.files import atomic_write_text
from spasm.dataset.integrity import file_sha256
from spasm.dataset.outputs import check_output, finish_replacement
from spasm.dataset.persona_rows import persona_of, persona_record
from spasm.dataset.rows import SCHEMA_VERSION, DialogueRow, TurnRow
from spasm.dataset.store import write_finished_run
from spasm.errors import UserError
from spasm.jsontext import JSONProblem, read_json_object
from spasm.personas.persona import Persona
from spasm.registry import PROJECTIONS, ordered_conditions

__all__ = ["FIELD_ALIASES", "FORMATS", "detect_format", "export_spasm_jsonl", "import_conversations",
           "import_spasm_jsonl", "persona_columns"]

_SPEAKERS = {
    "client": "client", "user": "client", "persona": "client",
    "tested": "responder", "responder": "responder", "assistant": "responder", "agent": "responder",
}
#: Release (and common) persona field names -> spasm's persona columns.
FIELD_ALIASES = {
    "name": "first_name",
    "location": "city",
    "interaction_domain": "domain",
    "topic": "domain",
    "concerns": "concern",
    "emotion_intensity": "intensity",
    "motivations": "motivation",
    "job": "occupation",
}
_STYLE_KEYS = {"style", "behavioral_style", "behavioural_style", "behaviour", "behavior"}
MAX_LINE_BYTES = 16 * 1024 * 1024


def _scalar(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, list | tuple):
        return "; ".join(str(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False, sort_keys=True)
    return str(value)


def persona_columns(fields: Mapping[str, Any], columns: list[str], integer: set[str]) -> dict[str, Any]:
    """Map a persona's fields (release names, nested style) onto the personas columns.

    Fields without a column are dropped here (the caller keeps the original record).
    """
    flat: dict[str, Any] = {}
    for key, value in fields.items():
        name = FIELD_ALIASES.get(str(key).lower(), str(key).lower())
        if isinstance(value, dict) and name in _STYLE_KEYS:
            for sub, v in value.items():
                flat[FIELD_ALIASES.get(str(sub).lower(), str(sub).lower())] = _scalar(v)
        else:
            flat[name] = value
    out: dict[str, Any] = {}
    for column in columns:
        value = flat.get(column)
        if column in integer:
            try:
                out[column] = None if value is None or isinstance(value, bool) else int(value)
            except (TypeError, ValueError):
                out[column] = None
        else:
            out[column] = _scalar(value)
    return out



def _json_object(text: str, path: Path, line_no: int, *, document: bool = False) -> dict[str, Any]:
    """``text`` (line ``line_no`` of ``path``, or with ``document`` the whole file) as a JSON
    object, or a :class:`UserError` naming where it is not one (a syntax error of a whole
    document at its own line)."""
    try:
        return read_json_object(text)
    except JSONProblem as problem:
        where = problem.line if document and problem.kind == "syntax" else line_no
        raise UserError(f"{path}:{where} {'' if problem.kind == 'limits' else 'is '}"
                        f"{problem.reason}.") from None

def _records(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    try:
        fh = path.open("rb")
    except OSError as exc:
        raise UserError(f"Cannot read {path}: {exc.strerror}.") from None
    with fh:
        for line_no, raw in enumerate(fh, start=1):
            if len(raw) > MAX_LINE_BYTES:
                raise UserError(f"{path}:{line_no} is longer than {MAX_LINE_BYTES} bytes; "
                                "is this a JSONL file?")
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise UserError(f"{path}:{line_no} is not UTF-8 text; is this a JSONL file?") from None
            if not line.strip():
                continue
            yield line_no, _json_object(line, path, line_no)


def _conversation_key(value: Any, where: str) -> tuple[str, int | None]:
    """(dialogue-id tail, conversation index or None) of a release ``conversation_id``."""
    if isinstance(value, bool) or not isinstance(value, int | str) or str(value).strip() == "":
        raise UserError(f"{where}: conversation_id must be an integer or a non-empty string.")
    text = str(value).strip()
    if isinstance(value, int) or (text.isascii() and text.isdigit()):
        index = int(text)
        if not _INT32[0] <= index <= _INT32[1]:
            raise UserError(f"{where}: conversation_id {_short(text)} is out of range (a "
                            f"conversation number is at most {_INT32[1]:,}); number them 0, 1, 2, …")
        return f"k{index}", index
    return text, None


#: The ranges of the columns integers land in (``conversation_index``; ``seed`` and integer
#: persona fields), so a value too big for them is the input's error, not a traceback.
_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)


def _short(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _check_integers(row: Mapping[str, Any], integer: set[str], where: str) -> None:
    """Refuse integer persona fields that no 64-bit column holds (an age of 10^30)."""
    for column in sorted(integer):
        value = row.get(column)
        if isinstance(value, int) and not _INT64[0] <= value <= _INT64[1]:
            raise UserError(f"{where}: persona field {column!r} = {_short(str(value))} is out of "
                            "range for an integer; fix the record.")


def _turn_rows(did: str, raw_turns: Any, where: str) -> list[TurnRow]:
    if not isinstance(raw_turns, list) or not raw_turns:
        raise UserError(f"{where}: turns must be a non-empty list.")
    if not all(isinstance(t, dict) and "speaker" in t and "text" in t for t in raw_turns):
        raise UserError(f"{where}: every turn needs 'speaker' and 'text'.")
    ordered = sorted(enumerate(raw_turns), key=lambda it: (
        it[1]["turn_index"] if isinstance(it[1].get("turn_index"), int) else it[0], it[0]))
    rows = []
    for index, (_, turn) in enumerate(ordered):
        speaker = _SPEAKERS.get(str(turn["speaker"]).lower())
        if speaker is None:
            raise UserError(f"{where}: unknown speaker {turn['speaker']!r}; expected 'client' or 'tested'.")
        rows.append(TurnRow(dialogue_id=did, turn_index=index, speaker=speaker,
                            text=str(turn["text"] or "")))
    return rows


def _str(rec: Mapping[str, Any], *keys: str, default: str = "") -> str:
    return next((str(rec[k]) for k in keys if rec.get(k) not in (None, "")), default)


def import_spasm_jsonl(
    path: str | Path,
    out_dir: str | Path,
    *,
    condition: str = "ecp",
    pairing: str = "unknown",
    overwrite: bool = False,
) -> dict[str, Any]:
    """Write a run directory (personas, dialogues, turns, manifest) from a release JSONL file.

    Returns the import summary (also the run's manifest.json).

    Raises:
        UserError: the file is missing or malformed (with its line), a (persona_id,
            conversation_id) pair repeats, or ``out_dir`` already holds data.
    """
    from spasm.personas.schema import load_schema

    src, out = Path(path), Path(out_dir)
    if not src.is_file():
        raise UserError(f"{src} does not exist; pass the path of a SPASM release .jsonl file.")
    condition = condition.lower()
    if condition not in PROJECTIONS:  # a built-in condition or a plugin's projection
        raise UserError(f"Unknown condition {condition!r}; use --condition with one of: "
                        f"{', '.join(ordered_conditions(PROJECTIONS.names()))}.")
    _check_target(out, overwrite)
    schema = load_schema(None)
    columns, integer = schema.field_names, schema.integer_fields()
    personas: dict[str, Persona] = {}
    dialogues: list[DialogueRow] = []
    turns: list[TurnRow] = []
    per_persona: Counter[str] = Counter()
    seen: dict[tuple[str, str], int] = {}
    for line_no, rec in _records(src):
        where = f"{src}:{line_no}"
        for key in ("persona_id", "conversation_id", "turns"):
            if key not in rec:
                raise UserError(f"{where} has no {key!r}; is this a SPASM release file?")
        pid = _persona_id(rec["persona_id"], where)
        tail, index = _conversation_key(rec["conversation_id"], where)
        if (pid, tail) in seen:
            raise UserError(f"{where} repeats persona_id {pid!r} with conversation_id "
                            f"{rec['conversation_id']!r} (first on line {seen[(pid, tail)]}).")
        seen[(pid, tail)] = line_no
        fields = rec.get("persona_fields") or {}
        if not isinstance(fields, dict):
            raise UserError(f"{where}: persona_fields must be an object.")
        if pid not in personas:
            mapped = persona_columns(fields, columns, integer)
            _check_integers(mapped, integer, where)
            personas[pid] = Persona(
                id=pid, index=len(personas), fields=mapped,
                card=str(rec.get("persona_description") or ""), card_source="import",
                source_fields=json.dumps(fields, ensure_ascii=False))
        did = f"{pid}-{tail}"
        rows = _turn_rows(did, rec["turns"], where)
        seed = rec.get("seed")
        if isinstance(seed, int) and not isinstance(seed, bool) and not _INT64[0] <= seed <= _INT64[1]:
            raise UserError(f"{where}: seed {_short(str(seed))} is out of range (a 64-bit integer).")
        turns.extend(rows)
        dialogues.append(DialogueRow(
            dialogue_id=did, persona_id=pid,
            conversation_index=index if index is not None else per_persona[pid],
            condition=_str(rec, "condition", default=condition).lower(),
            harness_level=_str(rec, "harness_level", default="A"),
            pairing=_str(rec, "pairing", default=pairing),
            client_backend=_str(rec, "client_backend"), client_model=_str(rec, "client_model"),
            responder_backend=_str(rec, "responder_backend", "tested_backend"),
            responder_model=_str(rec, "responder_model", "tested_model"),
            seed=rec["seed"] if isinstance(rec.get("seed"), int) else 0,
            n_utterances=len(rows), termination_reason=_str(rec, "termination_reason"),
            source_id=json.dumps(rec["conversation_id"]),
        ))
        per_persona[pid] += 1
    if not dialogues:
        raise UserError(f"{src} holds no records.")
    summary = {
        "kind": "import", "schema_version": SCHEMA_VERSION, "source": str(src),
        "source_sha256": file_sha256(src),
        "imported_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "defaults": {"condition": condition, "pairing": pairing},
        "counts": {"personas": len(personas), "dialogues": len(dialogues), "turns": len(turns)},
        "tables": ["personas", "dialogues", "turns"],
    }
    write_finished_run(out, {"personas": [persona_record(p) for p in personas.values()],
                             "dialogues": dialogues, "turns": turns}, summary,
                       persona_fields=(columns, integer), replace=overwrite)
    return summary


def _persona_id(value: Any, where: str, what: str = "persona_id") -> str:
    """A persona (or conversation) id that names one: not blank, not a path (``..``, ``a/b``)
    and without control characters (ids end up in dialogue ids, URLs of the viewer and file
    names)."""
    pid = str(value)
    if (not pid.strip() or pid in (".", "..") or "/" in pid or "\\" in pid
            or any(unicodedata.category(c) == "Cc" for c in pid)):
        raise UserError(f"{where}: {what} {pid[:40]!r} is not an id (empty, '.', '..', or with "
                        "a slash or a control character); give each one a plain id.")
    return pid


def _check_target(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; name a directory for the run.")
    finish_replacement(out)  # an import killed between its two renames left the old one aside
    check_output(out, "import", overwrite=overwrite)  # never into a run, over one or over files
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise UserError(f"{out} already holds data; choose another --out or pass --force to "
                        "replace an earlier import.")


def export_spasm_jsonl(run_dir: str | Path, path: str | Path) -> int:
    """Write a run's ok dialogues as SPASM-release JSONL; returns the record count.

    The inverse of :func:`import_spasm_jsonl` (``responder`` becomes ``tested``; the original
    ``persona_fields`` are used when the persona was imported).
    """
    from spasm.dataset.reader import open_run

    run = open_run(run_dir)
    personas = {(one := persona_of(r, place=i, card="")).id: one
                for i, r in enumerate(run.table("personas").to_pylist())}
    turns: dict[str, list[dict[str, Any]]] = {}
    for t in run.table("turns", ["dialogue_id", "turn_index", "speaker", "text"]).to_pylist():
        turns.setdefault(str(t["dialogue_id"]), []).append(t)
    lines = []
    for d in run.table("dialogues").to_pylist():
        if d["status"] != "ok":
            continue
        p = personas.get(str(d["persona_id"]))
        raw = p.source_fields if p else None
        fields = json.loads(raw) if raw else {
            k: v for k, v in (p.fields if p else {}).items() if v is not None}
        ts = sorted(turns.get(str(d["dialogue_id"]), []), key=lambda t: int(t["turn_index"]))
        lines.append(json.dumps({
            "persona_id": d["persona_id"],
            "conversation_id": _source_conversation_id(d),
            "persona_fields": fields,
            "persona_description": p.card if p else "",
            "turns": [{"speaker": "client" if t["speaker"] == "client" else "tested",
                       "turn_index": i, "text": t["text"]} for i, t in enumerate(ts)],
            "termination_reason": d["termination_reason"] or "",
        }, ensure_ascii=False, default=str))
    atomic_write_text(path, "\n".join(lines) + ("\n" if lines else ""))
    return len(lines)


def _source_conversation_id(dialogue: Mapping[str, Any]) -> Any:
    """The release's conversation_id of an imported dialogue (its index for generated ones)."""
    source = dialogue.get("source_id")
    return json.loads(source) if source else dialogue["conversation_index"]


# -- people's conversations: ShareGPT and OpenAI messages (a run with human seats) ------------

#: The formats ``spasm import`` reads (``auto`` tells them apart by the first record).
FORMATS = ("auto", "spasm", "sharegpt", "openai", "otlp", "langfuse")

#: A message's role or ShareGPT ``from`` -> the seat it is (``None``: not an utterance, left out
#: and counted: system prompts, tool calls and results).
_HUMAN_SPEAKERS: dict[str, str | None] = {
    "human": "client", "user": "client",
    "gpt": "responder", "chatgpt": "responder", "assistant": "responder", "bard": "responder",
    "bing": "responder", "model": "responder", "claude": "responder",
    "system": None, "developer": None, "tool": None, "function": None, "function_call": None,
    "observation": None, "ipython": None,
}
_USER_KEYS = ("user_id", "user", "operator", "author")


def _json_array_records(path: Path, text: str) -> Iterator[tuple[int, Any]]:
    """The elements of a top-level JSON array, each with the line it starts on."""
    decoder = json.JSONDecoder()
    pos = text.index("[") + 1
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos < len(text) and text[pos] == "]":
            return
        line_no = text.count("\n", 0, pos) + 1
        try:
            value, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}:{exc.lineno} is not valid JSON ({exc.msg}).") from None
        except (ValueError, RecursionError):
            raise UserError(f"{path}:{line_no} cannot be read: it holds a number with thousands "
                            "of digits or nesting too deep.") from None
        yield line_no, value
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos < len(text) and text[pos] == ",":
            pos += 1
        elif pos < len(text) and text[pos] == "]":
            return
        else:
            line = text.count("\n", 0, pos) + 1
            raise UserError(f"{path}:{line} is not valid JSON (expected ',' or ']' between the "
                            "array's conversations).")


def _any_records(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """A JSONL file's objects or a JSON array's (ShareGPT ships both), each with its line."""
    try:
        with path.open("rb") as fh:
            head = fh.read(4096)
    except OSError as exc:
        raise UserError(f"Cannot read {path}: {exc.strerror}.") from None
    stripped = head.lstrip()
    if stripped.startswith(b"{") and _one_document(path, stripped):
        text = path.read_text(encoding="utf-8")
        # a pretty-printed object over many lines (an OTLP export): one record
        value = _json_object(text, path, 1, document=True)
        yield text.count("\n", 0, len(text) - len(text.lstrip())) + 1, value
        return
    if not stripped.startswith(b"["):
        yield from _records(path)
        return
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{path} is not UTF-8 text; is this a JSON file?") from None
    for line_no, value in _json_array_records(path, text):
        if not isinstance(value, dict):
            raise UserError(f"{path}:{line_no} is not a JSON object (a conversation).")
        yield line_no, value


def _one_document(path: Path, head: bytes) -> bool:
    """Whether a file that opens with ``{`` is one JSON object over several lines rather than
    JSONL: its first line is not a whole JSON value."""
    first = head.split(b"\n", 1)[0]
    if b"\n" not in head and len(head) >= 4096:
        return False  # a long first line: JSONL (read line by line, with the line limit)
    try:
        json.loads(first)
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError, RecursionError):
        try:
            text = path.read_text(encoding="utf-8")
            return isinstance(json.loads(text), dict)
        except (OSError, json.JSONDecodeError, UnicodeDecodeError, ValueError, RecursionError):
            return False  # JSONL with a bad first line: _records names it
    return False


def detect_format(path: str | Path) -> str:
    """``spasm``, ``sharegpt`` or ``openai``: what the file's first record looks like."""
    src = Path(path)
    for line_no, rec in _any_records(src):
        if "persona_id" in rec and "turns" in rec:
            return "spasm"
        if isinstance(rec.get("conversations"), list) or isinstance(rec.get("items"), list):
            return "sharegpt"
        if isinstance(rec.get("messages"), list):
            return "openai"
        if isinstance(rec.get("resourceSpans"), list):
            return "otlp"
        if "sessionId" in rec or ("traceId" in rec and ("input" in rec or "output" in rec)):
            return "langfuse"
        raise UserError(f"{src}:{line_no} is not a conversation spasm knows (a SPASM release "
                        "record, ShareGPT 'conversations', OpenAI 'messages', OTLP "
                        "'resourceSpans' or a Langfuse trace); pass --format.")
    raise UserError(f"{src} holds no records.")


def _content_text(content: Any, where: str, skipped: Counter[str]) -> str | None:
    """A message's text: a string, or an OpenAI content list's text parts (others counted)."""
    if content is None:
        return None
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and part.get("type") in ("text", "input_text", "output_text"):
                texts.append(str(part.get("text") or ""))
            else:
                skipped["non_text_parts"] += 1
        return "\n".join(texts)
    raise UserError(f"{where}: a message's content must be text or a list of parts, not "
                    f"{type(content).__name__}.")


def _pseudonym(value: str) -> str:
    import hashlib

    return "op-" + hashlib.sha256(value.encode("utf-8")).hexdigest()[:6]


def _conversation_turns(
    did: str, messages: list[Any], fmt: str, where: str, skipped: Counter[str],
) -> list[TurnRow]:
    """A conversation's utterances as turns: people's lines the client seat, a model's the
    responder; what is neither is left out and counted, and consecutive messages of one seat
    are one turn (counted as ``merged``)."""
    role_key, text_key = ("from", "value") if fmt == "sharegpt" else ("role", "content")
    spoken: list[tuple[str, str]] = []
    for k, message in enumerate(messages):
        if not isinstance(message, dict) or role_key not in message:
            raise UserError(f"{where}: message {k} has no {role_key!r}; every message of a "
                            f"{fmt} conversation needs {role_key!r} and {text_key!r}.")
        role = str(message[role_key]).lower()
        if role not in _HUMAN_SPEAKERS:
            raise UserError(f"{where}: message {k} has {role_key} {_short(role)!r}; expected "
                            "human/user (the person) or gpt/assistant (the model), or "
                            "system/tool (left out).")
        seat = _HUMAN_SPEAKERS[role]
        text = _content_text(message.get(text_key), where, skipped)
        if seat is None:
            skipped[role] += 1
            continue
        if not text or not text.strip():
            skipped["empty"] += 1  # an assistant message that only called tools, an empty line
            continue
        if spoken and spoken[-1][0] == seat:
            skipped["merged"] += 1
            spoken[-1] = (seat, spoken[-1][1] + "\n\n" + text)
        else:
            spoken.append((seat, text))
    from spasm.dataset.rows import human_row_model

    model = human_row_model(TurnRow)  # a run with a human seat: the turns have the typing columns
    return [cast(TurnRow, model.model_validate(
                {"dialogue_id": did, "turn_index": i, "speaker": seat, "text": text}))
            for i, (seat, text) in enumerate(spoken)]


def import_conversations(
    path: str | Path,
    out_dir: str | Path,
    *,
    fmt: str = "auto",
    condition: str = "ecp",
    pairing: str | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Import a file of conversations into a run directory; the summary is its manifest.

    ``fmt`` ``spasm`` is :func:`import_spasm_jsonl`; ``sharegpt`` (JSON array or JSONL of
    ``{"conversations": [{"from": "human", "value": ...}, ...]}``) and ``openai`` (JSONL of
    ``{"messages": [{"role": "user", "content": ...}, ...]}``) are people's conversations with
    a model: the person's side is the client seat (``client_kind`` ``human``, ``interface``
    ``import``, a pseudonymous ``operator``), the model's the responder (``llm``); ``otlp``
    (OpenTelemetry GenAI spans, OTLP JSON) and ``langfuse`` (a Langfuse export) are traces of
    such conversations, one per session (:mod:`spasm.dataset.traces`). ``auto`` reads the
    first record to tell them apart.

    Raises:
        UserError: the file is missing or malformed (with its line), an id repeats, a
            conversation has no utterance of a person, or ``out_dir`` already holds data.
    """
    src, out = Path(path), Path(out_dir)
    if fmt not in FORMATS:
        raise UserError(f"Unknown --format {fmt!r}; use one of: {', '.join(FORMATS)}.")
    if not src.is_file():
        raise UserError(f"{src} does not exist; pass the path of a .json or .jsonl file.")
    if fmt == "auto":
        fmt = detect_format(src)
    if fmt == "spasm":
        return import_spasm_jsonl(src, out, condition=condition, pairing=pairing or "unknown",
                                  overwrite=overwrite)
    records: Iterator[tuple[int, dict[str, Any]]] = _any_records(src)
    skipped: Counter[str] = Counter()
    if fmt in ("otlp", "langfuse"):  # traces: one conversation per session, as OpenAI messages
        from spasm.dataset.traces import trace_conversations

        _check_target(Path(out_dir), overwrite)  # before reading a large export
        records = iter(trace_conversations(src, fmt, records, skipped))
    return _import_people(src, out, fmt, records, skipped, condition=condition, pairing=pairing,
                          overwrite=overwrite)


def _import_people(
    src: Path, out: Path, fmt: str, records: Iterator[tuple[int, dict[str, Any]]],
    skipped: Counter[str], *, condition: str, pairing: str | None, overwrite: bool,
) -> dict[str, Any]:
    from spasm.dataset.rows import human_row_model
    from spasm.personas.schema import load_schema

    condition = condition.lower()
    if condition not in PROJECTIONS:
        raise UserError(f"Unknown condition {condition!r}; use --condition with one of: "
                        f"{', '.join(ordered_conditions(PROJECTIONS.names()))}.")
    _check_target(out, overwrite)
    schema = load_schema(None)
    columns, integer = schema.field_names, schema.integer_fields()
    source_sha = file_sha256(src)
    row_model = human_row_model(DialogueRow)
    key = "conversations" if fmt == "sharegpt" else "messages"
    message_fmt = "sharegpt" if fmt == "sharegpt" else "openai"
    personas: dict[str, Persona] = {}
    dialogues: list[DialogueRow] = []
    turns: list[TurnRow] = []
    per_persona: Counter[str] = Counter()
    seen: dict[str, int] = {}
    for n, (line_no, rec) in enumerate(records):
        where = f"{src}:{line_no}"
        messages = rec.get(key, rec.get("items") if fmt == "sharegpt" else None)
        if not isinstance(messages, list):
            raise UserError(f"{where} has no {key!r} list; is this a {fmt} file? (--format "
                            "sharegpt reads 'conversations', --format openai 'messages').")
        raw_id = rec.get("id", rec.get("conversation_id"))
        tail = f"conv-{n}" if raw_id in (None, "") else _persona_id(raw_id, where, "id")
        if tail in seen:
            raise UserError(f"{where} repeats the conversation id {_short(tail)!r} (first on "
                            f"line {seen[tail]}); give each conversation its own id.")
        seen[tail] = line_no
        who = next((str(rec[k]) for k in _USER_KEYS if rec.get(k) not in (None, "")), None)
        operator = _pseudonym(who if who is not None else f"{source_sha}:{tail}")
        rows = _conversation_turns(tail, messages, message_fmt, where, skipped)
        if not any(t.speaker == "client" for t in rows):
            raise UserError(f"{where}: the conversation has no line of a person (human/user); "
                            "leave it out of the file.")
        if operator not in personas:  # one persona per person: what the card would describe
            personas[operator] = Persona(
                id=operator, index=len(personas), fields=persona_columns({}, columns, integer),
                card="", card_source="import", source_fields="{}")
        model = _str(rec, "model", default="unknown")
        turns.extend(rows)
        dialogues.append(cast(DialogueRow, row_model.model_validate({
            "dialogue_id": tail, "persona_id": operator,
            "conversation_index": per_persona[operator], "condition": condition,
            "harness_level": "A", "pairing": pairing or f"human×{model}",
            "client_backend": "import", "client_model": "human", "responder_backend": "import",
            "responder_model": model, "seed": 0, "n_utterances": len(rows),
            "termination_reason": "imported",
            "source_id": json.dumps(raw_id if raw_id not in (None, "") else n),
            "client_kind": "human", "responder_kind": "llm", "operator": operator,
            "interface": "import",
        })))
        per_persona[operator] += 1
    if not dialogues:
        raise UserError(f"{src} holds no conversations.")
    summary = {
        "kind": "import", "format": fmt, "schema_version": SCHEMA_VERSION, "source": str(src),
        "source_sha256": source_sha,
        "imported_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "defaults": {"condition": condition, "pairing": pairing or "human×<model>"},
        "counts": {"personas": len(personas), "dialogues": len(dialogues), "turns": len(turns)},
        "left_out": dict(sorted(skipped.items())),
        "tables": ["personas", "dialogues", "turns"],
    }
    write_finished_run(out, {"personas": [persona_record(p) for p in personas.values()],
                             "dialogues": dialogues, "turns": turns}, summary,
                       persona_fields=(columns, integer), replace=overwrite)
    return summary
