"""Plugins through the ``spasm.plugins`` entry-point group: a tiny distribution installed into
a temporary directory on ``sys.path`` registers a backend, a projection, a termination detector
and a QA scan with spasm's own decorators, and a run uses all four; others register a format,
an embedder, a tool and a next-speaker policy that Python finds by name without the CLI; a
broken plugin is a clear error naming its entry point (exit 2)."""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import anyio
import pandas as pd
import pytest
import yaml

import spasm.plugins
from spasm.cli import build_parser, main, resolve_config
from spasm.config import parse_config
from spasm.dataset import open_run
from spasm.dataset.synthetic import synthesize_run
from spasm.engine import Engine
from spasm.errors import ConfigError
from spasm.evaluation import evaluate
from spasm.export.pipeline import ExportOptions, export_run
from spasm.export.qa import scan_run
from spasm.export.scans import ScanContext, scan_text
from spasm.plugins import PluginError, load_plugins
from spasm.registry import (
    BACKENDS,
    DETECTORS,
    EMBEDDERS,
    FORMATS,
    NEXT_SPEAKERS,
    PROJECTIONS,
    SCANS,
    TOOLS,
    condition_rank,
    ordered_conditions,
)
from spasm.testing import TestServer
from tests.conftest import config_from, endpoint_config

PLUGIN = textwrap.dedent('''
    """A demo plugin: a backend, a projection, a detector (on import) and a scan (register())."""
    from spasm.backends import Backend, Completion, register_backend
    from spasm.export import register_scan
    from spasm.export.scans import Finding
    from spasm.projection import ecp, register_projection
    from spasm.termination import Stop, register_detector


    @register_backend("demo_echo")
    class EchoBackend(Backend):
        def __init__(self, name, cfg):
            self.name, self.model = name, cfg.model
            self.max_concurrency = cfg.max_concurrency

        async def complete(self, request):
            last = request.messages[-1]["content"]
            return Completion(text=f"A banana for you ({len(last)} characters heard).",
                              prompt_tokens=7, completion_tokens=4, resolved_model="echo-1")


    @register_projection("mirror")
    def mirror(history, viewer):
        messages = ecp(history, viewer)
        messages[0] = {"role": "system", "content": messages[0]["content"] + " [mirror]"}
        return messages


    class SixStop:
        name = "six"

        async def check(self, history, scope):
            if len(history) >= 6:
                return Stop("demo_six", f"{len(history)} utterances")
            return None


    @register_detector("six")
    def six(setup):
        return SixStop()


    def register():
        @register_scan("banana")
        def banana(text, ctx):
            i = text.lower().find("banana")
            return [] if i < 0 else [Finding("banana", i, i + 6, text[i:i + 6])]
''')


def install(site: Path, dist: str, module: str, source: str, entry_points: str) -> None:
    """A distribution as pip leaves it: the module and a ``*.dist-info`` with its metadata."""
    site.mkdir(parents=True, exist_ok=True)
    (site / f"{module}.py").write_text(source)
    info = site / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[spasm.plugins]\n{entry_points}\n")


