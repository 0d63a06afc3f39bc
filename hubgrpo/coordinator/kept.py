"""The record and rollouts of admitted rounds exactly as admission read them, kept for the verifier.

A verifier replays a round from its submission.json and rollouts file (``hubgrpo.worker.verifier``). Read again from
the round's folder or inbox at verify time, they could differ from what admission checked: a worker with a presigned
POST URL (valid for ``upload_ttl_s``), or with write access to a bucket or the repo, can replace them after
admission with completions the leased version really wrote and pass a forged round. So admission copies both files
while it checks the round (``stage``, outside the coordinator's lock), the copy becomes the round's when the round
is accepted (``commit``, under the lock: a second check of the same round that loses as a duplicate never replaces
it), the status lists their sha256 beside each round awaiting its verdict (``verdicts.todo``), and the coordinator
serves that copy (``round_files``). The newest ``LIMIT`` rounds are kept in this process's scratch folder (older ones
merged long ago); a restarted coordinator keeps what it admits from then on (its scan admits pending rounds again).
"""

from __future__ import annotations

import hashlib
import shutil
import threading
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from hubgrpo import layout
from hubgrpo.errors import InvalidSubmission

FILES = (layout.SUBMISSION_FILE, layout.ROLLOUTS_FILE)  # what a verifier replays a round from
LIMIT = 1024  # rounds kept (the status lists at most 256 awaiting a verdict: ``verdicts.MAX_TODO``)
MAX_SERVED = 11 << 20  # record + rollouts of a verified round (in base64 within a verifier's 16 MiB answer cap)


@dataclass
class Staged:
    """A copy of a round's ``FILES`` being checked, not yet the round's."""

    folder: Path
    digests: dict[str, str]


class KeptRounds:
    """Copies of admitted rounds' ``FILES`` under ``root``, the newest ``limit``; thread-safe (disk I/O only)."""

    def __init__(self, root: Path, limit: int = LIMIT):
        self.root, self.limit = Path(root), int(limit)
        self._lock = threading.Lock()
        self._kept: OrderedDict[str, Staged] = OrderedDict()  # submission id → its files' folder and sha256

    def stage(self, folder: Path, sub_id: str) -> Staged:
        """Copy the round's files from the ``folder`` admission checks; ``too_large`` past ``MAX_SERVED`` (a
        verifier could never be served it, so the round could never be judged)."""
        files = {name: (folder / name).read_bytes() for name in FILES if (folder / name).is_file()}
        if sum(map(len, files.values())) > MAX_SERVED:
            raise InvalidSubmission(
                "too_large",
                f"{' and '.join(FILES)} of {sub_id} hold more than the {MAX_SERVED:,} bytes a verified round may",
                hint="this run verifies its rounds (coordinator.verify): use fewer or shorter completions per round",
            )
        self.root.mkdir(parents=True, exist_ok=True)
        staged = Staged(self.root / f".staged-{uuid.uuid4().hex}", {})
        try:
            staged.folder.mkdir()
            for name, data in files.items():
                (staged.folder / name).write_bytes(data)
                staged.digests[name] = hashlib.sha256(data).hexdigest()
        except BaseException:
            self.discard(staged)
            raise
        return staged

    def commit(self, sub_id: str, staged: Staged) -> None:
        """``staged`` becomes the kept copy of ``sub_id`` (call when the round is accepted); the oldest go."""
        if not layout.is_name(sub_id) or sorted(staged.digests) != sorted(FILES):
            return self.discard(staged)  # admission refuses such a round anyway
        final = Staged(self.root / f"{sub_id}-{uuid.uuid4().hex[:12]}", staged.digests)
        staged.folder.rename(final.folder)
        with self._lock:
            old = self._kept.pop(sub_id, None)
            self._kept[sub_id] = final
            gone = [self._kept.popitem(last=False)[1] for _ in range(len(self._kept) - self.limit)]
        for dead in [*gone, *([old] if old is not None else [])]:
            shutil.rmtree(dead.folder, ignore_errors=True)

    def discard(self, staged: Staged | None) -> None:
        """Drop a copy that never became a round's (refused, a duplicate)."""
        if staged is not None:
            shutil.rmtree(staged.folder, ignore_errors=True)

    def digests(self, sub_id: str) -> dict[str, str] | None:
        """sha256 of each kept file of ``sub_id``; None when it is not kept."""
        with self._lock:
            found = self._kept.get(sub_id)
        return dict(found.digests) if found is not None else None

    def files(self, sub_id: str) -> dict[str, bytes] | None:
        """The kept files of ``sub_id`` (checked against their digests); None when it is not kept."""
        with self._lock:
            found = self._kept.get(sub_id)
        if found is None:
            return None
        try:
            out = {name: (found.folder / name).read_bytes() for name in FILES}
        except OSError:
            return None  # evicted meanwhile
        if any(hashlib.sha256(out[n]).hexdigest() != found.digests[n] for n in FILES):
            return None  # changed on this disk: not the admitted bytes
        return out
