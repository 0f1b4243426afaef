"""Shared fixtures. The network is blocked: only loopback connections are allowed, and spasm's
on-disk cache is the suite's own, never the user's."""

from __future__ import annotations

import hashlib
import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spasm.config import parse_config
from spasm.personas.persona import Persona

# A suite started as a background job (`make test &`, a scheduler) inherits SIGINT ignored, and
# an ignored signal stays ignored in every subprocess, so the tests that press Ctrl-C on
# `spasm generate`, `spasm play` or the test server would see nothing happen. The suite's own
# handler is reset to SIG_DFL in its children at exec, where Python installs its usual one.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

_real_connect = socket.socket.connect


def _guarded_connect(self: socket.socket, address: Any) -> Any:
    host = address[0] if isinstance(address, tuple) else address
    if isinstance(host, str) and not (
        host.startswith("127.") or host in ("localhost", "::1") or self.family == socket.AF_UNIX
    ):
        raise RuntimeError(f"tests may not reach the network (tried {address!r})")
    return _real_connect(self, address)


@pytest.fixture(autouse=True)
def _block_network(monkeypatch: pytest.MonkeyPatch) -> None:
    if os.environ.get("SPASM_REAL_API") == "1":
        return
    monkeypatch.setattr(socket.socket, "connect", _guarded_connect)


#: The embeddings package, whose source names the suite's spasm cache (read, not imported).
_EMBEDDINGS = Path(__file__).resolve().parent.parent / "spasm" / "evaluation" / "embeddings"


@pytest.fixture(scope="session", autouse=True)
def spasm_cache_dir(request: pytest.FixtureRequest,
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every test's ``$SPASM_CACHE_DIR``: a folder in pytest's cache named by a digest of the
    embeddings package's source, so the static embedder's table is distilled once for every
    worker (the others wait on its lock and read it) and kept for later sessions until that
    code changes; with ``-p no:cacheprovider``, a folder of this session's. Tests never write
    the user's own cache (``~/.cache/spasm``)."""
    source = b"".join(f.read_bytes() for f in sorted(_EMBEDDINGS.glob("*.py")))
    digest = hashlib.sha256(source).hexdigest()[:16]
    cache = getattr(request.config, "cache", None)  # absent with -p no:cacheprovider
    root = (cache.mkdir(f"spasm-cache-{digest}") if cache is not None
            else tmp_path_factory.mktemp("spasm-cache"))
    with pytest.MonkeyPatch.context() as session:
        session.setenv("SPASM_CACHE_DIR", str(root))
        yield root


@pytest.fixture
def server() -> Iterator[Any]:
    """The OpenAI-compatible test server on 127.0.0.1."""
    from spasm.testing import TestServer

    with TestServer() as srv:
        yield srv


def endpoint_config(base_url: str, **overrides: Any) -> dict[str, Any]:
    """A small run config against one OpenAI-compatible endpoint."""
    data: dict[str, Any] = {
        "name": "t",
        "seed": 7,
        "personas": {"n": 3},
        "conditions": ["ecp"],
        "backends": {"srv": {"kind": "openai", "base_url": base_url, "model": "m"}},
        "pairings": [{"client": "srv", "responder": "srv"}],
        "dialogue": {"max_turns_per_agent": 4, "max_tokens": 40},
        "termination": {"rules": True, "min_utterances": 4},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return data


@pytest.fixture
def tmp_run(tmp_path: Path) -> Path:
    return tmp_path / "run"


def config_from(data: dict[str, Any]) -> Any:
    return parse_config(data, "<test>")


def make_persona(persona_id: str = "p0", index: int = 0, card: str = "", **fields: Any) -> Persona:
    """A persona for a test: its id, its place in the set and its card; every other keyword is
    one of its schema fields."""
    return Persona(id=persona_id, index=index, card=card, fields=fields)
