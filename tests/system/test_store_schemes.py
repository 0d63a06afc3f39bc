"""A repo of a scheme no store supports: refused by ``open_store`` and by the installed command, no folder made."""

from __future__ import annotations

from pathlib import Path

import pytest


def test_an_unsupported_scheme_is_refused_not_made_a_folder(tmp_path, monkeypatch):
    import subprocess
    import sys

    from hubgrpo.errors import ConfigError
    from hubgrpo.store import open_store

    monkeypatch.chdir(tmp_path)
    for repo in ("gs://b/r", "http://example.com/run", "S3x://bucket/run"):
        with pytest.raises(ConfigError, match="does not support"):
            open_store(repo)
    assert type(open_store("s3://bucket/run")).__name__ == "S3Store"  # opening makes no request
    exe = Path(sys.executable).with_name("hubgrpo")
    cfg = Path(__file__).resolve().parents[2] / "configs" / "tiny.yaml"
    r = subprocess.run([str(exe), "init", str(cfg), "--repo", "gs://bucket/run"], capture_output=True, text=True,
                       timeout=120, cwd=str(tmp_path))
    assert r.returncode != 0 and "gs://" in r.stderr and not (tmp_path / "gs:").exists()
