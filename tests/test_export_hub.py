"""``spasm export … --push-to-hub``: the folder uploaded with huggingface_hub to a Hub that runs
on loopback and speaks the Hub's upload protocol (create repo, branch, README validation,
preupload, tree listing, NDJSON commit). Never the network."""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pytest
import yaml

from spasm.cli import main
from spasm.dataset.synthetic import synthesize_run

pytestmark = pytest.mark.e2e

pytest.importorskip("huggingface_hub")

TOKEN = "hf_test_token_123"


class FakeHub:
    """The Hub's repo API, in memory: ``repos[repo_id]`` holds its visibility and branches."""

    def __init__(self) -> None:
        self.repos: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []
        self.auth: set[str] = set()
        self.refuse: int | None = None  # answer every request with this status
        self.lock = threading.Lock()
        handler = type("Handler", (_Handler,), {"hub": self})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> FakeHub:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def files(self, repo_id: str, branch: str = "main") -> dict[str, bytes]:
        return dict(self.repos[repo_id]["branches"][branch])

    # -- the endpoints (path parts after /api) ---------------------------------------------

    def handle(self, method: str, path: str, body: bytes) -> tuple[int, Any]:
        if self.refuse is not None:
            return self.refuse, {"error": "refused"}
        parts = [unquote(p) for p in path.split("/")[2:]]  # after "/api"
        if method == "POST" and parts == ["repos", "create"]:
            data = json.loads(body)
            repo_id = f"{data['organization']}/{data['name']}" if data.get("organization") else data["name"]
            if repo_id in self.repos:
                return 409, {"error": "You already created this dataset repo", "url": repo_id}
            self.repos[repo_id] = {"type": data.get("type"), "visibility": data.get("visibility"),
                                   "branches": {"main": {}}}
            return 200, {"url": f"{self.url}/datasets/{repo_id}"}
        if method == "POST" and parts == ["validate-yaml"]:
            text = json.loads(body)["content"]
            try:
                yaml.safe_load(text.split("---\n")[1])
            except (yaml.YAMLError, IndexError) as exc:
                return 400, {"errors": [{"message": str(exc)}]}
            return 200, {"errors": [], "warnings": []}
        if len(parts) >= 5 and parts[0] == "datasets":
            repo_id, action, rev = f"{parts[1]}/{parts[2]}", parts[3], "/".join(parts[4:])
            repo = self.repos.get(repo_id)
            if repo is None:
                return 404, {"error": "Repository not found"}
            branches = repo["branches"]
            if action == "branch" and method == "POST":
                if rev in branches:
                    return 409, {"error": "Reference already exists"}
                branches[rev] = dict(branches["main"])
                return 200, {}
            if rev not in branches:
                return 404, {"error": f"Invalid rev id: {rev}"}
            files = branches[rev]
            if action == "preupload" and method == "POST":
                return 200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False,
                                        "oid": None} for f in json.loads(body)["files"]]}
            if action == "tree" and method == "GET":
                return 200, [{"type": "file", "path": p, "size": len(b),
                              "oid": hashlib.sha1(b).hexdigest()} for p, b in sorted(files.items())]
            if action == "commit" and method == "POST":
                for line in body.decode().splitlines():
                    item = json.loads(line)
                    if item["key"] == "file":
                        files[item["value"]["path"]] = base64.b64decode(item["value"]["content"])
                    elif item["key"] == "deletedFile":
                        files.pop(item["value"]["path"])
                    elif item["key"] != "header":
                        return 400, {"error": f"not supported here: {item['key']}"}
                oid = hashlib.sha1(repr(sorted(files.items())).encode()).hexdigest()
                return 200, {"success": True, "commitOid": oid,
                             "commitUrl": f"{self.url}/datasets/{repo_id}/commit/{oid}"}
        return 404, {"error": f"no such endpoint: {method} {path}"}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    hub: FakeHub

    def log_message(self, *args: Any) -> None:
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while (size := int(self.rfile.readline().strip(), 16)) > 0:
                out += self.rfile.read(size)
                self.rfile.readline()
            self.rfile.readline()
            return out
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _serve(self) -> None:
        body = self._body()
        path = urlparse(self.path).path
        with self.hub.lock:
            self.hub.requests.append((self.command, path))
            self.hub.auth.add(self.headers.get("Authorization", ""))
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                status, data = 401, {"error": "Invalid credentials in Authorization header"}
            else:
                status, data = self.hub.handle(self.command, path, body)
        raw = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    do_GET = do_POST = _serve


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    with FakeHub() as h:
        yield h


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synthesize_run(tmp_path_factory.mktemp("hub") / "run", n_dialogues=40, n_personas=10)


def push(run: Path, out: Path, hub: FakeHub, *flags: str) -> int:
    return main(["export", str(run), "--out", str(out), "--push-to-hub", "me/spasm-test",
                 "--hub-endpoint", hub.url, "--seed", "1", *flags])


def local_files(out: Path) -> dict[str, bytes]:
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*")
            if p.is_file() and not p.name.startswith(".")}


