"""``spasm export`` as trainers take it: endings, masks in every format, the system prompt for
templates without a system role, LLaMA-Factory's and axolotl's configs, and ``--check`` as
OpenAI's data-preparation checks count."""

from __future__ import annotations

import hashlib
import json
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml

from spasm.cli import main
from spasm.dataset import open_run
from spasm.export.pipeline import ExportOptions
from tests.test_export import data_file
from tests.test_qa import generate_run

datasets = pytest.importorskip("datasets")


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_run(tmp_path_factory.mktemp("clean") / "run", plant=False)


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_run(tmp_path_factory.mktemp("planted") / "run", plant=True)


def export(run: Path, out: Path, *flags: str) -> int:
    return main(["export", str(run), "--out", str(out), "--split", "1", *flags])


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def card(out: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((out / "card.json").read_text())
    return data


def hf_rows(out: Path, split: str = "train") -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = pq.read_table(data_file(out, "data", split)).to_pylist()
    return rows


def axolotl_block(out: Path) -> dict[str, Any]:
    text = (out / "README.md").read_text(encoding="utf-8")
    block = text.split("**axolotl**", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    data: dict[str, Any] = yaml.safe_load(block)
    return data


# ------------------------------------------------------------------ what the trainers do, as tests

def llamafactory_sharegpt(example: dict[str, Any], attr: dict[str, Any]) -> list[dict[str, str]] | None:
    """LLaMA-Factory's ``SharegptDatasetConverter`` on one example: the aligned messages, or
    ``None`` where it logs "Skipping this abnormal example" (a role out of turn, or an odd
    number of messages after the system prompt)."""
    tags, messages = attr["tags"], example[attr["columns"]["messages"]]
    role, content = tags["role_tag"], tags["content_tag"]
    if messages and messages[0][role] == tags["system_tag"]:
        messages = messages[1:]
    accept = ((tags["user_tag"], "observation"), (tags["assistant_tag"], "function_call"))
    aligned = []
    for k, m in enumerate(messages):
        if m[role] not in accept[k % 2]:
            return None  # "Invalid role tag"
        aligned.append({"role": "user" if k % 2 == 0 else "assistant", "content": m[content]})
    if len(aligned) % 2 != 0:
        return None  # "Invalid message count"
    return aligned


def load_llamafactory(out: Path, name: str) -> Any:
    """An entry of the export's dataset_info.json loaded the way LLaMA-Factory loads a local file."""
    attr = json.loads((out / "dataset_info.json").read_text())[name]
    path = out / attr["file_name"]
    builder = {".jsonl": "json", ".parquet": "parquet"}[path.suffix]
    return attr, datasets.load_dataset(builder, data_files=str(path), split="train")


def axolotl_turns(example: dict[str, Any], entry: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """axolotl's ``chat_template`` strategy on one example: (role, content, trained) per turn,
    roles mapped through ``roles``, trained by ``message_field_training`` where a turn has it,
    else by ``roles_to_train``."""
    props, roles = entry["message_property_mappings"], entry["roles"]
    to_role = {v: k for k, values in roles.items() for v in values}
    out = []
    for m in example[entry["field_messages"]]:
        role = to_role[m[props["role"]]]  # a KeyError: a role axolotl would not know
        field = entry.get("message_field_training")
        flag = m.get(field) if field else None
        trained = bool(flag) if flag is not None else role in entry["roles_to_train"]
        out.append((role, m[props["content"]], trained))
    return out


# --------------------------------------------------------------------------- 1. endings

@pytest.mark.parametrize("role", ["responder", "client", "both"])
def test_every_example_ends_on_a_turn_of_the_role_it_trains_in_all_three_formats(
        clean: Path, tmp_path: Path, role: str) -> None:
    out = tmp_path / "out"
    assert export(clean, out, "--role", role) == 0
    openai, share, hf = lines(out / "openai" / "train.jsonl"), lines(out / "sharegpt" / "train.jsonl"), \
        hf_rows(out)
    assert len(openai) == len(share) == len(hf) == card(out)["examples"]
    for o, s, h in zip(openai, share, hf, strict=True):
        assert o["messages"][-1]["role"] == "assistant"
        assert s["conversations"][-1]["from"] == "gpt"
        assert h["messages"][-1]["role"] == "assistant"
        assert len(s["conversations"][1:]) % 2 == 0  # after the system prompt
    # The trimmed turns are exactly the partner's turns after the role's last one.
    turns = open_run(clean).turns
    roles = ["responder", "client"] if role == "both" else [role]
    expected = 0
    for _, t in turns.groupby("dialogue_id"):
        speakers = list(t.sort_values("turn_index").speaker)
        for who in roles:
            last = max(k for k, s in enumerate(speakers) if s == who)
            expected += len(speakers) - 1 - last
    stats = card(out)
    assert stats["ending"] == "trim" and stats["trimmed_turns"] == expected
    if role != "responder":
        assert expected > 0  # every client example had the Responder's last turn after its own
    assert f"are trimmed ({expected} turns)" in (out / "README.md").read_text()


def test_ending_keep_keeps_the_partners_last_turn_and_llamafactory_would_skip_those(
        clean: Path, tmp_path: Path) -> None:
    kept, trimmed = tmp_path / "kept", tmp_path / "trimmed"
    assert export(clean, kept, "--role", "client", "--ending", "keep") == 0
    assert export(clean, trimmed, "--role", "client") == 0
    assert card(kept)["ending"] == "keep" and card(kept)["trimmed_turns"] == 0
    assert all(e["messages"][-1]["role"] == "user" for e in lines(kept / "openai" / "train.jsonl"))
    attr, rows = load_llamafactory(kept, "spasm_sharegpt_train")
    assert all(llamafactory_sharegpt(r, attr) is None for r in rows)  # every one skipped
    attr, rows = load_llamafactory(trimmed, "spasm_sharegpt_train")
    assert all(llamafactory_sharegpt(r, attr) is not None for r in rows)  # none skipped
    assert "--ending keep" in (kept / "README.md").read_text()


# --------------------------------------------------------------------------- 2. --check

def _write(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _ok(*messages: tuple[str, str]) -> dict[str, Any]:
    return {"messages": [{"role": r, "content": c} for r, c in messages]}


def test_check_rejects_empty_content_and_names_its_line(tmp_path: Path, capsys: Any) -> None:
    path = _write(tmp_path / "f.jsonl", [
        _ok(("system", "s"), ("user", "hi"), ("assistant", "hello")),
        _ok(("system", "s"), ("user", ""), ("assistant", "hello")),
        _ok(("system", "s"), ("user", "hi"), ("assistant", "   ")),
    ])
    assert main(["export", "--check", str(path)]) == 1
    out = capsys.readouterr().out
    assert "FAILS" in out and "empty_content: 2 (lines 2, 3)" in out


def test_check_accepts_tool_and_function_roles(tmp_path: Path, capsys: Any) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    path = _write(tmp_path / "f.jsonl", [
        {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "weather?"},
                      {"role": "assistant", "content": None, "tool_calls": [call]},
                      {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
                      {"role": "assistant", "content": "It is sunny."}]},
        {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "weather?"},
                      {"role": "assistant", "function_call": {"name": "lookup", "arguments": "{}"}},
                      {"role": "function", "name": "lookup", "content": "sunny"},
                      {"role": "assistant", "content": "It is sunny."}]},
    ])
    assert main(["export", "--check", str(path)]) == 0, capsys.readouterr().out
    assert "passes the OpenAI chat fine-tuning format checks" in capsys.readouterr().out


def test_the_token_limit_only_warns_by_default_and_is_enforced_when_given(tmp_path: Path,
                                                                         capsys: Any) -> None:
    path = _write(tmp_path / "f.jsonl", [
        _ok(("system", "s"), ("user", "word " * 20_000), ("assistant", "ok")),  # 20k tokens
        _ok(("system", "s"), ("user", "word " * 70_000), ("assistant", "ok")),  # over 65,536
        _ok(("system", "s"), ("user", "short"), ("assistant", "ok")),
    ])
    assert main(["export", "--check", str(path)]) == 0
    out = capsys.readouterr().out
    assert "1 over 65,536 (a warning" in out and "over_token_limit: 1 (line 2)" in out
    assert main(["export", "--check", str(path), "--token-limit", "16385"]) == 1
    out = capsys.readouterr().out
    assert "2 over 16,385 (enforced)" in out and "over_token_limit: 2 (lines 1, 2)" in out
    assert main(["export", "--check", str(path), "--token-limit", "0"]) == 2


def test_check_counts_examples_missing_a_system_or_a_user_message(tmp_path: Path, capsys: Any) -> None:
    path = _write(tmp_path / "f.jsonl", [
        _ok(("system", "s"), ("user", "hi"), ("assistant", "hello")),
        _ok(("user", "hi"), ("assistant", "hello")),
        _ok(("system", "s"), ("assistant", "hello")),
        _ok(("user", "hi"), ("assistant", "hello")),
    ])
    assert main(["export", "--check", str(path)]) == 0
    out = capsys.readouterr().out
    assert "examples missing a system message: 2; missing a user message: 1" in out
    assert "missing_system_message: 2 (lines 2, 4)" in out and "missing_user_message: 1 (line 3)" in out


def test_an_export_with_a_token_limit_is_checked_and_fails_when_over_it(clean: Path, tmp_path: Path,
                                                                         capsys: Any) -> None:
    assert export(clean, tmp_path / "ok", "--format", "openai", "--token-limit", "100000") == 0
    assert "passes the OpenAI chat fine-tuning format checks" in capsys.readouterr().out
    assert export(clean, tmp_path / "over", "--format", "openai", "--token-limit", "5") == 1
    err = capsys.readouterr().err
    assert "fails OpenAI's chat fine-tuning checks" in err and "over_token_limit: 12" in err
    assert "Traceback" not in err


# --------------------------------------------------------------------------- 3. masks everywhere

def test_weights_reach_every_format(planted: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert export(planted, out, "--allow-qa", "ai_identity,prompt_leak", "--weights") == 0
    openai, share, hf = lines(out / "openai" / "train.jsonl"), lines(out / "sharegpt" / "train.jsonl"), \
        hf_rows(out)
    masks = card(out)["masks"]
    zero = [m for e in openai for m in e["messages"] if m.get("weight") == 0]
    assert masks["weights"] is True and masks["untrained_turns"] == len(zero) > 0
    # hf: the same weight in each message, and a parallel column one per message.
    for o, h in zip(openai, hf, strict=True):
        assert [m.get("weight") for m in o["messages"]] == [m["weight"] for m in h["messages"]]
        assert h["weights"] == [m.get("weight") or 0 for m in o["messages"]]
    loaded = datasets.load_dataset(str(out))["train"]
    assert loaded.num_rows == len(hf) and loaded[0]["weights"] == hf[0]["weights"]
    # ShareGPT: every gpt turn left is a trained one; examples are cut before a flagged turn or,
    # when it is their first, left out.
    trained = {(o["messages"][1]["content"], m["content"]) for o in openai for m in o["messages"]
               if m.get("weight") == 1}
    flagged_first = [o for o in openai
                     if next(m for m in o["messages"] if m["role"] == "assistant")["weight"] == 0]
    assert len(share) == len(openai) - len(flagged_first) == len(openai) - masks["sharegpt_dropped"]
    assert masks["sharegpt_cut"] + masks["sharegpt_dropped"] == masks["untrained_examples"]
    for s in share:
        conv = s["conversations"]
        assert all((conv[1]["value"], c["value"]) in trained for c in conv if c["from"] == "gpt")
        assert conv[-1]["from"] == "gpt"
    readme = (out / "README.md").read_text()
    assert f"{masks['sharegpt_cut']} examples are cut before their first flagged turn" in readme
    assert "a parallel column `weights`" in readme


def test_without_weights_the_card_says_flagged_turns_are_trained(planted: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert export(planted, out, "--allow-qa", "ai_identity,prompt_leak") == 0
    assert "weight" not in json.dumps(lines(out / "openai" / "train.jsonl"))
    assert "weights" not in pq.read_schema(data_file(out, "data")).names
    assert set(hf_rows(out)[0]["messages"][0]) == {"role", "content"}
    assert card(out)["masks"]["untrained_turns"] > 0
    readme = (out / "README.md").read_text()
    assert "are trained like the others: export with `--weights` to mask them" in readme


# --------------------------------------------------------------------------- 4. the system prompt

def test_system_prompt_merge_folds_it_into_the_first_user_message_in_every_format(
        clean: Path, tmp_path: Path, capsys: Any) -> None:
    kept, merged = tmp_path / "kept", tmp_path / "merged"
    assert export(clean, kept, "--role", "client") == 0
    assert export(clean, merged, "--role", "client", "--system-prompt", "merge") == 0
    for k, m in zip(lines(kept / "openai" / "train.jsonl"), lines(merged / "openai" / "train.jsonl"),
                    strict=True):
        system, first, *rest = k["messages"]
        assert system["role"] == "system" and first["role"] == "user"
        assert m["messages"] == [{"role": "user", "content": system["content"] + "\n\n" + first["content"]},
                                 *rest]
    share = lines(merged / "sharegpt" / "train.jsonl")
    hf = hf_rows(merged)
    # A template without a system role (Gemma's raises "System role not supported") takes them.
    assert all(c["from"] != "system" for s in share for c in s["conversations"])
    assert all(m["role"] != "system" for r in hf for m in r["messages"])
    assert card(merged)["system_prompt"] == "merge"
    assert "merged into the first `user` message" in (merged / "README.md").read_text()


def test_system_prompt_drop_is_the_old_no_system_prompt(clean: Path, tmp_path: Path, capsys: Any) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    assert export(clean, a, "--system-prompt", "drop") == 0
    assert export(clean, b, "--no-system-prompt") == 0
    for folder in ("openai", "sharegpt", "data"):
        assert data_file(a, folder).read_bytes() == data_file(b, folder).read_bytes()
    assert all(e["messages"][0]["role"] == "user" for e in lines(a / "openai" / "train.jsonl"))
    capsys.readouterr()
    assert export(clean, tmp_path / "c", "--no-system-prompt", "--system-prompt", "merge") == 2
    assert "disagree" in capsys.readouterr().err
    assert export(clean, tmp_path / "d", "--system-prompt", "fold") == 2
    assert export(clean, tmp_path / "e", "--ending", "cut") == 2
    assert "--ending 'cut': choose trim or keep" in capsys.readouterr().err
    # The library keeps reading the old boolean.
    assert ExportOptions(system_prompt=False).system_prompt == "drop"
    assert ExportOptions(system_prompt=True).system_prompt == "keep"


# --------------------------------------------------------------------------- 5. trainer configs

@pytest.mark.parametrize("role", ["responder", "client", "both"])
def test_llamafactory_loads_every_entry_of_dataset_info_without_skipping_an_example(
        clean: Path, tmp_path: Path, role: str) -> None:
    out = tmp_path / "out"
    assert main(["export", str(clean), "--out", str(out), "--role", role, "--split", "0.5,0.5"]) == 0
    info = json.loads((out / "dataset_info.json").read_text())
    splits = sorted(card(out)["splits"])
    assert sorted(info) == sorted(f"spasm_{f}_{s}" for f in ("openai", "sharegpt", "hf") for s in splits)
    assert card(out)["trainer_configs"] == sorted(info)
    for name, attr in info.items():
        assert attr["formatting"] == "sharegpt"
        attr, rows = load_llamafactory(out, name)
        assert rows.num_rows == card(out)["splits"][name.rsplit("_", 1)[1]]["examples"]
        for row in rows:
            aligned = llamafactory_sharegpt(row, attr)
            assert aligned is not None and aligned[-1]["role"] == "assistant"
    readme = (out / "README.md").read_text()
    assert "`dataset_info.json`" in readme and "`spasm_sharegpt_train`" in readme
    # The Hub config still loads the Parquet files alone.
    assert sorted(datasets.load_dataset(str(out))) == splits


def test_with_weights_dataset_info_lists_only_the_sharegpt_files(planted: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert export(planted, out, "--allow-qa", "ai_identity,prompt_leak", "--weights") == 0
    assert list(json.loads((out / "dataset_info.json").read_text())) == ["spasm_sharegpt_train"]
    assert "LLaMA-Factory reads no per-message weight" in (out / "README.md").read_text()


@pytest.mark.parametrize(("formats", "field"), [("openai,sharegpt,hf", "messages"),
                                                ("sharegpt", "conversations"), ("hf", "messages")])
def test_the_axolotl_block_loads_and_trains_only_the_roles_turns(
        planted: Path, tmp_path: Path, formats: str, field: str) -> None:
    out = tmp_path / "out"
    assert main(["export", str(planted), "--out", str(out), "--format", formats, "--split", "0.5,0.5",
                 "--allow-qa", "ai_identity,prompt_leak", "--weights"]) == 0
    block = axolotl_block(out)
    assert sorted(block) == ["datasets", "test_datasets"]
    for key, split in (("datasets", "train"), ("test_datasets", "validation")):
        [entry] = block[key]
        assert entry["type"] == "chat_template" and entry["field_messages"] == field
        rows = datasets.load_dataset(entry["ds_type"], data_files=entry["path"], split=entry["split"])
        assert rows.num_rows > 0
        jsonl = lines(out / "openai" / f"{split}.jsonl") if "openai" in formats else []
        openai = {tuple(m["content"] for m in e["messages"]) for e in jsonl}
        for row in rows:
            turns = axolotl_turns(row, entry)
            assert turns[-1][0] == "assistant"
            assert all(t[2] is (t[0] == "assistant") for t in turns if t[0] != "assistant")
            if field == "messages":  # per-message weights: a flagged turn is not trained
                for (role, _, trained), m in zip(turns, row[field], strict=True):
                    if role == "assistant":
                        assert trained is (m["weight"] == 1)
            if openai:
                assert tuple(t[1] for t in turns) in openai


def test_identical_exports_are_byte_identical_and_only_the_cards_paths_differ_elsewhere(
        clean: Path, tmp_path: Path) -> None:
    flags = ("--role", "both", "--weights", "--system-prompt", "merge")
    a, b = tmp_path / "a", tmp_path / "b"
    assert export(clean, a, *flags) == 0
    first = {p.relative_to(a): p.read_bytes() for p in a.rglob("*") if p.is_file()}
    assert export(clean, a, "--overwrite", *flags) == 0
    assert {p.relative_to(a): p.read_bytes() for p in a.rglob("*") if p.is_file()} == first
    assert export(clean, b, *flags) == 0
    other = {p.relative_to(b): p.read_bytes() for p in b.rglob("*") if p.is_file()}
    assert other.keys() == first.keys()
    assert [k for k in first if first[k] != other[k]] == [Path("README.md")]
    assert other[Path("README.md")] == first[Path("README.md")].replace(str(a).encode(), str(b).encode())


@pytest.mark.parametrize("fmt", ["openai,sharegpt,hf", "openai"])
def test_load_dataset_of_the_folder_sees_a_re_export_with_overwrite(
        clean: Path, tmp_path: Path, fmt: str) -> None:
    """``datasets`` caches a folder's ``configs`` by its data files' names: the
    files the card names carry their content's digest, so a re-export under --overwrite loads
    its own rows, not the earlier export's, with the same cache."""
    out, cache = tmp_path / "out", str(tmp_path / "hf-cache")
    assert export(clean, out, "--format", fmt) == 0
    first = datasets.load_dataset(str(out), cache_dir=cache)["train"]
    assert first[0]["messages"][0]["content"] == lines(data_file(out, "openai"))[0]["messages"][0]["content"]
    named = data_file(out, "data" if "hf" in fmt else "openai")
    header = yaml.safe_load((out / "README.md").read_text().split("---")[1])
    digest = hashlib.sha256(named.read_bytes()).hexdigest()[:12]
    assert named.stem.endswith(f"-{digest}")
    rel = f"{named.parent.name}/{named.name}"
    assert header["configs"][0]["data_files"] == [{"split": "train", "path": rel}]
    assert export(clean, out, "--format", fmt, "--overwrite", "--role", "client") == 0
    again = datasets.load_dataset(str(out), cache_dir=cache)["train"]
    client = lines(data_file(out, "openai"))
    assert [r["messages"] for r in again] == [e["messages"] for e in client]
    assert again[0]["messages"][0]["content"] != first[0]["messages"][0]["content"]  # the client's card
    assert not named.exists()  # the earlier export's file went with it


# --------------------------------------------------------------------------- 7. the smoke benchmark

@pytest.mark.skipif(find_spec("torch") is not None and find_spec("trl") is not None,
                    reason="torch and trl are installed: the benchmark would train")
def test_the_finetune_smoke_benchmark_skips_with_a_reason_without_torch_or_trl(capsys: Any) -> None:
    from benchmarks.finetune_smoke import main as smoke

    assert smoke([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("skipped: ") and ("torch" in out or "trl" in out) and "pip install" in out
