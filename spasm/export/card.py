"""The dataset card: statistics computed from the run's tables, rendered as a Hub README.md.

:func:`card_stats` computes every number of the card from the tables (the kept dialogues of an
export, or all of a run for ``spasm card``), so a test can recompute each one; it is stored
beside the card as ``card.json``. :func:`render_card` writes the Markdown with the YAML header
the Hugging Face Hub reads (configs and splits, license, language, task categories, size
category).
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel

from spasm.dataset import Run
from spasm.export.qa import QASummary

__all__ = ["COVERAGE_FIELDS", "CardStats", "Coverage", "GroupStats", "MaskStats", "SplitCount", "card_stats",
           "size_category"]

#: Persona fields whose coverage of the schema's pools the card reports.
COVERAGE_FIELDS = ("occupation", "city", "domain", "emotion")


class Coverage(BaseModel):
    """How many of a schema pool's values the personas use."""

    field: str
    present: int
    #: Size of the schema's pool (``None``: the field is not a choice field of the schema).
    pool: int | None
    #: Values used that are not in the pool (imported or synthetic personas).
    outside_pool: int


class SplitCount(BaseModel):
    """The size of one split."""

    personas: int
    conversations: int
    examples: int


class Lengths(BaseModel):
    """Utterances per conversation."""

    min: int
    median: float
    mean: float
    max: int


class MaskStats(BaseModel):
    """Turns not to train on (flagged by the harness, or with a kept unredactable finding) and
    what each format does with them."""

    #: Whether the export masks them (``--weights``); without, they are trained everywhere.
    weights: bool
    #: Assistant turns with weight 0 in the examples, and the examples with at least one.
    untrained_turns: int
    untrained_examples: int
    #: ShareGPT has no per-message weight: examples cut before their first untrained turn, and
    #: examples not written because that turn is their first (0 without weights).
    sharegpt_cut: int = 0
    sharegpt_dropped: int = 0


class GroupStats(BaseModel):
    """A group export (format 1.7): whose frames its examples are and how the others' turns
    are named in them."""

    #: The participant ids exported (seat order) and each one's role.
    participants: list[str]
    roles: dict[str, str]
    #: How the run's frames named the other speakers: ``prefix`` ("Ana: …" in the content) and/or
    #: ``name_field`` (the message's ``name``; ShareGPT writes it as the prefix).
    speaker_names: list[str]
    #: Exported seats that never spoke in their dialogue (no example).
    silent_seats: int = 0
    #: Other participants' turns merged into the ``user`` message before them (roles alternate).
    merged_turns: int = 0
    #: Examples whose frame opened on the participant's own turn, given the opening instruction.
    openings_added: int = 0
    #: Examples LLaMA-Factory's ShareGPT reader keeps (roles alternate, an even count).
    llamafactory_kept: int = 0


class CardStats(BaseModel):
    """Everything the card states, each number from the tables."""

    title: str
    run: str
    personas: int
    conversations: int
    examples: int
    utterances: int
    words: int
    #: Token usage the API reported for these conversations (``dialogues`` table).
    prompt_tokens: int
    completion_tokens: int
    utterances_per_conversation: Lengths
    coverage: list[Coverage]
    #: Conversations per (pairing, client model, responder model).
    models: list[dict[str, Any]]
    temperatures: dict[str, dict[str, float]]
    t_max: int | None
    seed: int | None
    dialogue_seeds: int
    conditions: dict[str, int]
    harness_levels: dict[str, int]
    terminations: dict[str, int]
    splits: dict[str, SplitCount] = {}
    qa: QASummary | None = None
    #: Placeholders an export put in, by type.
    redactions: dict[str, int] = {}
    dropped: dict[str, int] = {}
    quarantined: int = 0
    #: Conversations with a person in a seat kept by ``--include-human`` (left out of the
    #: card.json of an export without them).
    human_conversations: int = 0
    role: str | None = None
    formats: list[str] = []
    #: ``keep``, ``merge`` (into the first user message) or ``drop``.
    system_prompt: str | None = None
    #: ``trim``: examples end on a turn of the role they train; ``keep``: as the dialogue ended.
    ending: str | None = None
    #: Partner turns trimmed from the ends of examples.
    trimmed_turns: int = 0
    #: ``--ending keep``: examples that end on a ``user`` message (left out of the card.json of
    #: other exports).
    user_endings: int = 0
    masks: MaskStats | None = None
    #: LLaMA-Factory dataset names in ``dataset_info.json``.
    trainer_configs: list[str] = []
    license: str = "unknown"
    language: str = "en"
    #: A group export's participants (``None``: a two-party run; left out of its card.json).
    group: GroupStats | None = None


