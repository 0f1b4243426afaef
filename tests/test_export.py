"""``spasm export``: formats from each role's perspective, redaction, selection, splits, the card."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from spasm.cli import main
from spasm.dataset import open_run
from spasm.dataset.synthetic import synthesize_run, write_run
from spasm.errors import UserError
from spasm.export.pipeline import ExportOptions, export_run
from spasm.export.scans import ScanContext, redact, scan_text
from spasm.export.split import assign_splits, parse_split, split_counts
from spasm.registry import FORMATS
from tests.test_qa import PLANTS, generate_run

PLACEHOLDER = {"email": "[EMAIL]", "phone": "[PHONE]", "url": "[URL]", "number": "[NUMBER]"}


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_run(tmp_path_factory.mktemp("planted") / "run", plant=True)


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_run(tmp_path_factory.mktemp("clean") / "run", plant=False)


@pytest.fixture(scope="module")
def forty(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A synthetic run of 48 personas × 4 dialogues."""
    return synthesize_run(tmp_path_factory.mktemp("forty") / "run", n_dialogues=192, n_personas=48)


def export(run: Path, out: Path, *flags: str) -> int:
    return main(["export", str(run), "--out", str(out), *flags])


def data_file(out: Path, folder: str, split: str = "train") -> Path:
    """An export's one data file of ``split`` under ``folder`` (``data`` for hf): the files the
    card's ``configs`` names carry a digest of their content in their name."""
    [path] = [p for p in (out / folder).iterdir() if p.name.startswith((f"{split}.", f"{split}-"))]
    return path


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def card(out: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((out / "card.json").read_text())
    return data


def every_file_text(out: Path) -> str:
    parts = [p.read_text(encoding="utf-8") for p in out.rglob("*.jsonl")]
    for p in out.rglob("*.parquet"):
        parts.append(json.dumps(pq.read_table(p).to_pylist(), default=str))
    return "\n".join(parts)


# --------------------------------------------------------------------------- openai format

@pytest.mark.parametrize("role", ["responder", "client", "both"])
def test_openai_export_passes_the_openai_format_checks(planted: Path, tmp_path: Path, role: str,
                                                        capsys: Any) -> None:
    out = tmp_path / "out"
    assert export(planted, out, "--format", "openai,hf", "--role", role, "--weights", "--split", "1") == 0
    path = out / "openai" / "train.jsonl"
    capsys.readouterr()
    assert main(["export", "--check", str(path)]) == 0
    assert "passes the OpenAI chat fine-tuning format checks" in capsys.readouterr().out
    run = open_run(planted)
    dialogues = run.dialogues.set_index("dialogue_id")
    turns = run.turns.sort_values(["dialogue_id", "turn_index"])
    examples = lines(path)
    meta = pq.read_table(data_file(out, "data")).to_pylist()  # same order
    assert len(examples) == len(meta) == card(out)["conversations"] * (2 if role == "both" else 1)
    assert {m["role"] for m in meta} == ({"responder", "client"} if role == "both" else {role})
    for ex, row in zip(examples, meta, strict=True):
        msgs = ex["messages"]
        assert set(ex) == {"messages"}
        assert {m["role"] for m in msgs} <= {"system", "user", "assistant"}
        assert all(isinstance(m["content"], str) and set(m) <= {"role", "content", "weight"} for m in msgs)
        who = row["role"]
        system = dialogues.loc[row["dialogue_id"], f"{who}_system_prompt"]
        assert msgs[0] == {"role": "system", "content": system}
        # The role's own turns are the assistant messages, in order, redacted.
        mine = turns[(turns.dialogue_id == row["dialogue_id"]) & (turns.speaker == who)].text
        expected = [redact(t, scan_text(t, ScanContext()))[0] for t in mine]
        assert [m["content"] for m in msgs if m["role"] == "assistant"] == expected
        assert all(m["weight"] == 1 for m in msgs if m["role"] == "assistant")
        assert "weight" not in {k for m in msgs if m["role"] != "assistant" for k in m}


def test_the_exported_frame_is_exactly_what_the_agent_saw(clean: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert export(clean, out, "--format", "openai", "--role", "both", "--split", "1") == 0
    run = open_run(clean)
    examples = lines(data_file(out, "openai"))
    checked = 0
    for did in run.dialogues[run.dialogues.condition == "ecp"].dialogue_id:
        view = run.dialogue(did)
        for who in ("client", "responder"):
            last = max(t["turn_index"] for t in view.turns if t["speaker"] == who)
            seen = view.seen(last)
            assert seen.verified is True
            example = next(e for e in examples if e["messages"][: len(seen.messages)] == seen.messages)
            assert example["messages"][len(seen.messages)] == {"role": "assistant",
                                                               "content": view.turns[last]["text"]}
            checked += 1
    assert checked == 12


def test_the_client_perspective_has_the_persona_card_as_system_prompt(clean: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert export(clean, out, "--format", "openai,sharegpt", "--role", "client", "--split", "1") == 0
    run = open_run(clean)
    cards = set(run.personas.card)
    for ex in lines(data_file(out, "openai")):  # the first JSONL format: the card's configs
        system, opening = ex["messages"][0]["content"], ex["messages"][1]
        assert any(c in system for c in cards) and "Do not give advice" in system
        assert opening["role"] == "user" and opening["content"].startswith("The conversation starts now")
        assert ex["messages"][2]["role"] == "assistant"
    share = lines(out / "sharegpt" / "train.jsonl")
    assert [c["from"] for c in share[0]["conversations"][:4]] == ["system", "human", "gpt", "human"]
    assert main(["export", str(clean), "--out", str(tmp_path / "o2"), "--format", "openai",
                 "--no-system-prompt", "--split", "1"]) == 0
    assert all(e["messages"][0]["role"] == "user" for e in lines(data_file(tmp_path / "o2", "openai")))


def test_check_reports_every_kind_of_problem(tmp_path: Path, capsys: Any) -> None:
    bad = tmp_path / "bad.jsonl"
    good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    rows = [json.dumps(good), "{not json", json.dumps({"messages": [], "extra": 1}),
            json.dumps({"messages": [{"role": "robot", "content": "x"},
                                     {"role": "assistant", "content": 3}]}),
            json.dumps({"messages": [{"role": "user", "content": "only a user"}]}),
            json.dumps({"messages": [{"role": "user", "content": "a", "weight": 1},
                                     {"role": "assistant", "content": "b", "weight": 2}]}),
            json.dumps({"messages": [{"role": "user", "content": "word " * 50},
                                     {"role": "assistant", "content": "ok"}]})]
    bad.write_text("\n".join(rows) + "\n")
    assert main(["export", "--check", str(bad), "--token-limit", "40"]) == 1
    out = capsys.readouterr().out
    for problem in ("invalid_json", "unknown_key:extra", "missing_messages_list", "unrecognized_role:robot",
                    "missing_or_non_string_content", "example_missing_assistant_message", "bad_weight",
                    "over_token_limit"):
        assert problem in out, problem
    assert main(["export", "--check", str(tmp_path / "missing.jsonl")]) == 2


# --------------------------------------------------------------------------- redaction and QA

def test_planted_strings_are_redacted_counted_on_the_card_and_leaky_dialogues_dropped(
        planted: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert export(planted, out) == 0
    text = every_file_text(out)
    for _, _, needle in PLANTS:
        assert needle not in text, needle
    stats = card(out)
    qa = open_run(planted).df("qa")
    leaky = qa[qa.kind.isin(["ai_identity", "prompt_leak"])].dialogue_id.unique()
    kept_ids = set(open_run(planted).dialogues.dialogue_id) - set(leaky)
    contact = qa[qa.kind.isin(list(PLACEHOLDER)) & qa.dialogue_id.isin(kept_ids)]
    assert stats["redactions"] == contact.kind.value_counts().to_dict()
    assert sum(stats["redactions"].values()) > 0 and set(stats["redactions"]) == set(PLACEHOLDER)
    assert stats["conversations"] == len(kept_ids)
    ai = set(qa[qa.kind == "ai_identity"].dialogue_id)
    leak_only = set(qa[qa.kind == "prompt_leak"].dialogue_id) - ai
    assert stats["dropped"] == {"qa:ai_identity": len(ai), "qa:prompt_leak": len(leak_only)}
    readme = (out / "README.md").read_text()
    for kind, placeholder in PLACEHOLDER.items():
        assert f"| {placeholder} | {stats['redactions'][kind]} |" in readme
    assert f"| qa:ai_identity | {len(ai)} |" in readme
    for placeholder in PLACEHOLDER.values():
        assert placeholder in text


def test_kept_findings_are_trained_with_weight_zero(planted: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert export(planted, out, "--format", "openai", "--allow-qa", "ai_identity,prompt_leak", "--weights",
                  "--split", "1") == 0
    assert card(out)["dropped"] == {}
    weights = {}
    for ex in lines(data_file(out, "openai")):
        for m in ex["messages"]:
            if m["role"] == "assistant":
                weights[m["content"]] = m["weight"]
    assert any("As an AI language model" in c for c in weights)
    for content, w in weights.items():
        leaked = "As an AI language model" in content or "care and competence" in content
        assert w == (0 if leaked else 1), content
    assert main(["export", "--check", str(data_file(out, "openai"))]) == 0


# --------------------------------------------------------------------------- hf and splits

@pytest.mark.e2e
def test_hf_export_loads_with_datasets_and_no_persona_is_in_two_splits(forty: Path, tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    out = tmp_path / "out"
    assert export(forty, out, "--format", "hf", "--split", "0.8,0.1,0.1", "--seed", "3") == 0
    loaded = datasets.load_dataset(str(out))
    assert sorted(loaded) == ["test", "train", "validation"]
    stats = card(out)
    personas = {}
    for name, split in loaded.items():
        assert split.num_rows == stats["splits"][name]["examples"]
        first = split[0]["messages"]
        assert [m["role"] for m in first[:3]] == ["user", "assistant", "user"]  # no stored system prompt
        assert set(first[0]) == {"role", "content"}
        personas[name] = set(split["persona_id"])
        assert len(personas[name]) == stats["splits"][name]["personas"]
    assert sum(len(p) for p in personas.values()) == len(set().union(*personas.values())) == 48
    assert [len(personas[s]) for s in ("train", "validation", "test")] == [38, 5, 5]
    # Seeded and deterministic: the same seed writes the same bytes, another seed other splits.
    assert export(forty, tmp_path / "again", "--format", "hf", "--split", "0.8,0.1,0.1", "--seed", "3") == 0
    for f in (out / "data").iterdir():
        assert f.read_bytes() == (tmp_path / "again" / "data" / f.name).read_bytes()
    assert export(forty, tmp_path / "other", "--format", "hf", "--split", "0.8,0.1,0.1", "--seed", "4") == 0
    other_test = pq.read_table(next((tmp_path / "other" / "data").glob("test-*")))
    other = set(other_test.column("persona_id").to_pylist())
    assert other != personas["test"]
    header = yaml.safe_load((out / "README.md").read_text().split("---")[1])
    assert header["configs"][0]["config_name"] == "default"
    assert header["size_categories"] == ["n<1K"] and header["task_categories"] == ["text-generation"]


def test_split_assignment_is_seeded_by_persona_and_fractions_are_checked() -> None:
    ids = [f"p{i}" for i in range(41)]
    a = assign_splits(ids, (0.9, 0.05, 0.05), 1)
    assert a == assign_splits(list(reversed(ids)), (0.9, 0.05, 0.05), 1)
    assert a != assign_splits(ids, (0.9, 0.05, 0.05), 2)
    sizes = pd.Series(a).value_counts().to_dict()
    assert sizes == {"train": 37, "validation": 2, "test": 2}
    assert split_counts(3, (0.9, 0.05, 0.05)) == [1, 1, 1]
    assert split_counts(2, (0.5, 0.5)) == [1, 1] and split_counts(10, (1.0,)) == [10]
    for bad in ("0.5,0.6", "1,0,0,0", "x", "-0.1,1.1", "0,1"):
        with pytest.raises(UserError):
            parse_split(bad)


# --------------------------------------------------------------------------- selection

def _mixed_run(path: Path) -> Path:
    personas = [{"persona_id": f"p{i}", "card": f"You are person {i}."} for i in range(4)]
    specs = [("ecp", "a/a", "natural_rule", "ok", 6), ("concat", "a/a", "max_turns", "ok", 8),
             ("ecp", "a/b", "max_turns", "ok", 4), ("ecp", "a/a", "error", "error", 3),
             ("concat", "a/b", "natural_rule", "ok", 10), ("ecp", "a/a", "natural_rule", "ok", 2)]
    dialogues = [{"dialogue_id": f"d{i}", "persona_id": f"p{i % 4}", "condition": c, "pairing": p,
                  "termination_reason": r, "status": s,
                  "texts": [f"dialogue {i} line {k} about thing number {k * 7 + i}" for k in range(n)]}
                 for i, (c, p, r, s, n) in enumerate(specs)]
    return write_run(path, personas, dialogues)


@pytest.mark.parametrize(("flags", "kept", "dropped"), [
    ([], 5, {"failed": 1}),
    (["--include-failed"], 6, {}),
    (["--condition", "ecp"], 3, {"failed": 1, "condition": 2}),
    (["--condition", "ecp", "--pairing", "a/a"], 2, {"failed": 1, "condition": 2, "pairing": 1}),
    (["--termination", "max_turns,error", "--include-failed"], 3, {"termination_reason": 3}),
    (["--min-utterances", "4", "--max-utterances", "8"], 3, {"failed": 1, "min_utterances": 1,
                                                           "max_utterances": 1}),
])
def test_selection_filters_and_counts_each_drop_by_reason(tmp_path: Path, flags: list[str], kept: int,
                                                          dropped: dict[str, int]) -> None:
    run = _mixed_run(tmp_path / "run")
    out = tmp_path / "out"
    assert export(run, out, "--split", "1", *flags) == 0
    stats = card(out)
    assert stats["conversations"] == kept and stats["dropped"] == dropped


# --------------------------------------------------------------------------- the card

def test_every_card_number_recomputes_from_the_tables(clean: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert export(clean, out, "--license", "cc-by-4.0") == 0
    stats = card(out)
    run = open_run(clean)
    d, t, p = run.dialogues, run.turns, run.personas
    assert stats["personas"] == d.persona_id.nunique() == len(p)
    assert stats["conversations"] == len(d) and stats["examples"] == len(d)
    assert stats["utterances"] == len(t) == d.n_utterances.sum()
    assert stats["words"] == t.text.str.split().str.len().sum()
    assert stats["prompt_tokens"] == d.prompt_tokens.sum()
    assert stats["completion_tokens"] == d.completion_tokens.sum()
    n = t.groupby("dialogue_id").size()
    assert stats["utterances_per_conversation"] == {"min": n.min(), "median": n.median(), "mean": n.mean(),
                                                    "max": n.max()}
    assert stats["terminations"] == d.termination_reason.value_counts().to_dict()
    assert stats["conditions"] == d.condition.value_counts().to_dict()
    assert stats["t_max"] == 4 and stats["seed"] == 7
    assert stats["models"] == [{"pairing": "srv/srv", "client_model": "m", "responder_model": "m",
                                "conversations": 12}]
    coverage = {c["field"]: c for c in stats["coverage"]}
    assert coverage["occupation"]["present"] == p.occupation.nunique() and coverage["emotion"]["pool"] == 12
    assert sum(s["conversations"] for s in stats["splits"].values()) == len(d)
    assert stats["qa"]["findings"] == {} and stats["license"] == "cc-by-4.0"
    header = yaml.safe_load((out / "README.md").read_text().split("---")[1])
    assert header["license"] == "cc-by-4.0" and header["language"] == ["en"]
    # `spasm card` describes the whole run with the same numbers.
    card_file = tmp_path / "CARD.md"
    assert main(["card", str(clean), "--out", str(card_file)]) == 0
    text = card_file.read_text()
    assert f"| utterances | {len(t)} |" in text and f"| personas | {len(p)} |" in text
    assert f"| words | {stats['words']:,} |" in text


# --------------------------------------------------------------------------- bad input

@pytest.mark.parametrize(("flags", "message"), [
    (["--format", "csv"], "unknown export format 'csv'"),
    (["--role", "judge"], "--role 'judge'"),
    (["--min-utterances", "1000"], "the selection leaves no dialogue"),
    (["--condition", "nope"], "--condition nope matches no dialogue"),
    (["--allow-qa", "typo"], "unknown finding kind(s) typo"),
    (["--split", "0.5,0.2"], "must add up to 1"),
    (["--echoing", "only"], "--echoing only needs echoing signals"),
])
def test_bad_input_exits_2_with_a_clear_message_and_writes_nothing(
        clean: Path, tmp_path: Path, capsys: Any, flags: list[str], message: str) -> None:
    out = tmp_path / "out"
    assert export(clean, out, *flags) == 2
    assert message in capsys.readouterr().err
    assert not out.exists() and not list(tmp_path.glob(".out*"))


def test_an_existing_output_or_an_unfinished_run_is_refused(clean: Path, tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert export(clean, out) == 2
    assert "exists and is not empty" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    # --overwrite replaces only an earlier export, never the user's files.
    assert export(clean, out, "--overwrite", "--format", "openai") == 2
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    (out / "keep.txt").unlink()
    assert export(clean, out, "--format", "openai") == 0
    assert export(clean, out, "--overwrite", "--format", "openai") == 0
    assert data_file(out, "openai").exists()
    assert export(clean, clean) == 2
    unfinished = _mixed_run(tmp_path / "unfinished")
    manifest = json.loads((unfinished / "manifest.json").read_text())
    (unfinished / "manifest.json").write_text(json.dumps({**manifest, "status": "running"}))
    capsys.readouterr()
    assert export(unfinished, tmp_path / "o2") == 2
    assert "not a finished run (manifest status: running)" in capsys.readouterr().err
    assert main(["qa", str(unfinished)]) == 2 and main(["card", str(unfinished)]) == 2
    assert export(unfinished, tmp_path / "o2", "--allow-unfinished") == 0


def test_a_failure_midway_leaves_no_half_written_output(clean: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from spasm.export import formats

    out = tmp_path / "out"
    assert export(clean, out, "--format", "openai") == 0
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}

    def broken(example: Any, options: Any) -> dict[str, Any]:
        raise OSError("disk full")

    monkeypatch.setitem(FORMATS._entries, "hf", formats.ExportFormat("hf", "parquet", broken, "broken"))
    with pytest.raises(OSError, match="disk full"):
        export_run(clean, out, ExportOptions(overwrite=True))
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
