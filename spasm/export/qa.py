"""``spasm qa``: every QA scan over a run, findings to the run's ``qa`` table (docs/export.md).

One streaming pass over the turns (:mod:`spasm.export.stream`) runs the utterance scans of
:mod:`spasm.export.scans`, checks each dialogue's structure (alternation, turn order, no
utterances) and feeds the duplicate index (:mod:`spasm.export.dedup`). Role flips come from
the signals ``spasm eval`` and annotators leave in the run, where they exist. The findings are
:class:`~spasm.dataset.QARow` rows, written with ``RunStore.replace_table`` (a rescan replaces
the table in one atomic swap).
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from collections.abc import Collection
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import BaseModel

from spasm.dataset import QARow, Run, RunStore
from spasm.dataset.lock import RunLock
from spasm.dataset.persona_rows import PERSONA_HEAD, PERSONA_TAIL
from spasm.errors import UserError
from spasm.export.dedup import NUM_PERM, SHINGLE_WORDS, DuplicateIndex, minhash_available
from spasm.export.scans import REDACTABLE, Finding, PromptRef, ScanContext, prompt_ref, scan_text
from spasm.export.seats import group_seats
from spasm.export.stream import Turn, iter_dialogues, turn_index
from spasm.language import (
    DEFAULT_LANGUAGE,
    MIN_CONFIDENCE,
    MIN_LETTERS,
    expected_language,
    identifier_available,
)
from spasm.projection import SPEAKER_LABELS, Viewer

__all__ = ["DIALOGUE_KINDS", "QAResult", "QASummary", "check_finished", "prompt_grams", "role_flip_signals",
           "scan_run", "structure_findings", "summary_json", "summary_table", "write_qa"]

#: Finding kinds about a whole dialogue or its structure (the rest are utterance scans).
DIALOGUE_KINDS = ("alternation", "duplicate", "near_duplicate", "role_flip")
#: ``spasm eval``'s per-dialogue output, read for its echoing verdicts (importing the
#: evaluation package would pull in scipy and scikit-learn for one Parquet file).
EVAL_PER_DIALOGUE = Path("eval") / "per_dialogue.parquet"


class QASummary(BaseModel):
    """What a scan looked at and found (printed by ``spasm qa``, shown on the card)."""

    dialogues: int
    turns: int
    #: Findings per kind, and dialogues with at least one finding of the kind.
    findings: dict[str, int]
    dialogues_with: dict[str, int]
    near_duplicates: str
    near_threshold: float
    role_flips: str
    found_at: datetime
    #: How utterances were checked for the persona's language (``off_language``).
    languages: str = ""


@dataclass
class QAResult:
    """The rows of a scan and its summary; ``by_dialogue`` indexes the rows."""

    rows: list[QARow]
    summary: QASummary
    by_dialogue: dict[str, list[QARow]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.by_dialogue:
            for row in self.rows:
                self.by_dialogue.setdefault(row.dialogue_id, []).append(row)

    def turn_findings(self, dialogue_id: str) -> dict[int, list[Finding]]:
        """The redactable findings of one dialogue by turn, as :class:`Finding` (for redaction)."""
        out: dict[int, list[Finding]] = {}
        for r in self.by_dialogue.get(dialogue_id, []):
            if r.redaction is not None and r.turn_index is not None and r.start is not None:
                out.setdefault(r.turn_index, []).append(
                    Finding(r.kind, r.start, r.end if r.end is not None else r.start, r.evidence,
                            r.redaction))
        return out


def check_finished(run: Run, allow_unfinished: bool) -> None:
    """A run still being generated (or stopped) is refused unless ``allow_unfinished``."""
    manifest = run.manifest
    status = manifest.get("status")
    if status is None and manifest.get("kind") in ("import", "synthetic"):
        status = "complete"  # written in one step by write_finished_run
    if status != "complete" and not allow_unfinished:
        raise UserError(
            f"{run.dir} is not a finished run (manifest status: {status or 'none'}). Finish it "
            "(rerun the same `spasm generate` command) or pass --allow-unfinished to use the "
            "dialogues completed so far."
        )


# ----------------------------------------------------------------------------- prompt leaks

_FRAMING = [Viewer("client", "").opening] + [
    Viewer("client", "").continue_instruction.format(label=label) for label in SPEAKER_LABELS.values()
]


@functools.lru_cache(maxsize=512)
def prompt_grams(client_prompt: str, responder_prompt: str, persona_texts: tuple[str, ...]) -> PromptRef:
    """What an utterance must not repeat: the dialogue's two system prompts and the projection's
    framing texts, minus the persona's own field values (a Client saying its concern in the
    card's words is in character, not a leak)."""
    return prompt_ref([client_prompt, responder_prompt, *_FRAMING], persona_texts)


