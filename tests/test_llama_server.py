"""spasm against a real OpenAI-compatible server that nobody here wrote: llama-cpp-python's own
``python -m llama_cpp.server`` serving the embedded SmolLM2 model on 127.0.0.1.

That server refuses ``response_format`` ``json_schema`` (HTTP 500) and takes ``json_object``
with a ``schema`` field; with ``structured_output: auto`` spasm must find that on its first
structured call and then run a level-E dialogue and an LLM-validated persona with no rejected
structured request.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import anyio
import pandas as pd
import pytest

from spasm.backends.embedded import default_threads, find_smollm2_gguf
from spasm.engine import Engine
from tests.conftest import config_from, endpoint_config

pytestmark = pytest.mark.e2e

pytest.importorskip("uvicorn", reason="needs llama-cpp-python[server] (in the dev extra)")
pytest.importorskip("starlette_context", reason="needs llama-cpp-python[server] (in the dev extra)")

#: How long the server may take to load the model before the test gives up (not a timing test:
#: it answers in a second or two; this only bounds a broken start).
START_LIMIT_S = 180.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The base URL of a llama.cpp server on a free loopback port; always killed afterwards."""
    port = _free_port()
    log_path = tmp_path_factory.mktemp("llama") / "server.log"
    # `python -m llama_cpp.server`, loading its model as the embedded backend does (without the
    # CPU's extra buffer types, which crash llama.cpp in a VM that reports AMX it does not have).
    launch = ("import runpy, sys; from spasm.backends.embedded import without_extra_buffer_types\n"
              "sys.argv[0] = 'llama_cpp.server'\n"
              "with without_extra_buffer_types():\n"
              "    runpy.run_module('llama_cpp.server', run_name='__main__', alter_sys=True)\n")
    command = [
        sys.executable, "-c", launch, "--model", str(find_smollm2_gguf()),
        "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "4096",
        "--n_threads", str(default_threads()),
    ]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + START_LIMIT_S
            while not _answers(f"http://127.0.0.1:{port}/v1/models"):
                if proc.poll() is not None or time.monotonic() > deadline:
                    tail = log_path.read_text(errors="replace")[-2000:]
                    pytest.fail(f"llama_cpp.server did not start (exit {proc.poll()}):\n{tail}")
                time.sleep(0.2)
            yield f"http://127.0.0.1:{port}/v1"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.mark.slow  # ~20k prompt tokens through a CPU llama.cpp: minutes on 2 cores
def test_a_level_e_dialogue_and_a_validated_persona_run_with_no_rejected_structured_call(
    llama_server: str, tmp_path: Path
) -> None:
    data = endpoint_config(
        llama_server,
        personas={"n": 1, "llm_validate": True},
        dialogue={"max_turns_per_agent": 2, "max_tokens": 32},
        termination={"rules": False},
        # The Client at level E makes every kind of structured call (policy, reducer, checker);
        # a plain Responder halves the prompt tokens a CPU llama.cpp has to process.
        harness={"client": "E", "responder": "A", "extract_policy": True,
                 "reducer_max_tokens": 160, "checker_max_tokens": 96,
                 # Any verdict passes: a 135M checker fails most drafts, and the rewrites would
                 # only add generation time, not another kind of structured call.
                 "pass_threshold": 0, "boundary_floor": 0},
    )
    data["backends"]["srv"].update(
        # A generous timeout: on a loaded 2-core machine one checker call can take a minute.
        model="smollm2", structured_output="auto", timeout_s=600, max_concurrency=1
    )
    run = tmp_path / "run"
    summary = anyio.run(Engine(config_from(data), run, progress=False, sleep_scale=0.0).run)
    assert summary.completed == summary.planned == 1 and summary.errors == 0, summary.line()
    assert summary.failed is None, summary.failed

    manifest = json.loads((run / "manifest.json").read_text())
    chosen = manifest["structured_output"]["srv"]
    # The server refused json_schema once (its own 500 and message); json_object was kept.
    assert chosen["mode"] == "json_object"
    assert [s["mode"] for s in chosen["rejected"]] == ["json_schema"]
    assert chosen["rejected"][0]["status"] == 500
    assert "Input should be 'text' or 'json_object'" in chosen["rejected"][0]["message"]

    calls = pd.read_parquet(run / "calls.parquet")
    structured = calls[calls.params.map(lambda p: json.loads(p)["structured"])]
    assert {"validator", "policy", "reducer", "checker"} <= set(structured.role)
    # No call was rejected for its format, and none failed at the transport at all.
    assert not (calls.outcome == "format_rejected").any()
    assert not calls.error.fillna("").str.contains("response_format").any()
    assert not (calls.outcome == "fatal").any()
    # Harness fallbacks can only come from the model's JSON (cut off at max_tokens), never from
    # the format; and at least some structured replies parsed (else the run would have failed).
    parsed = structured[structured.outcome == "ok"]
    assert len(parsed) > 0
    turns = pd.read_parquet(run / "turns.parquet")
    assert manifest["counts"]["harness_fallbacks_this_pass"] == int(turns.harness_fallbacks.sum())
    personas = pd.read_parquet(run / "personas.parquet")
    assert any(v["stage"] == "llm" for v in json.loads(personas.verdicts.iloc[0]))