def test_the_export_folder_is_uploaded_as_it_is(run: Path, tmp_path: Path, hub: FakeHub,
                                                monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    out = tmp_path / "out"
    assert push(run, out, hub, "--private") == 0
    assert f"uploaded to {hub.url}/datasets/me/spasm-test" in capsys.readouterr().out
    repo = hub.repos["me/spasm-test"]
    assert repo["type"] == "dataset" and repo["visibility"] == "private"
    uploaded = hub.files("me/spasm-test")
    assert uploaded == local_files(out)  # card, splits, configs: byte for byte
    assert {"README.md", "card.json", "dataset_info.json", "openai/train.jsonl",
            "sharegpt/train.jsonl"} <= set(uploaded)
    # The Parquet files the card's configs names carry their content's digest in their name.
    [parquet] = [p for p in uploaded if p.startswith("data/train-00000-of-00001-")]
    digest = hashlib.sha256(uploaded[parquet]).hexdigest()[:12]
    assert parquet == f"data/train-00000-of-00001-{digest}.parquet"
    assert f"path: {parquet}" in uploaded["README.md"].decode()
    assert not any(p.startswith(".") for p in uploaded)  # the output marker stays local
    assert hub.auth == {f"Bearer {TOKEN}"}
    # The card's axolotl block names the Hub repo, so it loads from there.
    readme = uploaded["README.md"].decode()
    block = yaml.safe_load(readme.split("```yaml\n", 1)[1].split("```", 1)[0])
    assert block["datasets"][0]["path"] == "me/spasm-test"
    assert block["datasets"][0]["data_files"] == ["openai/train.jsonl"]


def test_a_revision_goes_to_its_branch_and_stale_export_files_are_deleted(
        run: Path, tmp_path: Path, hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_HUB_KEY", TOKEN)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    out = tmp_path / "out"
    assert push(run, out, hub, "--hub-token-env", "MY_HUB_KEY", "--revision", "v1") == 0
    assert hub.files("me/spasm-test", "main") == {}
    first = hub.files("me/spasm-test", "v1")
    assert any(p.startswith("data/test-00000-of-00001-") for p in first)
    hub.repos["me/spasm-test"]["branches"]["v1"]["notes/mine.txt"] = b"a file the user added"
    # A second export with one split: the old validation/test files go, the user's file stays.
    assert push(run, out, hub, "--hub-token-env", "MY_HUB_KEY", "--revision", "v1", "--overwrite",
                "--split", "1") == 0
    second = hub.files("me/spasm-test", "v1")
    assert second == {**local_files(out), "notes/mine.txt": b"a file the user added"}
    assert not any("test-" in p or "validation" in p for p in second)


def test_nothing_is_uploaded_when_the_export_fails_its_checks(run: Path, tmp_path: Path, hub: FakeHub,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              capsys: Any) -> None:
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    out = tmp_path / "out"
    assert push(run, out, hub, "--token-limit", "5") == 1
    err = capsys.readouterr().err
    assert "fails OpenAI's chat fine-tuning checks: nothing was uploaded to the Hub" in err
    assert "over_token_limit" in err and "Traceback" not in err
    assert hub.requests == []
    assert (out / "openai" / "train.jsonl").exists()  # the export itself is there to inspect


@pytest.mark.parametrize(("env", "flags", "message"), [
    ({}, [], "needs a Hub token with write access in the environment variable HF_TOKEN, which is not set"),
    ({"HF_TOKEN": "  "}, [], "which is blank"),
    ({"HF_TOKEN": TOKEN}, ["--push-to-hub", "no-owner"], "name a dataset repo as OWNER/NAME"),
    ({"HF_TOKEN": TOKEN}, ["--push-to-hub", "a/b/c"], "name a dataset repo as OWNER/NAME"),
])
def test_a_missing_token_or_a_bad_repo_id_fails_before_any_work(
        run: Path, tmp_path: Path, hub: FakeHub, monkeypatch: pytest.MonkeyPatch, capsys: Any,
        env: dict[str, str], flags: list[str], message: str) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    out = tmp_path / "out"
    assert push(run, out, hub, *flags) == 2
    assert message in capsys.readouterr().err
    assert hub.requests == [] and not out.exists()


def test_private_and_revision_need_push_to_hub(run: Path, tmp_path: Path, capsys: Any) -> None:
    assert main(["export", str(run), "--out", str(tmp_path / "o"), "--private"]) == 2
    assert "--private and --revision go with --push-to-hub" in capsys.readouterr().err


def test_a_hub_that_refuses_is_a_clear_error_and_the_export_stays(
        run: Path, tmp_path: Path, hub: FakeHub, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    out = tmp_path / "out"
    assert push(run, out, hub) == 1
    err = capsys.readouterr().err
    assert "uploading" in err and "failed (is the token valid, with write access to the namespace?)" in err
    assert "--overwrite to retry" in err and "Traceback" not in err
    assert (out / "README.md").exists() and hub.repos == {}
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    hub.refuse = 500
    assert push(run, out, hub, "--overwrite") == 1
    assert "failed" in capsys.readouterr().err
