"""docs/architecture.md, "Adding an extension", done as it says: one of each of a metric, a
projection, an export format and a backend, each through the files the doc names and nothing
else, and each then used the way the doc claims.

The metric is added to a copy of spasm (the doc's edits, applied to the copy's files) and
evaluated in a subprocess that imports that copy: the test checks that the files it had to
change are those the doc's bullet lists, and that the metric reaches metrics.json,
per_dialogue.parquet, compare.json and the report. The projection, format and backend are a
tiny plugin distribution (tests/test_plugins.py's ``install``), which is what the doc's
bullets write minus the edits to spasm's own files."""

from __future__ import annotations

import filecmp
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import pandas as pd
import pytest

import spasm
import spasm.plugins
from spasm.cli import main
from spasm.dataset.synthetic import synthesize_run
from spasm.engine import Engine
from spasm.evaluation import evaluate, register_embedder
from spasm.evaluation.testing import LookupEmbedder
from spasm.testing import TestServer
from tests.conftest import config_from, endpoint_config
from tests.test_plugins import install, isolated

__all__ = ["isolated"]  # a fixture of tests/test_plugins.py, used here by name

register_embedder("lookup", LookupEmbedder)

DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"
SPASM = Path(spasm.__file__).resolve().parent


def _bullet(kind: str) -> str:
    """The text of the doc's "* **<kind>**" bullet (up to the next bullet or paragraph)."""
    text = DOC.read_text(encoding="utf-8")
    match = re.search(rf"^\* \*\*{re.escape(kind)}\*\*(.*?)(?=^\* |^\S|\Z)", text, re.S | re.M)
    assert match, f"docs/architecture.md has no '* **{kind}**' bullet"
    return " ".join(match.group(1).split())


# -- a metric ---------------------------------------------------------------------------------

#: The metric's own module: the share of Client utterances that ask a question, per dialogue
#: and per condition.
QUESTIONS_PY = '''
"""Questions: the share of the Client's utterances that end with a question mark."""

from __future__ import annotations

from spasm.evaluation.loader import Conversation
from spasm.evaluation.metrics import QuestionMetrics, QuestionStat
from spasm.evaluation.stats import finite, mean_ci
from spasm.registry import ordered_conditions


def question_rates(convs: list[Conversation]) -> dict[str, dict[str, float]]:
    out = {}
    for c in convs:
        client = [t for t, side in zip(c.texts, c.sides, strict=True) if side == "client"]
        asked = sum(t.rstrip().endswith("?") for t in client)
        out[c.dialogue_id] = {"question_rate": asked / len(client) if client else float("nan")}
    return out


def question_metrics(convs: list[Conversation], rates: dict[str, dict[str, float]]) -> QuestionMetrics:
    stats = []
    for condition in ordered_conditions({c.condition for c in convs}):
        values = [rates[c.dialogue_id]["question_rate"] for c in convs if c.condition == condition]
        mean, low, high, n = mean_ci(values)
        stats.append(QuestionStat(condition=condition, n=n, mean=finite(mean), ci_low=finite(low),
                                  ci_high=finite(high)))
    return QuestionMetrics(stats=stats)
'''

#: The doc's edits, as (file under spasm/, the line it goes before or after, the text).
METRIC_EDITS: list[tuple[str, str, str, str]] = [
    ("evaluation/metrics.py", "before", "class Metrics(_Model):\n", '''class QuestionStat(_Model):
    condition: str
    n: int
    mean: float | None
    ci_low: float | None
    ci_high: float | None


class QuestionMetrics(_Model):
    """Share of Client utterances that ask a question."""

    stats: list[QuestionStat]


'''),
    ("evaluation/metrics.py", "before", "    timings: dict[str, float] = Field(",
     '    questions: QuestionMetrics | None = Field(None, description="Client questions")\n'),
    ("evaluation/pipeline.py", "after", "from spasm.evaluation.leaks import leak_stage\n",
     "from spasm.evaluation.questions import question_metrics, question_rates\n"),
    ("evaluation/pipeline.py", "before", "#: The stages of :func:`evaluate`, in the order they run",
     '''def _questions_stage(s: EvalState) -> bool:
    rates = question_rates(s.convs)
    s.fields["questions"] = question_metrics(s.convs, rates)
    s.add_columns(pd.DataFrame.from_dict(rates, orient="index"))
    return True


'''),
    ("evaluation/pipeline.py", "after", '    Stage("outcomes", _outcomes_stage),\n',
     '    Stage("questions", _questions_stage),\n'),
    ("evaluation/report.py", "before", "#: The report's sections, in page order",
     '''def _questions_section(ctx: ReportContext) -> str:
    q = ctx.metrics.questions
    if q is None:
        return ""
    rows = [[s.condition, s.n, s.mean, _ci(s.ci_low, s.ci_high)] for s in q.stats]
    return "\\n<h2>Client questions</h2>" + _table(["condition", "dialogues", "share", "95% CI"], rows)


'''),
    ("evaluation/report.py", "before", "    _paired_section,\n", "    _questions_section,\n"),
    ("evaluation/compare.py", "after", '    "goal_met",\n', '    "question_rate",\n'),
]

