"""``spasm export``: a finished run → training files, a dataset card and QA findings.

The steps, each in bounded memory however large the run:

1. scan the run (:func:`spasm.export.qa.scan_run`) and replace its ``qa`` table;
2. select dialogues (:mod:`spasm.export.select`) and split their personas (:mod:`spasm.export.split`);
3. stream the kept dialogues once, redact them, build each role's :class:`Example` and write them
   in chunks per split (Parquet, in a work folder of the staging directory);
4. write every format's file per split from those chunks, then the trainer configs
   (:mod:`spasm.export.trainers`) and the card (README.md, card.json);
5. when pushing to the Hub or given a token limit, run OpenAI's checks on the examples;
6. move the staging directory into place in one ``os.replace``: a failure at any step leaves no
   half-written output (and ``--overwrite`` keeps the old output until the new one is complete);
7. with ``push_to_hub``, upload the folder (:mod:`spasm.export.hub`) — only when the checks pass.

Every example ends on a turn of the role it trains (``ending="trim"``, the default, drops the
partner's turns after it; ``"keep"`` keeps them).

A group run (a ``participants`` table) is exported from each exported seat's own frame: ``role``
names a participant id (its seat in every dialogue) or a role (every seat of it, one example per
seat and dialogue; ``both``: every seat). A seat that never spoke in a dialogue has no example
of it (the card counts them).

Layout of the output directory::

    README.md                         dataset card with the Hub's YAML header (and axolotl's block)
    card.json                         every number on the card
    dataset_info.json                 LLaMA-Factory's dataset entries
    data/{split}-00000-of-00001-{digest}.parquet   hf format (datasets.load_dataset(DIR))
    openai/{split}.jsonl              OpenAI chat fine-tuning format
    sharegpt/{split}.jsonl            ShareGPT

The files the card's ``configs:`` block names (hf's, else the first JSONL format's) carry the
first 12 hex digits of their SHA-256 in their name: ``datasets`` caches a folder's configs by
file name, so a re-export under the same names would load the earlier export's rows.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field, field_validator

from spasm.config import PARTICIPANT_ID
from spasm.dataset import Run, open_run
from spasm.dataset.files import atomic_write, atomic_write_json, atomic_write_table, atomic_write_text
from spasm.dataset.integrity import file_sha256
from spasm.dataset.lock import RunLock
from spasm.dataset.outputs import aside_path, check_output, finish_replacement, mark_output
from spasm.dataset.persona_rows import ID_CARD_COLUMNS, cards_of
from spasm.dataset.reader import events_by_dialogue, participant_viewer
from spasm.errors import RunError, UserError
from spasm.export.card import CARD_COLUMNS, CardStats, GroupStats, MaskStats, SplitCount, card_stats
from spasm.export.card_render import render_card
from spasm.export.check import CheckReport, check_examples
from spasm.export.formats import (
    GROUP_META_COLUMNS,
    META_COLUMNS,
    Example,
    ExportFormat,
    FormatOptions,
    SystemPrompt,
    alternate,
    end_on_role,
    get_format,
    hf_schema,
    openai_format,
    perspective,
    sharegpt_cut,
)
from spasm.export.messages import ExampleMessage
from spasm.export.qa import QAResult, check_finished, scan_run, write_qa
from spasm.export.scans import REDACTABLE, redact
from spasm.export.seats import (
    check_role,
    group_seats,
    participant_ids,
    select_role,
    speaker_tokens,
    wanted_seats,
)
from spasm.export.select import DIALOGUE_COLUMNS, Selection, SelectionResult, check_selection, select
from spasm.export.split import SPLIT_NAMES, assign_splits
from spasm.export.stream import Turn, iter_dialogues, turn_index
from spasm.export.tooluse import offered_tools, run_tools, tools_for
from spasm.export.trainers import (
    DataFiles,
    axolotl_datasets,
    format_path,
    llamafactory_dataset_info,
    llamafactory_keeps,
)
from spasm.projection import Viewer

__all__ = ["DIGEST_DIGITS", "ExportOptions", "ExportSummary", "configured_format", "export_run",
           "hub_configs"]

_CHUNK_SCHEMA = pa.schema([
    ("messages", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string()),
                                     ("weight", pa.int8()), ("name", pa.string()),
                                     # A run with tools: a step's calls (JSON), a result's call id.
                                     ("tool_calls", pa.string()), ("tool_call_id", pa.string())]))),
    *META_COLUMNS.items(), *GROUP_META_COLUMNS.items(),
    ("tools", pa.string()),  # a run with tools: the trained role's tool schemas (JSON)
])
#: Message keys a chunk stores as null where a message has none.
_OPTIONAL_KEYS = ("weight", "name", "tool_calls", "tool_call_id")


class ExportOptions(BaseModel):
    """Everything ``spasm export`` can be told (the CLI's flags map onto these fields)."""

    model_config = ConfigDict(extra="forbid")

    formats: list[str] = ["openai", "sharegpt", "hf"]
    #: ``responder``, ``client`` or ``both``; in a group run also a participant id (its seat).
    role: str = Field("responder", pattern=PARTICIPANT_ID)
    split: tuple[float, ...] = (0.9, 0.05, 0.05)
    #: Seed of the persona split (default: the run's seed).
    seed: int | None = None
    #: The role's system prompt: keep, merge into the first user message, or drop (``True`` and
    #: ``False`` are read as keep and drop).
    system_prompt: SystemPrompt = "keep"
    #: ``trim``: every example ends on a turn of the role it trains; ``keep``: the partner's
    #: turns after it stay.
    ending: Literal["trim", "keep"] = "trim"
    #: Masks (weight 0 on flagged turns) in every format.
    weights: bool = False
    selection: Selection = Selection()
    allow_unfinished: bool = False
    overwrite: bool = False
    near_threshold: float = Field(0.8, gt=0, le=1)
    #: Hub license id (default: ``license`` of the run config, else ``unknown``).
    license: str | None = None
    language: str = "en"
    #: Dialogues per work chunk (memory per chunk, not a limit on the run).
    chunk_dialogues: int = Field(2048, ge=1)
    #: Tokens per example the export's check enforces (``None``: a warning above 65,536). Given,
    #: the check runs even without a push.
    token_limit: int | None = Field(None, ge=1)
    #: Upload the folder to this Hub dataset repo (``OWNER/NAME``) once the checks pass.
    push_to_hub: str | None = None
    private: bool = False
    #: The Hub branch to upload to (created if missing; default the repo's main branch).
    revision: str | None = None
    #: The environment variable holding the Hub token (like the backends' ``api_key_env``).
    hub_token_env: str = "HF_TOKEN"
    #: The Hub's address (default: huggingface_hub's, which honours ``HF_ENDPOINT``).
    hub_endpoint: str | None = None

    @field_validator("system_prompt", mode="before")
    @classmethod
    def _system_prompt_bool(cls, value: Any) -> Any:
        if isinstance(value, bool):
            return "keep" if value else "drop"
        return value


class ExportSummary(BaseModel):
    """What an export wrote (and, when checked or pushed, the check and the Hub's address)."""

    out: str
    files: list[str]
    stats: CardStats
    check: CheckReport | None = None
    hub_url: str | None = None


@dataclass
class _Built:
    """What the build pass produced: chunk files per split and the numbers the card needs."""

    chunks: dict[str, list[Path]] = field(default_factory=dict)
    utterances: dict[str, int] = field(default_factory=dict)
    words: int = 0
    redactions: Counter[str] = field(default_factory=Counter)
    splits: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Partner turns trimmed from the ends of examples.
    trimmed: int = 0
    #: Assistant turns with weight 0, examples with one, and what ShareGPT does with those.
    untrained_turns: int = 0
    untrained_examples: int = 0
    sharegpt_cut: int = 0
    sharegpt_dropped: int = 0
    #: A group export: exported seats that never spoke in their dialogue (no example), and
    #: whether some message names its speaker by the ``name`` field.
    silent_seats: int = 0
    named: bool = False
    #: A group export: other participants' turns merged into the user message before them,
    #: frames given their opening instruction (:func:`alternate`), and examples LLaMA-Factory
    #: keeps (:func:`llamafactory_keeps`).
    merged_turns: int = 0
    openings_added: int = 0
    llamafactory_kept: int = 0
    #: Examples that end on a ``user`` message (``--ending keep``).
    user_endings: int = 0


def _publish(stage: Path, out: Path) -> None:
    """Move ``stage`` to ``out``; an existing ``out`` is deleted only once the new one is in place."""
    old = aside_path(out)
    if out.exists():
        os.replace(out, old)
    try:
        os.replace(stage, out)
    except BaseException:
        if old.exists() and not out.exists():
            os.replace(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)


def human_dialogues(run: Run) -> set[str]:
    """The dialogues with a person in a seat (a run with a human seat, format 1.8): a seat of
    kind ``human``, or a human operator; none in any other run."""
    if not run.has("dialogues"):
        return set()
    t = run.table("dialogues", ["dialogue_id", "client_kind", "responder_kind", "operator"])
    rows = zip(*(t.column(c).to_pylist() for c in t.column_names), strict=True)
    return {d for d, ck, rk, op in rows if "human" in (ck, rk) or op is not None}


def _speakers(index: pa.Table, seats: dict[str, list[dict[str, Any]]]) -> dict[str, set[str]]:
    """Who speaks in each dialogue (a group dialogue's as :func:`speaker_tokens`)."""
    grouped = index.group_by("dialogue_id").aggregate([("speaker", "distinct")])
    out = {d: set(s) for d, s in zip(grouped.column("dialogue_id").to_pylist(),
                                    grouped.column("speaker_distinct").to_pylist(), strict=True)}
    return {d: speaker_tokens(seats[d], s) if d in seats else s for d, s in out.items()}


def _cards(run: Run, persona_ids: set[str]) -> dict[str, str]:
    if not run.has("personas"):
        return {}
    t = run.table("personas", list(ID_CARD_COLUMNS))
    t = t.filter(pc.is_in(t.column(ID_CARD_COLUMNS[0]), value_set=pa.array(sorted(persona_ids), pa.string())))
    return cards_of(t)


class _Builder:
    """Streams the kept dialogues once into per-split chunk files of examples."""

    def __init__(self, run: Run, qa: QAResult, kept: pa.Table, splits: dict[str, str],
                 options: ExportOptions, work: Path, index: pa.Table) -> None:
        self.run, self.qa, self.options, self.work, self.index = run, qa, options, work, index
        self.rows = {r["dialogue_id"]: r for r in kept.to_pylist()}
        self.splits = splits
        self.roles = ["responder", "client"] if options.role == "both" else [options.role]
        self.seats = group_seats(run, only=self.rows)
        personas = {r["persona_id"] for r in self.rows.values()}
        personas |= {s["persona_id"] for d in self.seats.values() for s in d if s["persona_id"]}
        self.cards = _cards(run, personas) if "client" in self.roles or self.seats else {}
        flagged = index.filter(pc.field("flagged"))
        self.flagged: dict[str, set[int]] = {}
        for d, i in zip(flagged.column("dialogue_id").to_pylist(), flagged.column("turn_index").to_pylist(),
                        strict=True):
            self.flagged.setdefault(d, set()).add(i)
        self.buffers: dict[str, list[dict[str, Any]]] = {}
        self.built = _Built()
        # A run with tools: each dialogue's events, and the tools each role could call.
        self.events = events_by_dialogue(run, only=self.rows)
        self.tools = run_tools(run) if run.has("events") else None
        self.offered = offered_tools(run, only=self.rows) if self.tools is not None else {}

    def untrained(self, did: str) -> set[int]:
        """Turns not to train on: flagged by the harness, or with a kept unredactable finding."""
        out = set(self.flagged.get(did, set()))
        for r in self.qa.by_dialogue.get(did, []):
            if r.kind not in REDACTABLE and r.turn_index is not None:
                out.add(r.turn_index)
        return out

    def system_prompt(self, row: dict[str, Any], role: str) -> str:
        prompt = row.get(f"{role}_system_prompt")
        if not prompt and role == "client":
            prompt = self.cards.get(row["persona_id"])  # imported runs: the card is the persona prompt
        return str(prompt or "")

    def add(self, did: str, turns: list[Turn]) -> None:
        row = self.rows[did]
        findings = self.qa.turn_findings(did)
        clean = []
        n_redacted = 0
        for t in turns:
            text, done = redact(t.text, findings.get(t.index, []))
            self.built.redactions.update(r.kind for r in done)
            n_redacted += len(done)
            self.built.words += len(text.split())
            clean.append(Turn(t.index, t.speaker, text))
        self.built.utterances[did] = len(turns)
        split = self.splits[row["persona_id"]]
        counts = self.built.splits.setdefault(split, {"personas": set(), "conversations": 0, "examples": 0})
        counts["personas"].add(row["persona_id"])
        counts["conversations"] += 1
        untrained = self.untrained(did)
        for role, messages, extra in self.perspectives(did, row, clean, untrained):
            if self.options.ending == "trim":
                messages, trimmed = end_on_role(messages)
                self.built.trimmed += trimmed
            elif messages and messages[-1].get("role") == "user":
                self.built.user_endings += 1
            if "participant_id" in extra:  # a group example: what LLaMA-Factory will keep
                self.built.llamafactory_kept += llamafactory_keeps(messages)
            self.count_masks(messages)
            stored: Sequence[Mapping[str, Any]] = messages
            meta = {k: row.get(k) for k in META_COLUMNS}
            meta.update(role=role, redactions=n_redacted, **extra)
            if self.tools is not None:
                seat = extra.get("participant_id")
                offered = self.offered.get((did, seat or role))  # None: no call log to say
                meta["tools"] = json.dumps(tools_for(self.tools, role, seat, offered),
                                           ensure_ascii=False)
                # The chunk holds each message's tool calls as JSON text (_examples reads them).
                stored = [{**m, "tool_calls": json.dumps(m["tool_calls"], ensure_ascii=False)}
                          if "tool_calls" in m else m for m in messages]
            self.buffers.setdefault(split, []).append({"messages": stored, **meta})
            counts["examples"] += 1
        if len(self.buffers.get(split, [])) >= self.options.chunk_dialogues:
            self.flush(split)

    def perspectives(
        self, did: str, row: dict[str, Any], turns: list[Turn], untrained: set[int]
    ) -> Iterator[tuple[str, list[ExampleMessage], dict[str, Any]]]:
        """``(role, messages, extra metadata)`` of each example of a dialogue: one per role, or
        in a group dialogue one per exported seat that spoke, from that participant's frame
        (the viewer the reader rebuilds it with)."""
        seats = self.seats.get(did)
        events = self.events.get(did, [])
        if seats is None:
            for role in self.roles:
                yield role, perspective(turns, role, self.system_prompt(row, role), untrained=untrained,
                                        events=events), {}
            return
        spoke = {t.speaker for t in turns}
        for seat in wanted_seats(self.options.role, seats):
            pid, role = str(seat["participant_id"]), str(seat["role"])
            if pid not in spoke:
                self.built.silent_seats += 1
                continue
            prompt = seat["system_prompt"] or (self.cards.get(seat["persona_id"]) if role == "client"
                                               else None)  # imported runs: the card is the prompt
            viewer = participant_viewer(row, seats, pid, str(prompt or ""))
            messages = perspective(turns, role, "", untrained=untrained, viewer=viewer, events=events)
            # (a seat always has a viewer; the fallback keeps the type checker honest)
            opening = viewer.opening if viewer is not None else Viewer(role, "").opening
            messages, merged, opened = alternate(messages, opening)
            self.built.merged_turns += merged
            self.built.openings_added += opened
            self.built.named = self.built.named or any("name" in m for m in messages)
            persona = seat["persona_id"] or row["persona_id"]  # a responder seat: the dialogue's
            yield role, messages, {"participant_id": pid, "persona_id": persona}

    def count_masks(self, messages: list[ExampleMessage]) -> None:
        zero = sum(1 for m in messages if m.get("weight") == 0)
        if not zero:
            return
        self.built.untrained_turns += zero
        self.built.untrained_examples += 1
        cut = sharegpt_cut(messages)
        if cut is None:
            self.built.sharegpt_dropped += 1
        else:
            self.built.sharegpt_cut += 1

    def flush(self, split: str) -> None:
        rows = self.buffers.pop(split, [])
        if not rows:
            return
        chunks = self.built.chunks.setdefault(split, [])
        path = self.work / f"{split}-{len(chunks):05d}.parquet"
        atomic_write_table(path, pa.Table.from_pylist(rows, _CHUNK_SCHEMA))
        chunks.append(path)

    def run_pass(self) -> _Built:
        for did, turns in iter_dialogues(self.run, self.index, only=set(self.rows)):
            self.add(did, turns)
        for split in list(self.buffers):
            self.flush(split)
        return self.built


def _examples(chunks: list[Path]) -> Iterator[list[Example]]:
    """The examples of a split, one chunk at a time."""
    for path in chunks:
        out = []
        for row in pq.read_table(path).to_pylist():
            messages = [{k: v for k, v in m.items() if k not in _OPTIONAL_KEYS or v is not None}
                        for m in row.pop("messages")]
            for m in messages:
                if "tool_calls" in m:
                    m["tool_calls"] = json.loads(m["tool_calls"])
            out.append(Example(cast(list[ExampleMessage], messages), row))
        yield out


#: Hex digits of a data file's SHA-256 in its name.
DIGEST_DIGITS = 12


def _write_format(
    fmt: ExportFormat, split: str, chunks: list[Path], options: FormatOptions, stage: Path, *, digest: bool
) -> str:
    """Write a format's file of ``split``; its path in ``stage`` (with ``digest``, the content's
    digest in its name)."""
    rel = format_path(fmt, split)

    def records(examples: list[Example]) -> list[dict[str, Any]]:
        return [r for r in (fmt.build(e, options) for e in examples) if r is not None]

    def write_jsonl(tmp: Path) -> None:
        with tmp.open("w", encoding="utf-8") as fh:
            for examples in _examples(chunks):
                fh.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records(examples))

    def write_parquet(tmp: Path) -> None:
        schema = hf_schema(options)
        with pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
            for examples in _examples(chunks):
                writer.write_table(pa.Table.from_pylist(records(examples), schema))

    atomic_write(stage / rel, write_jsonl if fmt.layout == "jsonl" else write_parquet)
    if not digest:
        return rel
    named = format_path(fmt, split, file_sha256(stage / rel)[:DIGEST_DIGITS])
    os.replace(stage / rel, stage / named)
    return named


