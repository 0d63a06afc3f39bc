"""Metrics tracking: trackio for real (local files), graceful fallback, and what the coordinator logs."""

from __future__ import annotations

import logging

import pytest

from hubgrpo import runrepo
from hubgrpo.coordinator.repo_init import init_repo
from hubgrpo.coordinator.core import Coordinator
from hubgrpo.store.local import LocalStore
from hubgrpo.tracking import Tracker, make_tracker
from tests.support.coord_helpers import FakeClock, make_config, push_submission, write_adapter

pytestmark = pytest.mark.timeout(120)


class Recorder(Tracker):
    kind = "recorder"

    def __init__(self):
        self.points = []

    def _log(self, metrics, step):
        self.points.append((step, metrics))


def test_trackio_writes_local_run(tmp_path, monkeypatch):
    pytest.importorskip("trackio")
    from trackio import utils

    before = {p: p.stat().st_size for p in utils.TRACKIO_DIR.glob("*.db")}  # read at import: under HF_HOME here
    t = make_tracker("trackio", project="hubgrpo-test", name="w0", config={"lr": 0.1})
    assert t.kind == "trackio"
    for i in range(3):
        t.log({"train/reward": 0.1 * i, "train/note": "text is dropped", "bad": float("nan")}, step=i)
    t.close()
    db = utils.TRACKIO_DIR / "hubgrpo-test.db"
    assert db.exists() and db.stat().st_size > before.get(db, 0)


def test_missing_tracker_package_falls_back_with_a_warning(monkeypatch, caplog):
    import builtins

    real_import = builtins.__import__

    def no_trackio(name, *a, **kw):
        if name == "trackio":
            raise ImportError("No module named 'trackio'", name="trackio")
        return real_import(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_trackio)
    with caplog.at_level(logging.WARNING, logger="hubgrpo.tracking"):
        t = make_tracker("trackio", project="p", name="w")
    assert type(t) is Tracker and "pip install trackio" in caplog.text
    t.log({"x": 1.0})  # a no-op, never an error


def test_failing_tracker_never_breaks_the_caller(caplog):
    class Broken(Tracker):
        kind = "broken"

        def _log(self, metrics, step):
            raise RuntimeError("disk full")

    with caplog.at_level(logging.WARNING, logger="hubgrpo.tracking"):
        Broken().log({"x": 1.0}, step=1)
    assert "disk full" in caplog.text


def test_coordinator_logs_one_point_per_version(tmp_path):
    cfg = make_config(**{"merge.quorum": 1})
    store = LocalStore(tmp_path / "repo")
    clock = FakeClock()
    init_repo(store, cfg, write_adapter(tmp_path / "v0", seed=0), clock=clock)
    c = Coordinator(store, b"s", clock=clock, workdir=tmp_path / "w")
    c.tracker = rec = Recorder()
    for i in range(2):
        lease = c.lease(f"w{i}")
        c.submit(lease, push_submission(store, lease, tmp_path, seed=i + 1, reward=0.25 * (i + 1)))
    assert [s for s, _ in rec.points] == [1, 2]
    assert rec.points[1][1]["version/reward"] == pytest.approx(0.5)  # recomputed from the round's rollouts
    assert rec.points[1][1]["version/submissions"] == 1.0