def size_category(n: int) -> str:
    """The Hub's size category for ``n`` examples."""
    for bound, label in ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"),
                         (1_000_000, "100K<n<1M"), (10_000_000, "1M<n<10M")):
        if n < bound:
            return label
    return "10M<n<100M"


def _counts(values: list[Any]) -> dict[str, int]:
    return dict(sorted(Counter(str(v) for v in values).items()))


def _pools(run: Run) -> dict[str, set[str]]:
    from spasm.errors import ConfigError
    from spasm.personas.schema import ChoiceField, load_schema

    schema_file = ((run.config or {}).get("personas") or {}).get("schema_file")
    try:
        schema = load_schema(schema_file if schema_file and Path(schema_file).exists() else None)
    except ConfigError:
        return {}
    return {name: {c.value for c in spec.values} for name, spec in schema.fields.items()
            if isinstance(spec, ChoiceField)}


def _coverage(run: Run, persona_ids: set[str]) -> list[Coverage]:
    if not run.has("personas"):
        return []
    table = run.table("personas")
    pools = _pools(run)
    keep = pc.is_in(table.column("persona_id"), value_set=pa.array(sorted(persona_ids), pa.string()))
    table = table.filter(keep)
    out = []
    for name in COVERAGE_FIELDS:
        if name not in table.column_names:
            continue
        used = {str(v) for v in table.column(name).to_pylist() if v is not None}
        pool = pools.get(name)
        out.append(Coverage(field=name, present=len(used & pool) if pool else len(used),
                            pool=len(pool) if pool else None,
                            outside_pool=len(used - pool) if pool else 0))
    return out


def _temperatures(config: Mapping[str, Any] | None, pairings: Collection[str]) -> dict[str, dict[str, float]]:
    if not config:
        return {}
    backends = config.get("backends") or {}
    out: dict[str, dict[str, float]] = {}
    for pairing in sorted(pairings):
        client, _, responder = pairing.partition("/")
        c, r = backends.get(client), backends.get(responder)
        if c and r:
            out[pairing] = {"client": float(c["temperatures"]["client"]),
                            "responder": float(r["temperatures"]["responder"])}
    return out


def card_stats(
    run: Run,
    dialogues: pa.Table,
    utterances: Mapping[str, int],
    words: int,
    **extra: Any,
) -> CardStats:
    """The card's numbers for the ``dialogues`` rows given (those exported), with the number of
    utterances of each (as exported) and their total words. ``extra`` sets the export-only
    fields (``splits``, ``qa``, ``redactions``, ``dropped``, ``role``, ``formats``, …)."""
    ids = dialogues.column("dialogue_id").to_pylist()
    lengths = [utterances.get(d, 0) for d in ids] or [0]
    col = {c: dialogues.column(c).to_pylist() for c in dialogues.column_names}
    models = Counter(zip(col["pairing"], col["client_model"], col["responder_model"], strict=True))
    config = run.config
    seed = (config or {}).get("seed", run.manifest.get("seed"))
    return CardStats(
        title=extra.pop("title", f"spasm dialogues: {run.dir.name}"),
        run=run.dir.name,
        personas=len(set(col["persona_id"])),
        conversations=len(ids),
        examples=extra.pop("examples", len(ids)),
        utterances=sum(utterances.get(d, 0) for d in ids),
        words=words,
        prompt_tokens=int(pc.sum(dialogues.column("prompt_tokens")).as_py() or 0),
        completion_tokens=int(pc.sum(dialogues.column("completion_tokens")).as_py() or 0),
        utterances_per_conversation=Lengths(min=min(lengths), median=float(statistics.median(lengths)),
                                            mean=float(statistics.fmean(lengths)), max=max(lengths)),
        coverage=_coverage(run, set(col["persona_id"])),
        models=[{"pairing": p, "client_model": c, "responder_model": r, "conversations": n}
                for (p, c, r), n in sorted(models.items())],
        temperatures=_temperatures(config, set(col["pairing"])),
        t_max=((config or {}).get("dialogue") or {}).get("max_turns_per_agent"),
        seed=seed,
        dialogue_seeds=len(set(col["seed"])),
        conditions=_counts(col["condition"]),
        harness_levels=_counts(col["harness_level"]),
        terminations=_counts(col["termination_reason"]),
        **extra,
    )


#: The dialogues columns :func:`card_stats` reads.
CARD_COLUMNS = ["dialogue_id", "persona_id", "pairing", "client_model", "responder_model", "seed",
                "condition", "harness_level", "termination_reason", "prompt_tokens", "completion_tokens"]