def configured_format(formats: list[ExportFormat]) -> ExportFormat:
    """The format the card's ``configs`` names: hf (a Parquet format), else the first JSONL one."""
    return sorted(formats, key=lambda f: f.layout != "parquet")[0]


def hub_configs(formats: list[ExportFormat], splits: list[str], files: DataFiles) -> list[dict[str, Any]]:
    """The card's ``configs``: one ``default`` config over the files of :func:`configured_format`,
    which ``datasets.load_dataset(DIR)`` and the Hub load. Only one: ``datasets`` picks one
    builder for a folder, so a JSONL config beside Parquet ones would not load."""
    fmt = configured_format(formats)
    data_files = [{"split": s, "path": files[fmt.name, s]} for s in splits]
    return [{"config_name": "default", "data_files": data_files}]


def _check(chunks: dict[str, list[Path]], names: list[str], options: FormatOptions,
           token_limit: int | None) -> CheckReport:
    """OpenAI's checks over every example as the openai format renders it (whichever formats
    are written), numbered in split order."""
    def lines() -> Iterator[tuple[int, str]]:
        n = 0
        for split in names:
            for examples in _examples(chunks[split]):
                for e in examples:
                    n += 1
                    yield n, json.dumps(openai_format(e, options), ensure_ascii=False)

    return check_examples(lines(), file="the exported examples (openai rendering, splits in order "
                          + ", ".join(names) + ")", token_limit=token_limit)


