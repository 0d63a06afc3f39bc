"""The Store interface: a run repo with atomic commits, history, tags and compare-and-swap.

Three backends share one contract (tests/integration/test_store_contract.py): ``LocalStore`` (a directory; the
embedded default), ``HubStore`` (a Hugging Face Hub model repo through ``HfApi``) and ``S3Store``
(``s3://bucket/prefix`` through boto3). A revision is an opaque string (a 40-hex commit sha on every backend). Paths
are POSIX, relative, without ``..``, backslashes or empty segments.
"""

from __future__ import annotations

import abc
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hubgrpo.errors import InvalidPath, StoreError

MARKER_PREFIX = "hubgrpo-commit-id: "
SHA1_RE = re.compile(r"[0-9a-f]{40}")  # a revision: a 40-hex commit id on every backend
TAG_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


@dataclass(frozen=True)
class CommitInfo:
    """One commit of the run repo, newest first in ``Store.history``."""

    sha: str
    message: str
    created_at: float
    marker: str | None = None  # the unique id written in the commit description (lost-answer detection)
    parents: tuple[str, ...] = field(default_factory=tuple)


def check_path(path: str) -> str:
    """Refuse paths that could escape the repo or mean different things on different systems."""
    if not isinstance(path, str) or not path:
        raise InvalidPath(f"empty repo path {path!r}", hint="give a relative POSIX path such as 'state.json'")
    bad = None
    if "\\" in path:
        bad = "contains a backslash"
    elif path.startswith("/") or (len(path) > 1 and path[1] == ":"):
        bad = "is absolute"
    elif any(seg in ("", ".", "..") for seg in path.split("/")):
        bad = "has an empty, '.' or '..' segment"
    elif any(ord(c) < 32 for c in path):
        bad = "contains a control character"
    elif path.split("/")[0] == ".git":
        bad = "is inside .git"
    if bad:
        raise InvalidPath(f"repo path {path!r} {bad}", hint="use a relative POSIX path inside the repo")
    return path


def check_tag_name(name: str) -> str:
    """Refuse tag names that no backend accepts, or that could be read as a branch or a commit sha."""
    if not isinstance(name, str) or not TAG_RE.fullmatch(name) or name == "main" or SHA1_RE.fullmatch(name):
        raise StoreError(f"invalid tag name {name!r}", hint="use letters, digits, '.', '_' or '-' (e.g. v000001)")
    return name


class Store(abc.ABC):
    """A run repo. All methods are safe to call from several threads and processes at once."""

    #: human-readable location (a path or a Hub URL)
    location: str

    @abc.abstractmethod
    def create(self, *, exist_ok: bool = True, private: bool = True) -> None:
        """Create the repo if it does not exist (``exist_ok=False``: raise when it does)."""

    @abc.abstractmethod
    def exists(self) -> bool:
        """Whether the repo exists."""

    @abc.abstractmethod
    def head(self) -> str | None:
        """The current revision of the main branch; None for a repo with no commit."""

    @abc.abstractmethod
    def read(self, path: str, revision: str | None = None) -> bytes:
        """Bytes of ``path`` at ``revision`` (default head). Raises NotFound."""

    @abc.abstractmethod
    def local_path(self, path: str, revision: str | None = None) -> Path:
        """A local, read-only file with the content of ``path`` at ``revision`` (a cached download on the Hub)."""

    @abc.abstractmethod
    def list_files(self, prefix: str = "", revision: str | None = None) -> list[str]:
        """All file paths under ``prefix`` (recursive, sorted) at ``revision``."""

    @abc.abstractmethod
    def file_sizes(self, prefix: str = "", revision: str | None = None) -> dict[str, int]:
        """{path: size in bytes} of the files under ``prefix`` at ``revision``, read from the listing: nothing
        is downloaded (check sizes before fetching what a participant wrote)."""

    @abc.abstractmethod
    def commit(
        self, adds: Mapping[str, bytes | Path], deletes: Sequence[str] = (), *, message: str, parent: str | None = None
    ) -> str:
        """Apply adds and deletes as one atomic commit and return the new revision.

        ``parent``: compare-and-swap — raise CommitConflict unless the head is still ``parent``.
        A delete of a path ending in '/' deletes that folder. Retries on transient faults never duplicate a commit.
        """

    @abc.abstractmethod
    def history(self, limit: int | None = None) -> list[CommitInfo]:
        """Commits of the main branch, newest first."""

    @abc.abstractmethod
    def tag(self, name: str, revision: str, *, exist_ok: bool = False) -> None:
        """Tag ``revision`` as ``name`` (CommitConflict-free; raises StoreError if it exists and not exist_ok)."""

    @abc.abstractmethod
    def tags(self) -> dict[str, str]:
        """All tags: name → revision."""

    def exists_file(self, path: str, revision: str | None = None) -> bool:
        return path in self.list_files(path.rsplit("/", 1)[0] if "/" in path else "", revision)