EVALUATE_PY = '''
import sys
from spasm.evaluation import evaluate, register_embedder
from spasm.evaluation.testing import LookupEmbedder

register_embedder("lookup", LookupEmbedder)
evaluate(sys.argv[1], embedder="lookup", progress=False)
'''


def _edited_copy(root: Path) -> Path:
    """spasm copied under ``root`` with the metric added as the doc says."""
    copy = root / "spasm"
    shutil.copytree(SPASM, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "evaluation" / "questions.py").write_text(QUESTIONS_PY, encoding="utf-8")
    for rel, where, anchor, text in METRIC_EDITS:
        path = copy / rel
        source = path.read_text(encoding="utf-8")
        assert source.count(anchor) == 1, f"{rel}: the anchor {anchor!r} is not there once"
        path.write_text(source.replace(anchor, text + anchor if where == "before" else anchor + text),
                        encoding="utf-8")
    return copy


def _changed_files(original: Path, copy: Path) -> tuple[set[str], set[str]]:
    """Files of ``copy`` that differ from ``original``'s, and files only ``copy`` has."""
    changed: set[str] = set()
    added: set[str] = set()
    for path in copy.rglob("*.py"):
        rel = path.relative_to(copy).as_posix()
        mine = original / rel
        if not mine.is_file():
            added.add(rel)
        elif not filecmp.cmp(path, mine, shallow=False):
            changed.add(rel)
    return changed, added