def _group_stats(
    role: str, seats: dict[str, list[dict[str, Any]]], kept: set[str], built: _Built
) -> GroupStats:
    """What a group export's card says: whose frames, and how the others are named."""
    exported = {str(s["participant_id"]): s for d, ss in seats.items() if d in kept
                for s in wanted_seats(role, ss)}
    ids = [p for p in participant_ids(seats) if p in exported]
    return GroupStats(
        participants=ids, roles={p: str(exported[p]["role"]) for p in ids},
        speaker_names=sorted({str(s["speaker_names"] or "prefix") for ss in seats.values() for s in ss}),
        silent_seats=built.silent_seats, merged_turns=built.merged_turns,
        openings_added=built.openings_added, llamafactory_kept=built.llamafactory_kept,
    )


def _selection_error(result: SelectionResult) -> UserError:
    reasons = ", ".join(f"{k} {v}" for k, v in result.dropped.items()) or "the run has no dialogues"
    return UserError(f"the selection leaves no dialogue of {result.considered} ({reasons}); loosen the "
                     "filters, or keep findings with --allow-qa KIND / --echoing keep / --include-failed")


def export_run(run_dir: str | Path, out: str | Path, options: ExportOptions | None = None) -> ExportSummary:
    """Export a finished run (see the module docstring)."""
    options = options or ExportOptions()
    run, out = open_run(run_dir), Path(out)
    check_finished(run, options.allow_unfinished)
    formats = [get_format(f) for f in dict.fromkeys(options.formats)]
    if not formats:
        raise UserError("name at least one --format")
    finish_replacement(out)  # an export killed between its two renames left the old one aside
    check_output(out, "export", overwrite=options.overwrite)
    hub = None
    if options.push_to_hub is not None:
        from spasm.export.hub import HubTarget

        hub = HubTarget.prepare(options.push_to_hub, token_env=options.hub_token_env,
                                private=options.private, revision=options.revision,
                                endpoint=options.hub_endpoint)  # before the work: a bad id fails fast
    seats = group_seats(run)
    check_role(options.role, seats, run)
    columns = DIALOGUE_COLUMNS + CARD_COLUMNS + (["responder_role"] if seats else [])
    dialogues = run.table("dialogues", list(dict.fromkeys(columns)))
    check_selection(dialogues, options.selection)  # before the scan: a typo fails fast
    with RunLock(run.dir):  # the findings go into the run: one writer at a time
        qa = scan_run(run, near_threshold=options.near_threshold)
        write_qa(run.dir, qa, locked=True)
    index = turn_index(run)
    errors = run.table("errors", ["dialogue_id"]).column(0).to_pylist() if run.has("errors") else []
    people = human_dialogues(run)
    result = select(dialogues, qa, options.selection, errors, speakers=_speakers(index, seats),
                    role=select_role(options.role), people=people)
    if not result.kept:
        raise _selection_error(result)
    keep = pc.is_in(dialogues.column("dialogue_id"), value_set=pa.array(result.kept, pa.string()))
    kept = dialogues.filter(keep)
    run_seed = (run.config or {}).get("seed", run.manifest.get("seed", 0))
    seed = options.seed if options.seed is not None else int(run_seed or 0)
    splits = assign_splits(kept.column("persona_id").to_pylist(), options.split, seed)
    stage = out.parent / f".{out.name}.staging-{uuid.uuid4().hex[:8]}"
    try:
        built = _Builder(run, qa, kept, splits, options, stage / ".work", index).run_pass()
        names = [s for s in SPLIT_NAMES if s in built.chunks]
        fopts = FormatOptions(system_prompt=options.system_prompt, weights=options.weights,
                              group=bool(seats), names=built.named, tools=run.has("events"))
        configured = configured_format(formats)
        data = {(f.name, s): _write_format(f, s, built.chunks[s], fopts, stage, digest=f is configured)
                for f in formats for s in names}
        files = list(data.values())
        check = None
        if hub is not None or options.token_limit is not None:
            check = _check(built.chunks, names, fopts, options.token_limit)
        info = llamafactory_dataset_info(formats, names, data, weights=options.weights,
                                         tools=fopts.tools)
        if info:
            atomic_write_json(stage / "dataset_info.json", info)
            files.append("dataset_info.json")
        base = hub.repo_id if hub else out.as_posix()
        axolotl = axolotl_datasets(formats, names, data, base, hub=hub is not None, weights=options.weights)
        stats = card_stats(
            run, kept, built.utterances, built.words,
            examples=sum(v["examples"] for v in built.splits.values()),
            splits={s: SplitCount(personas=len(built.splits[s]["personas"]),
                                  conversations=built.splits[s]["conversations"],
                                  examples=built.splits[s]["examples"]) for s in names},
            qa=qa.summary, redactions=dict(sorted(built.redactions.items())), dropped=result.dropped,
            quarantined=result.quarantined, role=options.role,
            human_conversations=len(people & set(result.kept)), formats=[f.name for f in formats],
            license=options.license or str((run.config or {}).get("license") or "unknown"),
            language=options.language, system_prompt=options.system_prompt, ending=options.ending,
            trimmed_turns=built.trimmed, user_endings=built.user_endings,
            masks=MaskStats(weights=options.weights, untrained_turns=built.untrained_turns,
                            untrained_examples=built.untrained_examples,
                            sharegpt_cut=built.sharegpt_cut if options.weights else 0,
                            sharegpt_dropped=built.sharegpt_dropped if options.weights else 0),
            trainer_configs=sorted(info) if info else [],
            group=_group_stats(options.role, seats, set(result.kept), built) if seats else None,
        )
        card_text = render_card(stats, configs=hub_configs(formats, names, data), axolotl=axolotl)
        atomic_write_text(stage / "README.md", card_text)
        mark_output(stage, "export")  # so a later --overwrite may replace this, and only this
        # Not the scan's time: identical runs give identical exports (it is in the run's qa table).
        exclude: dict[str, Any] = {"qa": {"found_at"}, **({} if seats else {"group": True}),
                                   **({} if people else {"human_conversations": True}),
                                   **({} if options.ending == "keep" else {"user_endings": True})}
        atomic_write_json(stage / "card.json", stats.model_dump(mode="json", exclude=exclude))
        shutil.rmtree(stage / ".work", ignore_errors=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        _publish(stage, out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    summary = ExportSummary(out=str(out), files=["README.md", "card.json", *files], stats=stats,
                            check=check)
    if check is not None and not check.passed:
        raise RunError(f"the export in {out} fails OpenAI's chat fine-tuning checks"
                       + (": nothing was uploaded to the Hub" if hub is not None else "")
                       + "\n" + check.text())
    if hub is not None:
        summary.hub_url = hub.upload(out)
    return summary
