"""`spasm import` of people's conversations (ShareGPT JSON/JSONL, OpenAI messages JSONL): a run
with human seats (format 1.10) that `spasm eval` reads and takes as --reference."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

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


@pytest.mark.e2e
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


@pytest.mark.e2e
def test_bad_input_through_the_cli_is_exit_2_without_a_traceback(tmp_path: Path) -> None:
    src = tmp_path / "x.jsonl"
    src.write_text('{"messages": [{"role": "user", "content": "a"}]}\nnot json\n')
    proc = _cli("import", str(src), "--out", str(tmp_path / "run"))
    assert proc.returncode == 2 and "x.jsonl:2 is not valid JSON" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = _cli("import", str(src), "--out", str(tmp_path / "run"), "--format", "csv")
    assert proc.returncode == 2 and "Unknown --format 'csv'" in proc.stderr


def _attr(key: str, value: Any) -> dict[str, Any]:
    kind = "intValue" if isinstance(value, int) else "stringValue"
    return {"key": key, "value": {kind: str(value) if kind == "intValue" else value}}


def _span(session: str, start: int, inputs: list[dict[str, Any]], reply: str,
          **extra: Any) -> dict[str, Any]:
    return {"traceId": f"t{start}", "spanId": f"s{start}", "name": "chat gpt-4o",
            "startTimeUnixNano": str(start), "endTimeUnixNano": str(start + 1),
            "attributes": [_attr("gen_ai.operation.name", "chat"), _attr("session.id", session),
                           _attr("gen_ai.request.model", "gpt-4o"),
                           _attr("gen_ai.input.messages", json.dumps(inputs)),
                           _attr("gen_ai.output.messages", json.dumps(
                               [{"role": "assistant", "parts": [{"type": "text", "content": reply}],
                                 "finish_reason": "stop"}])),
                           *[_attr(k, v) for k, v in extra.items()]]}


def _msg(role: str, text: str) -> dict[str, Any]:
    return {"role": role, "parts": [{"type": "text", "content": text}]}


def test_opentelemetry_genai_spans_are_grouped_by_session_into_conversations(tmp_path: Path) -> None:
    sys_msg, u1, u2 = _msg("system", "You are a shop."), _msg("user", "Where is my parcel?"), \
        _msg("user", "It is order 77.")
    a1 = _msg("assistant", "Which order?")
    spans = [
        # Out of order in the file: the session's calls are put in time order.
        _span("chat-1", 200, [sys_msg, u1, a1, u2], "Order 77 ships today.", **{"user.id": "carol"}),
        _span("chat-1", 100, [sys_msg, u1], "Which order?"),
        _span("chat-2", 150, [_msg("user", "Hi")], "Hello! How can I help?"),
        {"traceId": "t9", "spanId": "s9", "name": "GET /orders", "startTimeUnixNano": "120",
         "attributes": [_attr("http.method", "GET")]},
    ]
    doc = {"resourceSpans": [{"resource": {"attributes": [_attr("service.name", "shop")]},
                              "scopeSpans": [{"scope": {"name": "openai"}, "spans": spans}]}]}
    src = tmp_path / "traces.json"
    src.write_text(json.dumps(doc, indent=2))  # pretty-printed: one document over many lines
    assert detect_format(src) == "otlp"
    summary = import_conversations(src, tmp_path / "run")
    assert summary["format"] == "otlp" and summary["counts"]["dialogues"] == 2
    assert summary["left_out"]["no_messages"] == 1  # the HTTP span
    d = pd.read_parquet(tmp_path / "run" / "dialogues.parquet").set_index("dialogue_id")
    assert set(d.index) == {"chat-1", "chat-2"}
    assert d.loc["chat-1", "pairing"] == "human×gpt-4o" and d.loc["chat-1", "client_kind"] == "human"
    assert d.loc["chat-1", "interface"] == "import"
    t = pd.read_parquet(tmp_path / "run" / "turns.parquet")
    chat1 = t[t["dialogue_id"] == "chat-1"].sort_values("turn_index")
    assert list(chat1["text"]) == ["Where is my parcel?", "Which order?", "It is order 77.",
                                   "Order 77 ships today."]
    assert list(chat1["speaker"]) == ["client", "responder", "client", "responder"]

    # One document per line (the collector's file exporter) works the same.
    jsonl = tmp_path / "traces.jsonl"
    jsonl.write_text(json.dumps(doc) + "\n" + json.dumps({"resourceSpans": []}) + "\n")
    assert import_conversations(jsonl, tmp_path / "run2")["counts"]["dialogues"] == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(doc) + "\n" + json.dumps({"resourceSpans": [{"scopeSpans": [
        {"spans": [_span("x", 1, [u1], "ok") | {"startTimeUnixNano": "soon"}]}]}]}) + "\n")
    with pytest.raises(UserError, match=r"bad.jsonl:2: startTimeUnixNano 'soon' is not a number"):
        import_conversations(bad, tmp_path / "run3", fmt="otlp")


NESTED_LANGFUSE = Path(__file__).parent / "data" / "langfuse_nested_export.jsonl"


def test_a_nested_langfuse_export_keeps_only_the_generation_that_answered_each_line(tmp_path: Path) -> None:
    """tests/data/langfuse_nested_export.jsonl is traces as Langfuse's API returns them (one a
    line, newest first, observations inlined out of order, with usage, costs and scores): each
    turn a root span holding the answer and, around it, a question rewritten for retrieval, a
    retrieval span with an event, a tool call and its tool span before the answer, a moderation
    check of the reply inside a guardrail span, an answer two spans deep; one trace without its
    output, one listed with its observations' ids only. Every rewrite, tool-call step and check
    would otherwise be a turn of the person or of the bot."""
    assert detect_format(NESTED_LANGFUSE) == "langfuse"
    summary = import_conversations(NESTED_LANGFUSE, tmp_path / "run")
    assert summary["counts"] == {"personas": 3, "dialogues": 3, "turns": 12}
    # The condensed question and the tool-call step of turn 2, the moderation check of turn 3.
    assert summary["left_out"] == {"intermediate_generations": 3, "not_a_generation": 11}
    t = pd.read_parquet(tmp_path / "run" / "turns.parquet").sort_values(["dialogue_id", "turn_index"])
    texts = {d: list(g["text"]) for d, g in t.groupby("dialogue_id")}
    assert texts["sess-anna-7"] == [
        "Hi, I ordered a lamp last week and it still has not arrived.",
        "Sorry to hear that! Could you give me the order number?",
        "It is 48213.", "Order 48213 is delayed at the depot; it should arrive by Friday.",
        "ok thanks, bye", "You're welcome, have a good day!"]
    assert texts["sess-ben-2"][::2] == ["can I return a rug I bought 40 days ago?",
                                        "no it just does not fit the room"]
    assert texts["sess-cleo-1"] == ["do you ship to Norway?", "Yes, to Norway in 5 to 7 working days."]
    assert set(t[t.turn_index % 2 == 0]["speaker"]) == {"client"}
    d = pd.read_parquet(tmp_path / "run" / "dialogues.parquet").set_index("dialogue_id")
    assert d.loc["sess-anna-7", "pairing"] == "human×gpt-4o-mini-2024-07-18"
    assert d.loc["sess-anna-7", "client_kind"] == "human" and d.loc["sess-anna-7", "interface"] == "import"


@pytest.mark.e2e
def test_a_langfuse_export_of_generations_is_grouped_by_session(tmp_path: Path) -> None:
    records = [
        {"id": "o2", "type": "GENERATION", "traceId": "tr1", "sessionId": "s-1", "userId": "dan",
         "startTime": "2026-01-01T10:00:05Z", "model": "claude-x",
         "input": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                   {"role": "assistant", "content": "Hello."},
                   {"role": "user", "content": "Cancel my plan."}],
         "output": {"role": "assistant", "content": "Done, it is cancelled."}},
        {"id": "o1", "type": "GENERATION", "traceId": "tr1", "sessionId": "s-1", "userId": "dan",
         "startTime": "2026-01-01T10:00:00Z", "model": "claude-x",
         "input": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
         "output": "Hello."},
        {"id": "o3", "type": "SPAN", "traceId": "tr1", "sessionId": "s-1", "name": "retrieval"},
    ]
    src = tmp_path / "langfuse.json"
    src.write_text(json.dumps(records))
    assert detect_format(src) == "langfuse"
    summary = import_conversations(src, tmp_path / "run")
    assert summary["counts"]["dialogues"] == 1 and summary["left_out"]["not_a_generation"] == 1
    t = pd.read_parquet(tmp_path / "run" / "turns.parquet").sort_values("turn_index")
    assert list(t["text"]) == ["Hi", "Hello.", "Cancel my plan.", "Done, it is cancelled."]
    d = pd.read_parquet(tmp_path / "run" / "dialogues.parquet")
    assert d["dialogue_id"].tolist() == ["s-1"] and d["pairing"].tolist() == ["human×claude-x"]
    proc = _cli("import", str(src), "--out", str(tmp_path / "run"), "--force")
    assert proc.returncode == 0 and "1 not_a_generation" in proc.stdout