def _persona_texts(run: Run) -> dict[str, tuple[str, ...]]:
    if not run.has("personas"):
        return {}
    table = run.table("personas")
    fixed = set(PERSONA_HEAD) | set(PERSONA_TAIL)
    cols = [c for c in table.column_names
            if c not in fixed and pa.types.is_string(table.schema.field(c).type)]
    ids = table.column("persona_id").to_pylist()
    values = [table.column(c).to_pylist() for c in cols]
    return {pid: tuple(str(v[i]) for v in values if v[i]) for i, pid in enumerate(ids)}


def _persona_languages(run: Run) -> dict[str, str]:
    """Each persona's language (ISO 639-1) where the personas table has a ``language`` column."""
    if not run.has("personas"):
        return {}
    table = run.table("personas")
    if "language" not in table.column_names:
        return {}
    ids = table.column("persona_id").to_pylist()
    return {pid: expected_language(v)
            for pid, v in zip(ids, table.column("language").to_pylist(), strict=True)}


class _Prompts:
    """Per-dialogue prompts, dictionary-encoded (a run repeats each prompt many times)."""

    def __init__(self, run: Run) -> None:
        table = run.table("dialogues", ["dialogue_id", "persona_id", "client_system_prompt",
                                        "responder_system_prompt"])
        self.ids = table.column("dialogue_id").to_pylist()
        self.row = {d: i for i, d in enumerate(self.ids)}
        self.persona = table.column("persona_id").to_pylist()
        self.enc = []
        for col in ("client_system_prompt", "responder_system_prompt"):
            d = pc.dictionary_encode(pc.fill_null(table.column(col), "")).combine_chunks()
            self.enc.append((d.indices.to_pylist(), d.dictionary.to_pylist()))
        self.persona_texts = _persona_texts(run)
        self.languages = _persona_languages(run)

    def language(self, dialogue_id: str) -> str:
        """The language the dialogue's persona speaks (English when the run does not say)."""
        i = self.row.get(dialogue_id)
        return DEFAULT_LANGUAGE if i is None else self.languages.get(self.persona[i], DEFAULT_LANGUAGE)

    def ref(self, dialogue_id: str) -> PromptRef:
        i = self.row.get(dialogue_id)
        if i is None:
            return PromptRef()
        (ci, cd), (ri, rd) = self.enc
        return prompt_grams(cd[ci[i]], rd[ri[i]], self.persona_texts.get(self.persona[i], ()))


# ----------------------------------------------------------------------------- structure

def structure_findings(turns: list[Turn], speakers: Collection[str] | None = None) -> list[tuple[int, str]]:
    """``(turn_index, evidence)`` where the turns break alternation or turn order. ``speakers``:
    who may speak (a group dialogue's participant ids; default the Client and the Responder)."""
    known = SPEAKER_LABELS if speakers is None else speakers
    out: list[tuple[int, str]] = []
    expected = 0
    for k, t in enumerate(turns):
        if t.index != expected:
            out.append((t.index, f"turn {t.index} follows turn {expected - 1} (missing or repeated)"))
        if t.speaker not in known:
            out.append((t.index, f"unknown speaker {t.speaker!r}"))
        elif k and t.speaker == turns[k - 1].speaker:
            out.append((t.index, f"{t.speaker} speaks twice in a row"))
        expected = t.index + 1
    return out


# ----------------------------------------------------------------------------- role flips

def role_flip_signals(run: Run) -> tuple[dict[str, str], str]:
    """Dialogues that ``spasm eval`` or an annotator marked as echoing / role-flipped, with
    evidence, and which sources there were."""
    flips: dict[str, str] = {}
    sources = []
    path = run.dir / EVAL_PER_DIALOGUE
    if path.is_file():
        sources.append("spasm eval")
        t = pq.read_table(path, columns=["dialogue_id", "echoing", "echo_who", "echo_evidence"])
        for d, echoing, who, evidence in zip(*(t.column(c).to_pylist() for c in t.column_names), strict=True):
            if echoing:
                flips[d] = f"eval: {who} echoes its partner" + (f" ({evidence[:200]})" if evidence else "")
    if run.has("annotations"):
        sources.append("annotations")
        rows = run.table("annotations", ["dialogue_id", "annotator", "echoing", "role_flip", "labelled_at"])
        latest: dict[tuple[str, str], dict[str, Any]] = {}
        for r in sorted(rows.to_pylist(), key=lambda r: r["labelled_at"]):  # the latest label wins
            latest[(r["dialogue_id"], r["annotator"])] = r
        for (did, who), r in sorted(latest.items()):
            if r["role_flip"] is True or r["echoing"] in ("client", "responder", "both"):
                flips.setdefault(did, f"annotator {who}: echoing {r['echoing']}, role flip {r['role_flip']}")
    return flips, " + ".join(sources) if sources else "no signals (run `spasm eval` or annotate)"


# ----------------------------------------------------------------------------- the scan

def _row(did: str, kind: str, evidence: str, when: datetime, *, turn: int | None = None,
         start: int | None = None, end: int | None = None, redaction: str | None = None) -> QARow:
    return QARow(dialogue_id=did, turn_index=turn, kind=kind, evidence=evidence, start=start, end=end,
                 redaction=redaction, found_at=when)