@pytest.fixture
def isolated(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Registries and the plugin loader as they are now, restored afterwards (so a plugin's
    names never leak into other tests)."""
    for registry in (BACKENDS, PROJECTIONS, DETECTORS, NEXT_SPEAKERS, TOOLS, FORMATS, SCANS, EMBEDDERS):
        registry._import_home()
        for name in registry._builtins:  # imported now, so a plugin's replace=True (which
            registry.get(name)           # imports the built-in first) registers into the copy
        monkeypatch.setattr(registry, "_entries", dict(registry._entries))
        monkeypatch.setattr(registry, "_owners", dict(registry._owners))
    monkeypatch.setattr(spasm.plugins, "_loaded", {})
    monkeypatch.setattr(spasm.plugins, "_scanned", False)
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.startswith("spasm_demo"):
            del sys.modules[name]


@pytest.fixture
def demo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolated: None) -> Path:
    site = tmp_path / "site"
    install(site, "spasm-demo-plugin", "spasm_demo_plugin", PLUGIN,
            "demo = spasm_demo_plugin\ndemo_scan = spasm_demo_plugin:register")
    monkeypatch.syspath_prepend(str(site))
    return site


def test_a_plugin_registers_a_backend_projection_detector_and_scan_that_a_run_uses(
        demo: Path, tmp_path: Path) -> None:
    with TestServer() as srv:
        data = endpoint_config(
            srv.base_url, personas={"n": 2}, conditions=["mirror"],
            dialogue={"max_turns_per_agent": 10, "max_tokens": 40},
            termination={"rules": False, "detectors": ["six"], "min_utterances": 2})
        data["backends"]["echo"] = {"kind": "demo_echo", "model": "echo"}
        data["pairings"] = [{"client": "srv", "responder": "echo"}]
        # No explicit load: the config's first look-up of an unknown name loads the plugins.
        config = config_from(data)
        assert spasm.plugins.loaded_plugins() == ["demo", "demo_scan"]
        summary = anyio.run(Engine(config, tmp_path / "run", progress=False, sleep_scale=0.0).run)
    assert summary.completed == summary.planned == 2, summary.line()
    run = tmp_path / "run"
    dialogues = pd.read_parquet(run / "dialogues.parquet")
    assert set(dialogues.termination_reason) == {"demo_six"}  # the plugin's detector ended them
    assert set(dialogues.n_utterances) == {6} and set(dialogues.condition) == {"mirror"}
    turns = pd.read_parquet(run / "turns.parquet")
    assert all(t.startswith("A banana for you") for t in turns[turns.speaker == "responder"].text)
    calls = pd.read_parquet(run / "calls.parquet")
    echo = calls[calls.backend == "echo"]
    assert set(echo.resolved_model) == {"echo-1"} and set(echo.prompt_tokens) == {7}
    # The projection the plugin registered is what the server saw as the Client's frame too.
    assert all(body["messages"][0]["content"].endswith(" [mirror]") for body in srv.requests)
    # The QA pass (spasm qa's) runs the plugin's scan with the built-in ones.
    qa = pd.DataFrame([r.model_dump() for r in scan_run(open_run(run)).rows])
    found = qa[qa.kind == "banana"]
    with_word = turns[turns.text.str.lower().str.contains("banana")]
    assert sorted(zip(found.dialogue_id, found.turn_index, strict=True)) == sorted(
        zip(with_word.dialogue_id, with_word.turn_index, strict=True))
    assert set(found.evidence) == {"banana"} and len(found) >= (turns.speaker == "responder").sum()


def test_the_cli_loads_the_plugins_at_start(demo: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(endpoint_config("http://127.0.0.1:9/v1", conditions=["mirror"],
                                                     termination={"detectors": ["six"]})))
    assert main(["generate", "--config", str(config), "--dry-run"]) == 0, capsys.readouterr().err
    assert spasm.plugins.loaded_plugins() == ["demo", "demo_scan"]


def test_a_plugin_condition_is_named_on_the_command_line_and_sorts_after_the_built_ins(
        demo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(endpoint_config("http://127.0.0.1:9/v1")))
    argv = ["generate", "--config", str(config), "--condition", "mirror", "--dry-run"]
    assert resolve_config(build_parser().parse_args(argv)).conditions == ["mirror"]
    assert main(argv) == 0, capsys.readouterr().err
    assert main(["generate", "--config", str(config), "--condition", "nope", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "--condition nope: no such projection; choose one of ecp, concat, quoted, mirror, both, all" in err
    sample = Path(__file__).parent / "data" / "spasm_release_sample.jsonl"
    assert main(["import", str(sample), "--out", str(tmp_path / "imported"), "--condition", "mirror"]) == 0
    imported = pd.read_parquet(tmp_path / "imported" / "dialogues.parquet")
    assert set(imported.condition) <= {"mirror", "ecp", "concat"} and "mirror" in set(imported.condition)
    # One order of conditions everywhere: the built-in ones first, then a plugin's by name.
    assert ordered_conditions(["mirror", "quoted", "concat", "aardvark", "ecp"]) == [
        "ecp", "concat", "quoted", "aardvark", "mirror"]
    assert sorted(["mirror", "quoted"], key=condition_rank) == ["quoted", "mirror"]


KINDS = textwrap.dedent('''
    """A demo plugin of the kinds Python looks up by name: a QA scan, an export format and an
    embedder."""
    import hashlib

    import numpy as np

    from spasm.evaluation import register_embedder
    from spasm.export import register_format, register_scan
    from spasm.export.scans import Finding


    @register_scan("demo_fruit")
    def fruit(text, ctx):
        i = text.lower().find("kiwi")
        return [] if i < 0 else [Finding("demo_fruit", i, i + 4, text[i:i + 4])]


    @register_format("demo_lines", layout="jsonl", description="one line of text per dialogue")
    def demo_lines(example, options):
        return {"text": " / ".join(m["content"] for m in example.messages)}


    @register_embedder("demo_hash")
    class HashEmbedder:
        name = "demo-hash"

        def embed(self, texts):
            digests = [np.frombuffer(hashlib.sha256(t.encode()).digest(), dtype=np.uint8) for t in texts]
            rows = np.array(digests, dtype=np.float32).reshape(len(texts), 32) - 127.5
            return (rows / np.linalg.norm(rows, axis=1, keepdims=True).clip(1e-12)).astype(np.float32)
''')


@pytest.mark.parametrize("use", ["scan", "format", "embedder"])
def test_a_plugins_scan_format_and_embedder_are_found_from_python_without_the_cli(
        use: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolated: None) -> None:
    """No CLI and no Engine loads the plugins here: the first look-up of a name (or, for the
    scans, the first scan of a text) does, as for backends and projections."""
    install(tmp_path / "site", "spasm-demo-kinds", "spasm_demo_kinds", KINDS, "kinds = spasm_demo_kinds")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    run = synthesize_run(tmp_path / "run", n_dialogues=6, n_personas=2)
    assert spasm.plugins.loaded_plugins() == []
    if use == "scan":
        found = scan_text("Two kiwis, please.", ScanContext())
        assert [(f.kind, f.evidence) for f in found] == [("demo_fruit", "kiwi")]
    elif use == "format":
        export_run(run, tmp_path / "out", ExportOptions(formats=["demo_lines"]))
        [path] = (tmp_path / "out" / "demo_lines").glob("train-*.jsonl")  # the card's configs: digest
        records = [json.loads(line) for line in path.open()]
        assert records and all(" / " in r["text"] for r in records)
    else:
        metrics = evaluate(run, embedder="demo_hash", progress=False, write=False)
        assert metrics.embedder == "demo-hash" and metrics.counts.texts_embedded > 0
    assert spasm.plugins.loaded_plugins() == ["kinds"]
    assert {"demo_fruit"} <= set(SCANS.names()) and "demo_lines" in FORMATS and "demo_hash" in EMBEDDERS


ACTS = textwrap.dedent('''
    """A demo plugin of the kinds a run looks up by name: a tool a client seat may call and a
    next-speaker policy."""
    import spasm
    from spasm.turn_order import Choice, register_next_speaker


    @spasm.tool(owner="client")
    def demo_peek(world):
        """Read your latest order's status in the shop's app."""
        return {"status": world["orders"][world["customer"]["latest_order"]]["status"]}


    @register_next_speaker("demo_helper_between")
    class HelperBetween:
        """The responder after every client; after the responder, the client who spoke less
        recently."""

        def __init__(self, setup):
            self.setup = setup

        async def choose(self, history, session):
            clients = [s.id for s in self.setup.seats if s.role == "client"]
            helper = next(s.id for s in self.setup.seats if s.role == "responder")
            said = [history[i].speaker for i in range(len(history))]
            if said[-1] != helper:
                return Choice(helper, "demo: the helper answers")
            last = {c: max((i for i, s in enumerate(said) if s == c), default=-1) for c in clients}
            return Choice(min(clients, key=lambda c: last[c]), "demo: the other client")
''')


def test_a_plugins_tool_and_next_speaker_policy_run_a_group_from_python(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolated: None) -> None:
    """No CLI: the config names a tool and a policy only the plugin registers, parsing it loads
    the plugin, and the Engine's group run speaks in the plugin's order and calls its tool."""
    from tests.test_tools_run import SHOP, _generate, _group_config, group_reply

    install(tmp_path / "site", "spasm-demo-acts", "spasm_demo_acts", ACTS, "acts = spasm_demo_acts")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert spasm.plugins.loaded_plugins() == []
    # A client seat peeks at the app (the plugin's tool), the helper looks the order up.
    with TestServer(reply=group_reply("demo_peek")) as srv:
        data = _group_config(srv.base_url, tmp_path, ["ecp", "concat"])
        data["tools"] = [str(SHOP / "tools.py"), "demo_peek"]
        data["scenarios"][0]["tools"] = ["find_order", "demo_peek"]
        data["group"]["next_speaker"] = "demo_helper_between"
        summary = _generate(data, tmp_path / "run")
    assert summary.completed == summary.planned == 2, summary.line()
    assert spasm.plugins.loaded_plugins() == ["acts"]
    assert "demo_peek" in TOOLS and "demo_helper_between" in NEXT_SPEAKERS
    run = open_run(tmp_path / "run")
    turns = run.df("turns").sort_values(["dialogue_id", "turn_index"])
    for _, one in turns.groupby("dialogue_id"):
        # Round robin would be Ana, Ben, Helper; the plugin puts Helper between the clients.
        assert len(one) >= 5
        assert list(one.speaker) == ["Ana", "Helper", "Ben", "Helper", "Ana", "Helper"][:len(one)]
        assert set(one.next_speaker_reason) == {
            "opener", "demo: the helper answers", "demo: the other client"}
    events = run.df("events")
    peeks = events[(events.kind == "tool_result") & (events.tool == "demo_peek")]
    assert set(peeks.actor) == {"Ana", "Ben"}
    assert all(json.loads(r)["status"] == "at depot" for r in peeks.result)
    assert set(events[events.tool == "find_order"].actor) == {"Helper"}


BROKEN = [
    ("raise RuntimeError('no licence file')\n", "spasm_demo_broken",
     "RuntimeError: no licence file at .*spasm_demo_broken.py:1"),
    ("VALUE = 3\n", "spasm_demo_broken:VALUE", "is neither a module nor a callable"),
    ("", "spasm_demo_missing", "ModuleNotFoundError: No module named 'spasm_demo_missing'"),
    # sys.exit() at import was spasm exiting 0 with no output and no dataset.
    ("import sys\nsys.exit(0)\n", "spasm_demo_broken",
     r"called sys\.exit\(0\) while loading at .*spasm_demo_broken.py:2: a plugin must not exit"),
    ("def register():\n    raise SystemExit('bye')\n", "spasm_demo_broken:register",
     r"called sys\.exit\('bye'\) while loading at .*spasm_demo_broken.py:2"),
]


@pytest.mark.parametrize("source, value, message", BROKEN)
def test_a_broken_plugin_is_a_clear_error_naming_its_entry_point(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolated: None,
        capsys: pytest.CaptureFixture[str], source: str, value: str, message: str) -> None:
    site = tmp_path / "site"
    install(site, "spasm-demo-broken", "spasm_demo_broken", source, f"broken = {value}")
    monkeypatch.syspath_prepend(str(site))
    with pytest.raises(PluginError, match=message) as exc:
        load_plugins(rescan=True)
    assert f"spasm plugin 'broken' = '{value}' (distribution spasm-demo-broken)" in str(exc.value)
    assert "pip uninstall spasm-demo-broken" in str(exc.value)
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(endpoint_config("http://127.0.0.1:9/v1")))
    assert main(["generate", "--config", str(config), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "spasm plugin 'broken'" in err and "Traceback" not in err


def test_an_unknown_detector_names_the_known_ones(isolated: None) -> None:
    with pytest.raises(ConfigError, match=r"unknown termination detector 'nope'"):
        parse_config({"termination": {"detectors": ["nope"]}})
    with pytest.raises(ConfigError, match=r"switched on with termination\.rules: true"):
        parse_config({"termination": {"detectors": ["rules"]}})


def test_configs_written_before_detectors_and_python_backends_keep_their_fingerprint() -> None:
    """The settings added with plugins and python backends are left out of the fingerprint at
    their defaults, so a run written before them is still resumed (digests from before)."""
    assert parse_config({}).fingerprint() == "f03598c72d078d14"
    endpoint = {"backends": {"srv": {"kind": "openai", "base_url": "http://h/v1", "model": "m"}},
                "pairings": [{"client": "srv", "responder": "srv"}], "termination": {"judge": True}}
    assert parse_config(endpoint).fingerprint() == "89bd4be3e08b5094"


# A plugin that names what spasm already has: each registry's built-in, one per decorator.
SHADOWS = [
    ("from spasm.backends import register_backend\n"
     "@register_backend('openai'{flag})\nclass Fake:\n    pass\n", "backend kind 'openai'"),
    ("from spasm.backends import register_backend\n"
     "@register_backend('embedded'{flag})\nclass Fake:\n    pass\n", "backend kind 'embedded'"),
    ("from spasm.projection import ecp, register_projection\n"
     "@register_projection('ecp'{flag})\ndef mine(history, viewer):\n    return ecp(history, viewer)\n",
     "projection 'ecp'"),
    ("from spasm.termination import register_detector\n"
     "@register_detector('rules'{flag})\ndef mine(setup):\n    return None\n",
     "termination detector 'rules'"),
    ("from spasm.turn_order import register_next_speaker\n"
     "@register_next_speaker('round_robin'{flag})\ndef mine(setup):\n    return None\n",
     "next-speaker policy 'round_robin'"),
]


@pytest.mark.parametrize("source, what", SHADOWS)
def test_a_plugin_that_shadows_a_built_in_silently_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolated: None,
        capsys: pytest.CaptureFixture[str], source: str, what: str) -> None:
    site = tmp_path / "site"
    install(site, "spasm-demo-shadow", "spasm_demo_shadow", source.format(flag=""),
            "shadow = spasm_demo_shadow")
    monkeypatch.syspath_prepend(str(site))
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(endpoint_config("http://127.0.0.1:9/v1")))
    assert main(["generate", "--config", str(config), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert f"registers the {what}, which spasm already has" in err, err
    assert "(distribution spasm-demo-shadow)" in err and "replace=True" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("source, what", SHADOWS)
def test_a_plugin_replaces_a_built_in_only_when_it_asks_and_spasm_warns(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolated: None,
        caplog: pytest.LogCaptureFixture, source: str, what: str) -> None:
    site = tmp_path / "site"
    install(site, "spasm-demo-shadow", "spasm_demo_shadow", source.format(flag=", replace=True"),
            "shadow = spasm_demo_shadow")
    monkeypatch.syspath_prepend(str(site))
    with caplog.at_level("WARNING", logger="spasm"):
        load_plugins(rescan=True)
    assert f"replaces spasm's {what}" in caplog.text
    registry, name = {"backend": (BACKENDS, what.split("'")[1]),
                      "projection": (PROJECTIONS, "ecp"), "termination": (DETECTORS, "rules"),
                      "next-speaker": (NEXT_SPEAKERS, "round_robin")}[what.split()[0]]
    # The plugin's wins, even when the built-in's module is imported only later.
    assert getattr(registry.get(name), "__module__", None) == "spasm_demo_shadow"
    assert spasm.plugins.plugin_records() == [
        {"entry_point": "shadow", "value": "spasm_demo_shadow", "distribution": "spasm-demo-shadow",
         "version": "0.1", "replaces": [what]}]


def test_two_plugins_that_register_the_same_name_are_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolated: None) -> None:
    site = tmp_path / "site"
    source = ("from spasm.projection import ecp, register_projection\n"
              "@register_projection('mirror', replace=True)\n"
              "def mine(history, viewer):\n    return ecp(history, viewer)\n")
    install(site, "spasm-demo-one", "spasm_demo_one", source, "one = spasm_demo_one")
    install(site, "spasm-demo-two", "spasm_demo_two", source, "two = spasm_demo_two")
    monkeypatch.syspath_prepend(str(site))
    with pytest.raises(PluginError, match=r"spasm plugin 'two' = 'spasm_demo_two' \(distribution "
                       r"spasm-demo-two\) registers the projection 'mirror', which the plugin "
                       r"spasm-demo-one registered already"):
        load_plugins(rescan=True)


def test_the_manifest_records_every_loaded_plugin(demo: Path, tmp_path: Path) -> None:
    with TestServer() as srv:
        data = endpoint_config(srv.base_url, personas={"n": 1}, conditions=["mirror"],
                               dialogue={"max_turns_per_agent": 2, "max_tokens": 20})
        config = config_from(data)
        anyio.run(Engine(config, tmp_path / "run", progress=False, sleep_scale=0.0).run)
    manifest = open_run(tmp_path / "run").manifest
    assert manifest["plugins"] == [
        {"entry_point": name, "value": value, "distribution": "spasm-demo-plugin",
         "version": "0.1", "replaces": []}
        for name, value in (("demo", "spasm_demo_plugin"),
                            ("demo_scan", "spasm_demo_plugin:register"))]


def test_a_run_without_plugins_records_an_empty_list(tmp_path: Path, isolated: None) -> None:
    with TestServer() as srv:
        config = config_from(endpoint_config(srv.base_url, personas={"n": 1},
                                             dialogue={"max_turns_per_agent": 1, "max_tokens": 20}))
        anyio.run(Engine(config, tmp_path / "run", progress=False, sleep_scale=0.0).run)
    assert open_run(tmp_path / "run").manifest["plugins"] == []


def test_a_plugin_that_calls_sys_exit_during_a_dialogue_quarantines_it_and_spasm_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolated: None,
        capsys: pytest.CaptureFixture[str]) -> None:
    """It was exit 0 with no dataset: the SystemExit went through every handler."""
    source = textwrap.dedent('''
        import sys
        from spasm.backends import Backend, register_backend

        @register_backend("demo_exit")
        class Exits(Backend):
            def __init__(self, name, cfg):
                self.name, self.model = name, cfg.model
                self.max_concurrency = cfg.max_concurrency

            async def complete(self, request):
                sys.exit(0)
    ''')
    site = tmp_path / "site"
    install(site, "spasm-demo-exit", "spasm_demo_exit", source, "exit = spasm_demo_exit")
    monkeypatch.syspath_prepend(str(site))
    with TestServer() as srv:
        data = endpoint_config(srv.base_url, personas={"n": 2})
        data["backends"]["bot"] = {"kind": "demo_exit", "model": "x"}
        data["pairings"] = [{"client": "srv", "responder": "bot"}]
        config = tmp_path / "c.yaml"
        config.write_text(yaml.safe_dump(data))
        run = tmp_path / "run"
        assert main(["generate", "--config", str(config), "--out", str(run), "--no-progress"]) == 1
    errors = pd.read_parquet(run / "errors.parquet")
    assert len(errors) == 2 and set(errors.error_type) == {"RuntimeError"}
    assert all(e.startswith("sys.exit(0) was called during the dialogue") for e in errors.error)
    assert all("spasm_demo_exit.py" in t for t in errors.traceback)
