"""The bucket: one ``Store`` contract (``base``) over a local directory (``local``) and a Hub repo (``hub``).

``open_store(repo)`` picks the backend from the repo string. Nothing here imports torch or gradio.
"""

from __future__ import annotations

from pathlib import Path

from hubgrpo.store.base import Store


def open_store(repo: str, *, token: str | None = None, endpoint: str | None = None) -> Store:
    """``user/name`` (or ``hf://user/name``) means the Hub; a path or ``file://…`` means a local directory."""
    import re

    from hubgrpo.errors import ConfigError
    from hubgrpo.store.local import LocalStore

    scheme = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://", repo)
    if scheme and scheme.group(1).lower() not in ("file", "hf"):
        raise ConfigError(f"the repo {repo!r} uses the scheme {scheme.group(1)}://, which hubgrpo does not support",
                          hint="use user/name (a Hub repo, or hf://user/name) or a local path (or file://path)")
    if repo.startswith("file://"):
        return LocalStore(repo[len("file://"):])
    if repo.startswith("hf://"):
        repo = repo[len("hf://"):]
    elif repo.startswith((".", "/", "~")) or Path(repo).exists() or repo.count("/") != 1:
        return LocalStore(Path(repo).expanduser())
    from hubgrpo.store.hub import HubStore

    return HubStore(repo, token=token, endpoint=endpoint)
