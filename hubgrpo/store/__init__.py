"""The bucket: one ``Store`` contract (``base``) over a local directory (``local``) and a Hub repo (``hub``).

``open_store(repo)`` picks the backend from the repo string. Nothing here imports torch or gradio.
"""

from __future__ import annotations

from pathlib import Path

from hubgrpo.store.base import Store


def open_store(repo: str, *, token: str | None = None, endpoint: str | None = None) -> Store:
    """``user/name`` (or ``hf://user/name``) means the Hub; a path or ``file://…`` means a local directory."""
    from hubgrpo.store.local import LocalStore

    if repo.startswith("file://"):
        return LocalStore(repo[len("file://"):])
    if repo.startswith("hf://"):
        repo = repo[len("hf://"):]
    elif repo.startswith((".", "/", "~")) or Path(repo).exists() or repo.count("/") != 1:
        return LocalStore(Path(repo).expanduser())
    from hubgrpo.store.hub import HubStore

    return HubStore(repo, token=token, endpoint=endpoint)