def scan_run(
    run: Run, *, near_threshold: float = 0.8, near: bool | None = None, batch_size: int = 4096
) -> QAResult:
    """Run every scan over ``run``. ``near``: look for near duplicates (default: when
    datasketch is installed; ``True`` without it is an error)."""
    if not 0 < near_threshold <= 1:
        raise UserError("the near-duplicate threshold is a Jaccard similarity in (0, 1]")
    if near is None:
        near = minhash_available()
    elif near and not minhash_available():
        raise UserError("near-duplicate detection needs datasketch: pip install 'spasm[export]'")
    when = datetime.now(UTC)
    prompts = _Prompts(run)
    index = turn_index(run)
    seats = {d: {str(p["participant_id"]) for p in ps} for d, ps in group_seats(run).items()}
    dups = DuplicateIndex(threshold=near_threshold, near=near)
    rows: list[QARow] = []
    seen: set[str] = set()
    n_turns = 0
    for did, turns in iter_dialogues(run, index, batch_size=batch_size):
        seen.add(did)
        n_turns += len(turns)
        ref, language = prompts.ref(did), prompts.language(did)
        for t in turns:
            ctx = ScanContext(speaker=t.speaker, prompts=ref, language=language)
            for f in scan_text(t.text, ctx):
                rows.append(_row(did, f.kind, f.evidence, when, turn=t.index, start=f.start, end=f.end,
                                 redaction=f.redaction))
        for turn, evidence in structure_findings(turns, seats.get(did)):
            rows.append(_row(did, "alternation", evidence, when, turn=turn))
        dups.add(did, turns)
    rows += [_row(d, "empty_turn", "the dialogue has no utterances", when)
             for d in prompts.ids if d not in seen]
    rows += [_row(f.dialogue_id, f.kind, f.other, when) for f in dups.findings()]
    flips, flip_source = role_flip_signals(run)
    rows += [_row(d, "role_flip", ev, when) for d, ev in sorted(flips.items()) if d in prompts.row]
    summary = QASummary(
        dialogues=len(prompts.ids), turns=n_turns,
        findings=dict(Counter(r.kind for r in rows)),
        dialogues_with=dict(Counter(k for _, k in {(r.dialogue_id, r.kind) for r in rows})),
        near_duplicates=(f"MinHash (datasketch, {NUM_PERM} permutations) with banded LSH, word "
                         f"{SHINGLE_WORDS}-grams, Jaccard >= {near_threshold}"
                         if near else "not scanned (install datasketch: pip install 'spasm[export]')"),
        near_threshold=near_threshold, role_flips=flip_source, found_at=when,
        languages=(f"py3langid, utterances of {MIN_LETTERS}+ letters, probability >= {MIN_CONFIDENCE}, "
                   "against each persona's language (English unless the personas table says)"
                   if identifier_available()
                   else "not scanned (install py3langid: pip install 'spasm[eval]')"),
    )
    return QAResult(rows, summary)


def write_qa(run_dir: str | Path, result: QAResult, *, locked: bool = False) -> Path:
    """Replace the run's ``qa`` table with ``result``'s rows (one atomic swap), holding the
    run's write lock (a :class:`UserError` when another process writes the run); ``locked``:
    the caller holds it already (``spasm qa`` and ``spasm export`` take it before the scan,
    so a run being written is refused before anything is read or written)."""
    store = RunStore(Path(run_dir))
    with nullcontext() if locked else RunLock(store.dir):
        store.replace_table("qa", result.rows)
    return store.table_dir("qa")


def summary_table(summary: QASummary) -> str:
    """The scan's summary as a fixed-width table (what each kind means for an export)."""
    kinds = sorted(set(summary.findings) | set(REDACTABLE))
    lines = [f"{'kind':<16} {'findings':>9} {'dialogues':>10}  in an export",
             f"{'-' * 16} {'-' * 9} {'-' * 10}  {'-' * 36}"]
    for k in kinds:
        action = ("redacted as " + {"email": "[EMAIL]", "url": "[URL]", "phone": "[PHONE]",
                                    "number": "[NUMBER]"}[k]) if k in REDACTABLE else (
            "dialogue dropped (--echoing keep keeps it)" if k == "role_flip"
            else "dialogue dropped (--allow-qa keeps it)")
        n, d = summary.findings.get(k, 0), summary.dialogues_with.get(k, 0)
        lines.append(f"{k:<16} {n:>9} {d:>10}  {action}")
    lines.append("")
    lines.append(f"{summary.dialogues} dialogues, {summary.turns} utterances scanned")
    lines.append(f"near duplicates: {summary.near_duplicates}")
    lines.append(f"role flips: {summary.role_flips}")
    if summary.languages:
        lines.append(f"languages: {summary.languages}")
    return "\n".join(lines)


def summary_json(summary: QASummary) -> str:
    """The summary as JSON."""
    return json.dumps(summary.model_dump(mode="json"), indent=2, sort_keys=True)

