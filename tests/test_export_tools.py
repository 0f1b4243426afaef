"""Export that trains tool use, on a run of agents that act written through
the run store (tests/tool_run.py): openai ``tools`` + ``tool_calls`` + ``tool`` messages,
ShareGPT with LLaMA-Factory's ``function_call``/``observation`` turns and ``tools`` column
(named in dataset_info.json), hf messages a tools-aware chat template renders, ``--check`` on
call ids, arguments against the schema and results following calls; training the Client keeps
the Client's own calls and never shows it the Responder's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd
import pytest

from spasm.cli import main
from spasm.export.tooluse import tool_perspective, tool_problems
from spasm.history import Event
from spasm.projection import Viewer
from tests.tool_run import IDS, write_tool_run


def _export(run: Path, out: Path, role: str, *extra: str) -> int:
    return main(["export", str(run), "--out", str(out), "--role", role, "--split", "1,0,0",
                 "--echoing", "keep", *extra])


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("export-tools")
    run = write_tool_run(tmp / "run")
    out = {}
    for role in ("client", "responder"):
        assert _export(run, tmp / role, role, "--weights") == 0
        out[role] = tmp / role
    return out


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _by_dialogue(out: Path, fmt: str = "openai") -> dict[str, dict[str, Any]]:
    records = _jsonl(out / fmt / "train.jsonl")
    hf = pd.read_parquet(next((out / "data").glob("train-*.parquet")))
    order = hf.dialogue_id.tolist()  # the formats write the examples in one order
    assert len(records) == len(order)
    return dict(zip(order, records, strict=True))


def test_training_the_client_keeps_its_own_calls_and_never_the_responders(
    exported: dict[str, Path]
) -> None:
    examples = _by_dialogue(exported["client"])
    for record in examples.values():
        assert [t["function"]["name"] for t in record["tools"]] == ["check_bank_app"]
        text = json.dumps(record)
        assert "lookup_order" not in text and "reship_order" not in text
        calls = [m for m in record["messages"] if "tool_calls" in m]
        assert [c["function"]["name"] for m in calls for c in m["tool_calls"]] == ["check_bank_app"]
        assert all(m["role"] == "assistant" and "content" not in m and m["weight"] == 1
                   for m in calls)
        [result] = [m for m in record["messages"] if m["role"] == "tool"]
        assert result["tool_call_id"] == calls[0]["tool_calls"][0]["id"]
        assert json.loads(result["content"]) == {"last_payment": "49.90"}
        # The Responder's lookup reaches the Client only as its notice.
        assert any("[The agent is looking up your order]" in m["content"]
                   for m in record["messages"] if m["role"] == "user")
    # The lookup's result (the tracking number) is in no ECP-dialogue example of the Client.
    assert "TRK-99812" not in json.dumps(examples[IDS["ecp"]])


def test_the_responders_examples_hold_its_calls_results_and_schemas(
    exported: dict[str, Path]
) -> None:
    examples = _by_dialogue(exported["responder"])
    record = examples[IDS["ecp"]]
    assert sorted(t["function"]["name"] for t in record["tools"]) == ["lookup_order",
                                                                      "reship_order"]
    lookup = record["tools"][0]["function"]["parameters"]
    assert lookup["required"] == ["order_id"]
    roles = [m["role"] for m in record["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "user", "assistant",
                     "tool", "assistant"]
    assert "check_bank_app" not in json.dumps(record)  # the Client's own action stays its own
    assert record["messages"][-1]["content"] == "Done: I have sent it again."


def test_sharegpt_alternates_as_llamafactory_requires_and_names_the_tools_column(
    exported: dict[str, Path]
) -> None:
    for role, out in exported.items():
        info = json.loads((out / "dataset_info.json").read_text())
        assert list(info) == ["spasm_sharegpt_train"]
        entry = info["spasm_sharegpt_train"]
        assert entry["columns"] == {"messages": "conversations", "tools": "tools"}
        assert entry["tags"]["function_tag"] == "function_call"
        assert entry["tags"]["observation_tag"] == "observation"
        for record in _jsonl(out / "sharegpt" / "train.jsonl"):
            turns = [t["from"] for t in record["conversations"]]
            assert turns[0] == "system"
            for i, who in enumerate(turns[1:]):  # human/observation odd, gpt/function_call even
                assert who in (("human", "observation") if i % 2 == 0 else ("gpt", "function_call"))
            assert turns[-1] == "gpt"
            assert isinstance(json.loads(record["tools"]), list)
            for t in record["conversations"]:
                if t["from"] == "function_call":
                    call = json.loads(t["value"])
                    assert set(call) == {"name", "arguments"} and isinstance(call["arguments"], dict)
        if role == "client":
            values = [t["value"] for r in _jsonl(out / "sharegpt" / "train.jsonl")
                      for t in r["conversations"] if t["from"] == "function_call"]
            assert {json.loads(v)["name"] for v in values} == {"check_bank_app"}


#: A chat template in the shape of the Hub's tools-aware ones (Qwen2.5, Llama 3.1): ``tools``
#: in the system turn, an assistant's ``tool_calls`` by function name and arguments, ``tool``
#: messages by their call id.
TEMPLATE = """{% if tools %}<tools>{% for t in tools %}{{ t.function.name }};{% endfor %}</tools>
{% endif %}{% for m in messages %}<{{ m.role }}>{% if m.tool_calls %}{% for c in m.tool_calls %}\
<call id={{ c.id }}>{{ c.function.name }}({{ c.function.arguments }})</call>{% endfor %}\
{% elif m.role == 'tool' %}<result for={{ m.tool_call_id }}>{{ m.content }}</result>\
{% else %}{{ m.content }}{% endif %}</{{ m.role }}>
{% endfor %}"""


def test_hf_messages_render_through_a_tools_aware_chat_template(exported: dict[str, Path]) -> None:
    hf = pd.read_parquet(next((exported["responder"] / "data").glob("train-*.parquet")))
    row = hf[hf.dialogue_id == IDS["ecp"]].iloc[0]
    messages = [{k: v for k, v in m.items() if v is not None} for m in row.messages.tolist()]
    for m in messages:
        if "tool_calls" in m:
            m["tool_calls"] = [dict(c, function=dict(c["function"])) for c in m["tool_calls"]]
    tools = json.loads(row.tools)
    text = jinja2.Environment().from_string(TEMPLATE).render(messages=messages, tools=tools)
    assert "<tools>lookup_order;reship_order;</tools>" in text
    assert '<call id=call_1>lookup_order({"order_id":"A-1001"})</call>' in text
    assert '<result for=call_1>{"status":"shipped","tracking":"TRK-99812"}</result>' in text
    assert list(row.weights) == [0, 0, 1, 0, 1, 0, 1, 0, 1]


def test_check_passes_the_export_and_names_each_tool_problem(
    exported: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = exported["responder"] / "openai" / "train.jsonl"
    assert main(["export", "--check", str(good)]) == 0
    record = _jsonl(good)[0]

    def broken(change: Any) -> dict[str, Any]:
        copy = json.loads(json.dumps(record))
        change(copy)
        return copy

    def call(r: dict[str, Any]) -> dict[str, Any]:
        m = next(m for m in r["messages"] if "tool_calls" in m)
        first: dict[str, Any] = m["tool_calls"][0]
        return first

    def drop_result(r: dict[str, Any]) -> None:
        r["messages"] = [m for m in r["messages"] if m["role"] != "tool"]

    cases = {
        "tool_arguments_not_json": lambda r: call(r)["function"].update(arguments="{order"),
        "tool_arguments_off_schema": lambda r: call(r)["function"].update(
            arguments='{"order_id": 5}'),
        "unknown_tool": lambda r: call(r)["function"].update(name="drop_table"),
        "tool_call_without_id": lambda r: call(r).update(id=""),
        "tool_call_without_result": drop_result,
        "tool_result_without_call": lambda r: r["messages"].insert(
            1, {"role": "tool", "tool_call_id": "nope", "content": "{}"}),
    }
    for kind, change in cases.items():
        problems = tool_problems(broken(change))
        assert any(p.startswith(kind) for p in problems), (kind, problems)
        bad = tmp_path / f"{kind}.jsonl"
        bad.write_text(json.dumps(broken(change)) + "\n", encoding="utf-8")
        assert main(["export", "--check", str(bad)]) == 1
        assert kind in capsys.readouterr().out
    two = broken(lambda r: None)
    m = next(m for m in two["messages"] if "tool_calls" in m)
    m["tool_calls"].append(dict(m["tool_calls"][0]))
    assert "duplicate_tool_call_id" in tool_problems(two)
    assert tool_problems(record) == []


def test_the_calls_of_an_untrained_turn_carry_its_weight() -> None:
    events = [Event("tool_call", "responder", 1, ("responder",), "c1", "lookup", "{}"),
              Event("tool_result", "responder", 1, ("responder",), "c1", "lookup", result="1"),
              Event("tool_call", "responder", 3, ("responder",), "c2", "lookup", "{}"),
              Event("tool_result", "responder", 3, ("responder",), "c2", "lookup", result="2")]
    turns = [(0, "client", "a"), (1, "responder", "b"), (2, "client", "c"), (3, "responder", "d")]
    messages = tool_perspective(turns, events, Viewer("responder", "sys"), untrained={3})
    weights = [(m["role"], "tool_calls" in m, m.get("weight")) for m in messages
               if m["role"] == "assistant"]
    assert weights == [("assistant", True, 1), ("assistant", False, 1), ("assistant", True, 0),
                       ("assistant", False, 0)]


def test_an_export_of_a_run_whose_tool_module_is_gone_is_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = write_tool_run(tmp_path / "run")
    (tmp_path / "shop_tools.py").unlink()
    assert _export(run, tmp_path / "out", "responder") == 2
    err = capsys.readouterr().err
    assert "shop_tools.py" in err and "the directory the run was generated in" in err
    assert "Traceback" not in err
