"""The bucket: one ``Store`` contract (``base``) over a local directory (``local``), a Hub repo (``hub``) and an
S3-compatible bucket (``s3``, which needs boto3: ``pip install 'hubgrpo[s3]'``).

``open_store(repo)`` picks the backend from the repo string. Nothing here imports torch, gradio or boto3.
"""

from __future__ import annotations

from pathlib import Path

from hubgrpo.store.base import Store


def open_store(repo: str, *, token: str | None = None, endpoint: str | None = None) -> Store:
    """``user/name`` (or ``hf://user/name``) means the Hub; ``s3://bucket/prefix`` an S3-compatible bucket (endpoint
    from ``AWS_ENDPOINT_URL``, credentials the usual boto3 way); a path or ``file://…`` a local directory."""
    import re

    from hubgrpo.errors import ConfigError
    from hubgrpo.store.local import LocalStore

    scheme = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://", repo)
    if scheme and scheme.group(1).lower() not in ("file", "hf", "s3"):
        raise ConfigError(
            f"the repo {repo!r} uses the scheme {scheme.group(1)}://, which hubgrpo does not support",
            hint="use user/name (a Hub repo, or hf://user/name), s3://bucket/prefix, or a local path (or file://path)",
        )
    if repo.startswith("s3://"):
        from hubgrpo.store.s3 import S3Store

        return S3Store(repo)
    if repo.startswith("file://"):
        return LocalStore(repo[len("file://") :])
    if repo.startswith("hf://"):
        repo = repo[len("hf://") :]
    elif repo.startswith((".", "/", "~")) or Path(repo).exists() or repo.count("/") != 1:
        return LocalStore(Path(repo).expanduser())
    from hubgrpo.store.hub import HubStore

    return HubStore(repo, token=token, endpoint=endpoint)
