"""``spasm card RUN_DIR``: the dataset card of a whole run (every dialogue in its tables).

It only reads: the QA section comes from the run's ``qa`` table as the last ``spasm qa`` (or
``spasm export``) left it, and says so when there is none.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from spasm.dataset import Run, open_run
from spasm.export.card import CARD_COLUMNS, CardStats, card_stats
from spasm.export.card_render import render_card
from spasm.export.qa import QASummary, check_finished

__all__ = ["run_card", "run_card_stats"]


def _qa_summary(run: Run, n_dialogues: int, n_turns: int) -> QASummary | None:
    if not run.has("qa"):
        return None
    qa = run.table("qa", ["dialogue_id", "kind", "found_at"])
    kinds = qa.column("kind").to_pylist()
    pairs = set(zip(qa.column("dialogue_id").to_pylist(), kinds, strict=True))
    when = max(qa.column("found_at").to_pylist(), default=None)
    return QASummary(
        dialogues=n_dialogues, turns=n_turns, findings=dict(Counter(kinds)),
        dialogues_with=dict(Counter(k for _, k in pairs)),
        near_duplicates="as found by the last `spasm qa` scan (qa.parquet)", near_threshold=0.8,
        role_flips="as found by the last `spasm qa` scan (qa.parquet)",
        found_at=when or run.manifest.get("updated_at") or "1970-01-01T00:00:00Z",
    )


def run_card_stats(run: Run, *, license: str | None = None, language: str = "en") -> CardStats:
    """The card's numbers for every dialogue of ``run``."""
    utterances: Counter[str] = Counter()
    words = 0
    for batch in run.batches("turns", columns=["dialogue_id", "text"]):
        ids, texts = batch.column(0).to_pylist(), batch.column(1).to_pylist()
        utterances.update(ids)
        words += sum(len(t.split()) for t in texts if t)
    dialogues = run.table("dialogues", CARD_COLUMNS)
    return card_stats(
        run, dialogues, utterances, words,
        qa=_qa_summary(run, dialogues.num_rows, sum(utterances.values())),
        license=license or str((run.config or {}).get("license") or "unknown"), language=language,
    )


def run_card(
    run_dir: str | Path, *, allow_unfinished: bool = False, license: str | None = None, language: str = "en"
) -> str:
    """The run's card as Markdown (the Hub's YAML header, no data files)."""
    run = open_run(run_dir)
    check_finished(run, allow_unfinished)
    return render_card(run_card_stats(run, license=license, language=language))