@pytest.mark.e2e
def test_a_metric_added_as_the_doc_says_touches_its_files_and_reaches_every_output(tmp_path: Path) -> None:
    copy = _edited_copy(tmp_path / "tree")
    changed, added = _changed_files(SPASM, copy)
    bullet = _bullet("A metric")
    named = set(re.findall(r"`(evaluation/[a-z_]+\.py)", bullet))
    # The files the doc names are the files the metric changed: its model, its stage, its
    # section, and (when conditions are compared on it) its column; plus its own module.
    assert changed == named, (changed, bullet)
    assert added == {"evaluation/questions.py"}
    assert len(changed - {"evaluation/compare.py"}) == 3

    run = synthesize_run(tmp_path / "run", n_dialogues=12, n_personas=3)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(copy.parent), *sys.path])}
    # cwd: not the checkout, whose spasm `python -c` would import before the copy.
    done = subprocess.run([sys.executable, "-c", EVALUATE_PY, str(run)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, check=False, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]

    metrics = json.loads((run / "eval" / "metrics.json").read_text())
    per_dialogue = pd.read_parquet(run / "eval" / "per_dialogue.parquet")
    turns = pd.read_parquet(run / "turns.parquet")
    client = turns[turns.speaker == "client"]
    expected = client.groupby("dialogue_id").text.apply(lambda t: t.str.rstrip().str.endswith("?").mean())
    got = per_dialogue.set_index("dialogue_id").question_rate
    assert got.sort_index().to_list() == pytest.approx(expected.sort_index().to_list())
    by_condition = {s["condition"]: s["mean"] for s in metrics["questions"]["stats"]}
    conditions = per_dialogue.condition
    assert list(by_condition) == ["ecp", "concat"]
    assert by_condition == pytest.approx(
        {c: got[per_dialogue.set_index("dialogue_id").condition == c].mean() for c in set(conditions)})
    assert "questions" in metrics["timings"]  # the stage's time, under its name
    comparison = json.loads((run / "eval" / "compare.json").read_text())
    assert "question_rate" in comparison["metrics"]
    assert {c["metric"] for c in comparison["contrasts"]} >= {"question_rate"}
    page = (run / "eval" / "report.html").read_text()
    assert page.index("<h2>Client questions</h2>") < page.index("<h2>Every metric, paired</h2>")

    # The same run evaluated by spasm itself: every other output is what it was.
    plain = tmp_path / "plain"
    shutil.copytree(run, plain, ignore=shutil.ignore_patterns("eval"))
    evaluate(plain, embedder="lookup", progress=False)
    mine = json.loads((plain / "eval" / "metrics.json").read_text())
    for m in (metrics, mine):
        for key in ("run_dir", "created_at", "timings", "counts"):
            m.pop(key)
    assert {k: v for k, v in metrics.items() if k != "questions"} == mine
    pd.testing.assert_frame_equal(per_dialogue.drop(columns="question_rate"),
                                  pd.read_parquet(plain / "eval" / "per_dialogue.parquet"))


# -- a projection, an export format and a backend ------------------------------------------

HOWTO = textwrap.dedent('''
    """A projection, an export format and a backend, each as docs/architecture.md says."""
    from spasm.backends import Backend, Completion, register_backend
    from spasm.export import register_format
    from spasm.projection import ecp, register_projection


    @register_backend("howto_parrot")
    class Parrot(Backend):
        """Turns a ChatRequest into a Completion; nothing else."""

        def __init__(self, name, cfg):
            self.name, self.model = name, cfg.model
            self.max_concurrency = cfg.max_concurrency

        async def complete(self, request):
            heard = request.messages[-1]["content"]
            return Completion(text=f"I hear you: {heard[:40]}", prompt_tokens=5, completion_tokens=6,
                              resolved_model="parrot-1")


    @register_projection("howto_shouted")
    def shouted(history, viewer):
        return [{**m, "content": m["content"].upper()} if m["role"] != "system" else m
                for m in ecp(history, viewer)]


    @register_format("howto_lines", layout="jsonl", description="one line per dialogue")
    def lines(example, options):
        return {"text": " | ".join(m["content"] for m in example.messages)}
''')


@pytest.mark.e2e
def test_a_projection_format_and_backend_added_as_the_doc_says_are_used_with_no_other_change(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolated: None,
        capsys: pytest.CaptureFixture[str]) -> None:
    for kind in ("A backend kind", "A projection (condition)", "An export format"):
        assert "register_" in _bullet(kind)
    install(tmp_path / "site", "spasm-howto", "spasm_howto", HOWTO, "howto = spasm_howto")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    with TestServer() as srv:
        data = endpoint_config(srv.base_url, personas={"n": 2}, conditions=["howto_shouted", "ecp"],
                               dialogue={"max_turns_per_agent": 2, "max_tokens": 30})
        data["backends"]["parrot"] = {"kind": "howto_parrot", "model": "parrot"}
        data["pairings"] = [{"client": "srv", "responder": "parrot"}]
        config = config_from(data)  # the config checks kind: and conditions: by name
        summary = anyio.run(Engine(config, tmp_path / "run", progress=False, sleep_scale=0.0).run)
        seen = [m["content"] for body in srv.requests for m in body["messages"] if m["role"] == "user"]
    assert summary.completed == summary.planned == 4, summary.line()
    assert spasm.plugins.loaded_plugins() == ["howto"]
    run = tmp_path / "run"

    # The backend: its calls went through spasm's call path, so the call log has them.
    calls = pd.read_parquet(run / "calls.parquet")
    parrot = calls[calls.backend == "parrot"]
    assert len(parrot) > 0 and set(parrot.resolved_model) == {"parrot-1"} and set(parrot.prompt_tokens) == {5}
    # The projection: what the Client saw in the plugin's condition is upper-cased.
    dialogues = pd.read_parquet(run / "dialogues.parquet")
    assert set(dialogues.condition) == {"ecp", "howto_shouted"}
    assert any(text.startswith("I HEAR YOU: ") for text in seen)
    assert any(text.startswith("I hear you: ") for text in seen)  # ECP's frames are as they were
    # Its place in every table: after the built-in conditions.
    metrics = evaluate(run, embedder="lookup", progress=False)
    assert [r.condition for r in metrics.echoing.rates] == ["ecp", "howto_shouted"]

    # The format: `spasm export` writes every registered format when none is named.
    assert main(["export", str(run), "--out", str(tmp_path / "out")]) == 0, capsys.readouterr().err
    lines = [json.loads(x) for f in (tmp_path / "out" / "howto_lines").glob("*.jsonl") for x in f.open()]
    assert lines and all(" | " in x["text"] for x in lines)
    # The built-in ones too: hf's Parquet files are the dataset's data/ folder.
    assert {"openai", "sharegpt", "data"} <= {p.name for p in (tmp_path / "out").iterdir()}

