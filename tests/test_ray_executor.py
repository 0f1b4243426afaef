"""The Ray executor (``spasm generate --executor ray``) on a local Ray cluster.

The cluster is started once for the module with ``ray.init(num_cpus=2)``, every part of it on
the loopback interface; each Ray task runs the ordinary engine against the test server.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pandas as pd
import pytest

from spasm.cli import main
from spasm.config import parse_config
from spasm.dataset import open_run
from spasm.engine import Engine
from spasm.runner import DialogueResult, run_dialogue
from spasm.testing import FaultPlan, TestServer
from tests.conftest import endpoint_config
from tests.test_shards import KEYS, sorted_rows

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    # Before Ray is imported: every Ray process binds the loopback interface only.
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             # Workers import this module (the crash hook) as pytest named it.
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(
                 [str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}})
    yield ray
    ray.shutdown()


def _config(base_url: str, **overrides: Any) -> Any:
    data = endpoint_config(base_url, **{"personas": {"n": 4}, "conversations_per_persona": 2,
                                        "conditions": ["ecp", "concat"], **overrides})
    return parse_config(data, "<test>")


def _unsharded(config: Any, out: Path) -> Path:
    anyio.run(Engine(config, out, progress=False, sleep_scale=0.02).run)
    return out


def _assert_same_rows(a: Path, b: Path) -> None:
    for table in KEYS:
        pd.testing.assert_frame_equal(sorted_rows(a, table), sorted_rows(b, table))


def test_ray_run_equals_the_unsharded_run_and_a_rerun_does_nothing(
    ray_cluster: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from spasm.executors.ray_executor import run_with_ray

    with TestServer() as srv:
        config = _config(srv.base_url)
        whole = _unsharded(config, tmp_path / "whole")
        out = tmp_path / "ray"
        run = run_with_ray(config, out, shards=3, progress=False, engine_options={"sleep_scale": 0.02})
        assert sorted(run.ran) == ["0/3", "1/3", "2/3"] and run.merged is not None
        _assert_same_rows(out, whole)
        manifest = open_run(out).manifest
        assert manifest["status"] == "complete" and len(manifest["merged_from"]) == 3
        assert {p.name for p in (out / "shards").iterdir()} == {"0-of-3", "1-of-3", "2-of-3"}

        posts, stamp = len(srv.arrivals), (out / "manifest.json").stat().st_mtime_ns
        cfg = tmp_path / "run.json"
        cfg.write_text(json.dumps(config.redacted()))
        capsys.readouterr()
        assert main(["generate", "--config", str(cfg), "--out", str(out), "--executor", "ray",
                     "--no-progress"]) == 0
        assert "nothing to do" in capsys.readouterr().out
        assert len(srv.arrivals) == posts  # not one request
        assert (out / "manifest.json").stat().st_mtime_ns == stamp


#: Dialogues this worker process finished (the crash hook's count).
_FINISHED = {"n": 0}


async def crash_once(spec: Any, config: Any, caller: Any, *, marker: str, shard: int) -> DialogueResult:
    """Simulate a dialogue; the first worker to finish four of shard ``shard``'s dialogues dies
    before handing the fourth back (the earlier ones are committed: flush_every is 1)."""
    result: DialogueResult = await run_dialogue(spec, config, caller)
    if spec.persona.index % 2 == shard and not os.path.exists(marker):
        _FINISHED["n"] += 1
        if _FINISHED["n"] >= 4:
            Path(marker).write_text(str(os.getpid()))
            os._exit(1)  # the worker process dies mid-shard, as on a lost node
    return result


def test_a_shard_whose_worker_dies_is_retried_without_loss_or_duplicates(
    ray_cluster: Any, tmp_path: Path
) -> None:
    from spasm.executors.ray_executor import run_with_ray

    marker = tmp_path / "crashed"
    with TestServer() as srv:
        config = _config(srv.base_url, engine={"flush_every": 1, "max_dialogues_in_flight": 2})
        whole = _unsharded(config, tmp_path / "whole")
        hook = functools.partial(crash_once, marker=str(marker), shard=1)
        out = tmp_path / "ray"
        run = run_with_ray(config, out, shards=2, progress=False,
                           engine_options={"simulate": hook, "sleep_scale": 0.02})
    assert marker.exists(), "the shard's worker never died: the test tested nothing"
    assert run.merged is not None and run.merged.status == "complete"
    # The crashed attempt had committed some dialogues; the retry resumed, not restarted.
    shard_calls = open_run(out / "shards" / "1-of-2").calls
    assert shard_calls.call_id.str.split(":").str[0].nunique() >= 2  # two passes wrote calls
    dialogues, turns = open_run(out).dialogues, open_run(out).turns
    assert dialogues.dialogue_id.is_unique and not turns.duplicated(["dialogue_id", "turn_index"]).any()
    assert set(dialogues.dialogue_id) == set(open_run(whole).dialogues.dialogue_id)
    _assert_same_rows(out, whole)


def _max_in_window(times: list[float], rpm: int) -> float:
    """The largest excess over what token buckets of ``rpm`` allow in any window of requests
    (a burst of ``rpm``, then ``rpm`` per minute): <= 0 when the limit held."""
    worst = float("-inf")
    for i, start in enumerate(times):
        for j in range(i, len(times)):
            worst = max(worst, (j - i + 1) - rpm * (1 + (times[j] - start) / 60))
    return worst


def test_limits_hold_run_wide_across_four_shards(ray_cluster: Any, tmp_path: Path) -> None:
    from spasm.executors.ray_executor import run_with_ray

    with TestServer(FaultPlan(latency_s=0.02)) as srv:
        config = _config(srv.base_url, personas={"n": 8})
        _unsharded(config, tmp_path / "whole")
        total = len(srv.arrivals) - 1  # the run's requests, less its preflight
        srv.reset()
        # A limit the run exceeds by a tenth: without the split, four buckets would let every
        # request through in the first burst; with it the last tenth waits for the refill.
        rpm = int(total * 0.9)
        limited = config.model_copy(update={"backends": {"srv": config.backends["srv"].model_copy(
            update={"rpm": rpm, "max_concurrency": 4})}})
        run = run_with_ray(limited, tmp_path / "ray", shards=4, cpus_per_shard=0.5, progress=False,
                           engine_options={"sleep_scale": 0.02})
        times = sorted(srv.arrivals)
        max_in_flight = srv.max_in_flight
    assert run.merged is not None and sorted(run.ran) == ["0/4", "1/4", "2/4", "3/4"]
    assert len(times) >= total
    # Each shard's preflight (one chat call before the run) is outside the limiter: 4 calls.
    assert _max_in_window(times, rpm) <= 4, "more requests than rpm allows in some window"
    assert max_in_flight <= 4, f"{max_in_flight} requests in flight; max_concurrency is 4"


def test_executor_ray_without_ray_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    cfg = tmp_path / "run.json"
    cfg.write_text(json.dumps(endpoint_config("http://127.0.0.1:9/v1")))
    out = tmp_path / "out"
    assert main(["generate", "--config", str(cfg), "--out", str(out), "--executor", "ray"]) == 2
    assert "pip install 'spasm[ray]'" in capsys.readouterr().err
    assert not out.exists()
