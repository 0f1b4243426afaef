"""`spasm import` of people's conversations (ShareGPT JSON/JSONL, OpenAI messages JSONL): a run
with human seats (format 1.10) that `spasm eval` reads and takes as --reference."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from spasm.dataset.importer import detect_format, import_conversations
from spasm.errors import UserError
from spasm.evaluation import evaluate, register_embedder
from spasm.evaluation.testing import LookupEmbedder

register_embedder("lookup", LookupEmbedder)

SHAREGPT = [
    {"id": "a1", "model": "gpt-4", "user_id": "alice", "conversations": [
        {"from": "system", "value": "Be helpful."},
        {"from": "human", "value": "Hi, my parcel never arrived and I am annoyed."},
        {"from": "gpt", "value": "Sorry to hear that. Could you share the order number?"},
        {"from": "human", "value": "It is 1234."},
        {"from": "human", "value": "Please hurry."},
        {"from": "gpt", "value": "Thanks, I have reshipped it."}]},
    {"id": "a2", "conversations": [
        {"from": "human", "value": "What is the capital of France?"},
        {"from": "gpt", "value": "Paris."}]},
]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "spasm", *args], capture_output=True, text=True,
                          check=False)


def test_a_sharegpt_array_is_a_run_with_human_client_seats(tmp_path: Path) -> None:
    src = tmp_path / "chats.json"
    src.write_text(json.dumps(SHAREGPT, indent=1))
    assert detect_format(src) == "sharegpt"
    proc = _cli("import", str(src), "--out", str(tmp_path / "run"))
    assert proc.returncode == 0, proc.stderr
    assert "Imported 2 dialogues, 2 people" in proc.stdout
    assert "1 system" in proc.stdout and "1 message(s) joined" in proc.stdout

    d = pd.read_parquet(tmp_path / "run" / "dialogues.parquet").set_index("dialogue_id")
    assert list(d.index) == ["a1", "a2"]
    assert set(d["client_kind"]) == {"human"} and set(d["responder_kind"]) == {"llm"}
    assert set(d["interface"]) == {"import"}
    assert d.loc["a1", "pairing"] == "human×gpt-4" and d.loc["a2", "pairing"] == "human×unknown"
    op = d.loc["a1", "operator"]
    assert op.startswith("op-") and len(op) == 9 and "alice" not in op  # a pseudonym, not the id
    assert d.loc["a1", "persona_id"] == op and d.loc["a2", "operator"] != op
    t = pd.read_parquet(tmp_path / "run" / "turns.parquet")
    a1 = t[t["dialogue_id"] == "a1"].sort_values("turn_index")
    assert list(a1["speaker"]) == ["client", "responder", "client", "responder"]
    assert a1["text"].iloc[2] == "It is 1234.\n\nPlease hurry."
    assert "typing_ms" in t.columns and t["typing_ms"].isna().all()  # not typed here
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["format"] == "sharegpt" and manifest["left_out"] == {"merged": 1, "system": 1}


def test_openai_messages_jsonl_and_sharegpt_jsonl(tmp_path: Path) -> None:
    src = tmp_path / "msgs.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in [
        {"messages": [{"role": "system", "content": "x"},
                      {"role": "user", "content": [{"type": "text", "text": "hello"},
                                                   {"type": "image_url", "image_url": {}}]},
                      {"role": "assistant", "content": "hi!"}], "user": "bob"},
        {"messages": [{"role": "user", "content": "book it"},
                      {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]},
                      {"role": "tool", "content": "{}"},
                      {"role": "assistant", "content": "Booked."}], "user": "bob"},
    ]) + "\n")
    summary = import_conversations(src, tmp_path / "run")
    assert summary["format"] == "openai" and summary["counts"]["personas"] == 1  # one person
    assert summary["left_out"] == {"empty": 1, "non_text_parts": 1, "system": 1, "tool": 1}
    d = pd.read_parquet(tmp_path / "run" / "dialogues.parquet")
    assert list(d["dialogue_id"]) == ["conv-0", "conv-1"] and d["operator"].nunique() == 1
    assert list(d["conversation_index"]) == [0, 1]
    t = pd.read_parquet(tmp_path / "run" / "turns.parquet")
    assert list(t["text"]) == ["hello", "hi!", "book it", "Booked."]

    jsonl = tmp_path / "sg.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in SHAREGPT) + "\n")
    assert import_conversations(jsonl, tmp_path / "run2")["counts"]["dialogues"] == 2
    m = evaluate(tmp_path / "run2", embedder="lookup", write=False, progress=False)
    assert m.counts.dialogues_ok == 2


@pytest.mark.parametrize(
    ("name", "text", "fmt", "message"),
    [
        ("a.jsonl", '{"messages": [{"role": "user", "content": "a"}]}\n'
         '{"messages": [{"role": "robot", "content": "x"}]}\n',
         "openai", r"a.jsonl:2: message 0 has role 'robot'"),
        ("b.jsonl", '{"messages": [{"role": "assistant", "content": "hi"}]}\n', "openai",
         r"b.jsonl:1: the conversation has no line of a person"),
        ("c.json", '[\n {"conversations": [{"from": "human", "value": "x"}]},\n'
         ' {"conversations": [{"value": "x"}]}\n]', "sharegpt", r"c.json:3: message 0 has no 'from'"),
        ("d.json", '[\n {"conversations": [{"from": "human", "value": "x"}]}\n'
         ' {"conversations": []}\n]', "sharegpt", r"d.json:3 is not valid JSON"),
        ("e.jsonl", '{"id": "x", "messages": [{"role": "user", "content": "a"}]}\n'
         '{"id": "x", "messages": [{"role": "user", "content": "b"}]}\n', "openai",
         r"e.jsonl:2 repeats the conversation id 'x' \(first on line 1\)"),
        ("f.jsonl", '{"messages": [{"role": "user", "content": 5}]}\n', "openai",
         r"f.jsonl:1: a message's content must be text"),
        ("g.jsonl", '{"turns": 1}\n', "auto", r"g.jsonl:1 is not a conversation spasm knows"),
        ("h.jsonl", '{"conversations": []}\n', "openai", r"h.jsonl:1 has no 'messages' list"),
    ],
)
def test_bad_input_names_the_file_and_line(tmp_path: Path, name: str, text: str, fmt: str,
                                           message: str) -> None:
    src = tmp_path / name
    src.write_text(text)
    with pytest.raises(UserError, match=message):
        import_conversations(src, tmp_path / "run", fmt=fmt)
    assert not (tmp_path / "run").exists()  # nothing left behind


def test_bad_input_through_the_cli_is_exit_2_without_a_traceback(tmp_path: Path) -> None:
    src = tmp_path / "x.jsonl"
    src.write_text('{"messages": [{"role": "user", "content": "a"}]}\nnot json\n')
    proc = _cli("import", str(src), "--out", str(tmp_path / "run"))
    assert proc.returncode == 2 and "x.jsonl:2 is not valid JSON" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = _cli("import", str(src), "--out", str(tmp_path / "run"), "--format", "csv")
    assert proc.returncode == 2 and "Unknown --format 'csv'" in proc.stderr
