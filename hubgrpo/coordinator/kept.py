"""The record and rollouts of admitted rounds exactly as admission read them, kept for the verifier.

A verifier replays a round from its submission.json and rollouts file (``hubgrpo.worker.verifier``). Read again from
the round's folder or inbox at verify time, they could differ from what admission checked: a worker with a presigned
POST URL (valid for ``upload_ttl_s``), or with write access to a bucket or the repo, can replace them after
admission with completions the leased version really wrote and pass a forged round. So admission keeps its own copy
of both files (``keep``, in this process's scratch folder), the status lists their sha256 beside each round awaiting
its verdict (``verdicts.todo``), and the coordinator serves that copy (``round_files``) to a verifier that cannot
read the inbox. The newest ``LIMIT`` rounds are kept (a round older than that has merged long ago, or was refused);
a restarted coordinator keeps what it admits from then on (pending rounds are admitted again by its scan).
"""

from __future__ import annotations

import hashlib
import shutil
import threading
import uuid
from collections import OrderedDict
from pathlib import Path

from hubgrpo import layout

FILES = (layout.SUBMISSION_FILE, layout.ROLLOUTS_FILE)  # what a verifier replays a round from
LIMIT = 1024  # rounds kept (the status lists at most 256 awaiting a verdict: ``verdicts.MAX_TODO``)


class KeptRounds:
    """Copies of admitted rounds' ``FILES`` under ``root``, the newest ``limit``; thread-safe (disk I/O only)."""

    def __init__(self, root: Path, limit: int = LIMIT):
        self.root, self.limit = Path(root), int(limit)
        self._lock = threading.Lock()
        self._digests: OrderedDict[str, dict[str, str]] = OrderedDict()  # submission id → {file: sha256 hex}

    def keep(self, sub_id: str, folder: Path) -> None:
        """Copy the round's files from the ``folder`` admission checked (a name ``layout`` allows: ``sub_id``)."""
        if not layout.is_name(sub_id) or not all((folder / name).is_file() for name in FILES):
            return  # admission refuses such a round anyway
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".tmp-{uuid.uuid4().hex}"
        tmp.mkdir()
        digests = {}
        for name in FILES:
            data = (folder / name).read_bytes()
            (tmp / name).write_bytes(data)
            digests[name] = hashlib.sha256(data).hexdigest()
        with self._lock:
            dest = self.root / sub_id
            shutil.rmtree(dest, ignore_errors=True)  # admitted again (a restart's scan, an upload's second check)
            tmp.rename(dest)
            self._digests.pop(sub_id, None)
            self._digests[sub_id] = digests
            gone = [self._digests.popitem(last=False)[0] for _ in range(len(self._digests) - self.limit)]
        for old in gone:
            shutil.rmtree(self.root / old, ignore_errors=True)

    def digests(self, sub_id: str) -> dict[str, str] | None:
        """sha256 of each kept file of ``sub_id``; None when it is not kept."""
        with self._lock:
            found = self._digests.get(sub_id)
        return dict(found) if found is not None else None

    def files(self, sub_id: str) -> dict[str, bytes] | None:
        """The kept files of ``sub_id`` (checked against their digests); None when it is not kept."""
        with self._lock:
            digests = self._digests.get(sub_id)
            if digests is None:
                return None
            try:
                out = {name: (self.root / sub_id / name).read_bytes() for name in FILES}
            except OSError:
                return None
        if any(hashlib.sha256(out[n]).hexdigest() != digests[n] for n in FILES):
            return None  # changed on this disk: not the admitted bytes
        return out
