"""``coordinator.kept``: the record and rollouts of admitted rounds as admission read them, for the verifier."""

from __future__ import annotations

import hashlib

import pytest

from hubgrpo import layout
from hubgrpo.coordinator.kept import FILES, MAX_SERVED, KeptRounds
from hubgrpo.errors import InvalidSubmission


def _round(folder, tag: bytes, size: int = 0):
    folder.mkdir(parents=True)
    for name in FILES:
        (folder / name).write_bytes(name.encode() + tag + b" " * size)
    return folder


@pytest.mark.timeout(30)
def test_kept_files_are_the_admitted_bytes_whatever_happens_to_the_folder_later(tmp_path):
    kept = KeptRounds(tmp_path / "kept")
    folder = _round(tmp_path / "r", b"-admitted")
    staged = kept.stage(folder, "w1-a")
    (folder / layout.ROLLOUTS_FILE).write_bytes(b"swapped after admission")
    assert kept.digests("w1-a") is None  # staged only: not the round's until it is accepted
    kept.commit("w1-a", staged)
    assert kept.files("w1-a") == {name: name.encode() + b"-admitted" for name in FILES}
    assert kept.digests("w1-a") == {n: hashlib.sha256(n.encode() + b"-admitted").hexdigest() for n in FILES}
    [copy] = [p for p in (tmp_path / "kept").iterdir() if p.name.startswith("w1-a")]
    (copy / layout.ROLLOUTS_FILE).write_bytes(b"changed on the coordinator's disk")
    assert kept.files("w1-a") is None  # never other bytes than the admitted ones
    assert kept.files("w9-z") is None and kept.digests("w9-z") is None


@pytest.mark.timeout(30)
def test_a_losing_second_check_never_replaces_the_kept_copy(tmp_path):
    """Two checks of one round at once (a scan and a submit): the one accepted first keeps its copy; the other's is
    discarded as a duplicate (``admission.accept``), whatever bytes it read."""
    kept = KeptRounds(tmp_path / "kept")
    first = kept.stage(_round(tmp_path / "a", b"-first"), "w1-a")
    second = kept.stage(_round(tmp_path / "b", b"-second"), "w1-a")
    kept.commit("w1-a", first)
    kept.discard(second)
    assert kept.files("w1-a")[layout.ROLLOUTS_FILE].endswith(b"-first")
    assert [p.name[:5] for p in (tmp_path / "kept").iterdir()] == ["w1-a-"]  # nothing else left


@pytest.mark.timeout(30)
def test_only_the_newest_rounds_are_kept_bad_names_never_and_big_ones_refused(tmp_path):
    kept = KeptRounds(tmp_path / "kept", limit=3)
    for i in range(5):
        kept.commit(f"w1-{i}", kept.stage(_round(tmp_path / f"r{i}", str(i).encode()), f"w1-{i}"))
    assert [kept.digests(f"w1-{i}") is not None for i in range(5)] == [False, False, True, True, True]
    assert sorted(p.name[:4] for p in (tmp_path / "kept").iterdir()) == ["w1-2", "w1-3", "w1-4"]  # the rest deleted
    kept.commit("../escape", kept.stage(_round(tmp_path / "evil", b"x"), "../escape"))
    assert not (tmp_path / "escape").exists() and kept.digests("../escape") is None
    assert len(list((tmp_path / "kept").iterdir())) == 3
    with pytest.raises(InvalidSubmission) as e:  # a verifier could never be served it: refused at admission
        kept.stage(_round(tmp_path / "big", b"x", size=MAX_SERVED // 2), "w1-big")
    assert e.value.code == "too_large"
