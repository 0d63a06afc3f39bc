"""``coordinator.kept``: the record and rollouts of admitted rounds as admission read them, for the verifier."""

from __future__ import annotations

import hashlib

import pytest

from hubgrpo import layout
from hubgrpo.coordinator.kept import FILES, KeptRounds


def _round(folder, tag: bytes):
    folder.mkdir(parents=True)
    for name in FILES:
        (folder / name).write_bytes(name.encode() + tag)
    return folder


@pytest.mark.timeout(30)
def test_kept_files_are_the_admitted_bytes_whatever_happens_to_the_folder_later(tmp_path):
    kept = KeptRounds(tmp_path / "kept")
    folder = _round(tmp_path / "r", b"-admitted")
    kept.keep("w1-a", folder)
    (folder / layout.ROLLOUTS_FILE).write_bytes(b"swapped after admission")
    assert kept.files("w1-a") == {name: name.encode() + b"-admitted" for name in FILES}
    assert kept.digests("w1-a") == {n: hashlib.sha256(n.encode() + b"-admitted").hexdigest() for n in FILES}
    (tmp_path / "kept" / "w1-a" / layout.ROLLOUTS_FILE).write_bytes(b"changed on the coordinator's disk")
    assert kept.files("w1-a") is None  # never other bytes than the admitted ones
    assert kept.files("w9-z") is None and kept.digests("w9-z") is None


@pytest.mark.timeout(30)
def test_only_the_newest_rounds_are_kept_and_bad_names_never(tmp_path):
    kept = KeptRounds(tmp_path / "kept", limit=3)
    for i in range(5):
        kept.keep(f"w1-{i}", _round(tmp_path / f"r{i}", str(i).encode()))
    assert [kept.digests(f"w1-{i}") is not None for i in range(5)] == [False, False, True, True, True]
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == ["w1-2", "w1-3", "w1-4"]  # the rest deleted
    kept.keep("../escape", _round(tmp_path / "evil", b"x"))
    assert not (tmp_path / "escape").exists() and kept.digests("../escape") is None
