"""Persona separability on constructed embeddings where the answer is known."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from spasm.dataset.synthetic import write_run
from spasm.evaluation import evaluate, register_embedder
from spasm.evaluation.separability import separability_scores
from spasm.evaluation.testing import LookupEmbedder

register_embedder("lookup", LookupEmbedder)


def _clusters(
    n_personas: int, per: int, noise: float, seed: int = 0
) -> tuple[np.ndarray, list[str], dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    dim = 64
    centres = np.eye(dim)[:n_personas]
    vecs, labels = [], []
    for p in range(n_personas):
        for _ in range(per):
            vecs.append(centres[p] + noise * rng.standard_normal(dim))
            labels.append(f"p{p:02d}")
    cards = {f"p{p:02d}": centres[p].astype(np.float32) for p in range(n_personas)}
    return np.asarray(vecs, dtype=np.float32), labels, cards


@pytest.mark.parametrize("retrieval", ["card", "centroid"])
def test_perfectly_separated_clusters(retrieval: str) -> None:
    x, labels, cards = _clusters(10, 5, noise=0.01)
    s = separability_scores(x, labels, retrieval=retrieval, cards=cards)  # type: ignore[arg-type]
    assert s.silhouette is not None and s.silhouette > 0.95
    assert s.davies_bouldin is not None and s.davies_bouldin < 0.2
    assert s.intra_mean is not None and s.intra_mean < 0.01
    assert s.acc_at_k[0] == 1.0 and s.acc_at_k == [1.0] * 10
    assert s.random_at_k[0] == pytest.approx(0.1)  # 1/N with N = 10 personas
    assert s.n_queries == 50 and s.notes == []


@pytest.mark.parametrize("retrieval", ["card", "centroid"])
def test_shuffled_labels_are_at_chance(retrieval: str) -> None:
    x, labels, cards = _clusters(20, 20, noise=0.05)
    rng = np.random.default_rng(1)
    shuffled = list(rng.permutation(labels))
    s = separability_scores(x, shuffled, retrieval=retrieval, cards=cards)  # type: ignore[arg-type]
    assert s.silhouette is not None and abs(s.silhouette) < 0.1
    assert s.davies_bouldin is not None and s.davies_bouldin > 3
    for k, (acc, rand) in enumerate(zip(s.acc_at_k, s.random_at_k, strict=True), start=1):
        assert rand == pytest.approx(k / 20)
        assert acc == pytest.approx(k / 20, abs=0.08), f"Acc@{k}"


def test_degenerate_groups_report_null_with_a_reason() -> None:
    x, labels, cards = _clusters(1, 4, noise=0.1)
    s = separability_scores(x, labels, cards=cards)
    assert s.silhouette is None and s.davies_bouldin is None
    assert any("at least 2 personas" in n for n in s.notes)
    assert s.acc_at_k[0] == 1.0  # one candidate: trivially right

    x, labels, cards = _clusters(5, 1, noise=0.1)
    s = separability_scores(x, labels, cards=cards)
    assert s.silhouette is None and s.intra_mean is None
    assert s.acc_at_k[0] == 1.0  # the cards still identify them
    s = separability_scores(x, labels, retrieval="centroid")
    assert s.acc_at_k == [None] * 10 and s.n_queries == 0
    assert any("2+ conversations" in n for n in s.notes)


def test_separability_per_pairing_through_evaluate(tmp_path: Path) -> None:
    x, labels, cards = _clusters(4, 3, noise=0.01)
    table: dict[str, np.ndarray] = {}
    personas, dialogues = [], []
    for p in sorted(set(labels)):
        personas.append({"persona_id": p, "card": f"card of {p}", "concern": "c"})
        table[f"card of {p}"] = cards[p]
    for i, (vec, p) in enumerate(zip(x, labels, strict=True)):
        table[f"client {i}"] = vec
        for pairing in ("gpt/gpt", "gpt/deepseek"):
            dialogues.append(
                {
                    "dialogue_id": f"{pairing}-{i}",
                    "persona_id": p,
                    "pairing": pairing,
                    "conversation_index": i,
                    "texts": [f"client {i}", "ok"],
                }
            )
    write_run(tmp_path, personas, dialogues)
    m = evaluate(
        tmp_path, embedder="lookup", embedder_options={"table": table, "dim": 64}, write=False, progress=False
    )
    assert [(g.pairing, g.condition) for g in m.separability] == [("gpt/deepseek", "ecp"), ("gpt/gpt", "ecp")]
    for g in m.separability:
        assert g.n_conversations == 12 and g.n_personas == 4 and g.retrieval == "card"
        assert g.silhouette is not None and g.silhouette > 0.95
        assert g.acc_at_k[0] == 1.0 and g.random_at_k[0] == 0.25


def test_missing_cards_fall_back_to_centroids(tmp_path: Path) -> None:
    personas = [{"persona_id": "a"}, {"persona_id": "b"}]
    dialogues = [
        {"dialogue_id": f"d{i}", "persona_id": "ab"[i % 2], "conversation_index": i, "texts": [f"text {i}"]}
        for i in range(6)
    ]
    write_run(tmp_path, personas, dialogues)
    m = evaluate(tmp_path, embedder="lookup", write=False, progress=False)
    (g,) = m.separability
    assert g.retrieval == "centroid" and g.note and "no card" in g.note


def _foreign_run(path: Path, personas: dict[str, list[object]]) -> Path:
    """A run directory another tool wrote: three plain Parquet files, the personas table with
    only the columns given."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.mkdir()
    pq.write_table(pa.table(personas), path / "personas.parquet")
    ids = [f"d{i}" for i in range(6)]
    pq.write_table(pa.table({"dialogue_id": ids, "persona_id": ["ab"[i % 2] for i in range(6)],
                             "conversation_index": list(range(6))}), path / "dialogues.parquet")
    pq.write_table(pa.table({"dialogue_id": ids, "turn_index": [0] * 6, "speaker": ["client"] * 6,
                             "text": [f"text {i}" for i in range(6)]}), path / "turns.parquet")
    return path


def test_a_personas_table_of_ids_only_is_personas_without_cards(tmp_path: Path) -> None:
    run = _foreign_run(tmp_path / "ids", {"persona_id": ["a", "b"]})
    m = evaluate(run, embedder="lookup", write=False, progress=False)
    (g,) = m.separability
    assert m.counts.personas == 2
    assert g.retrieval == "centroid" and g.note and "2 persona(s) have no card" in g.note


def test_a_persona_index_that_is_no_integer_is_the_tables_error(tmp_path: Path) -> None:
    from spasm.errors import UserError

    run = _foreign_run(tmp_path / "bad", {"persona_id": ["a", "b"], "persona_index": ["0", "x"]})
    with pytest.raises(UserError, match=r"personas\.parquet: persona 'b': persona_index 'x' is not"):
        evaluate(run, embedder="lookup", write=False, progress=False)
