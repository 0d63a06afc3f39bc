"""docs/config.md is generated from the config's field descriptions and kept current."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from hubgrpo.config import field_docs
from hubgrpo.config.reference import markdown

ROOT = Path(__file__).resolve().parents[2]


def test_docs_config_md_is_current():
    assert (ROOT / "docs" / "config.md").read_text() == markdown(), (
        "docs/config.md is stale: run `hubgrpo config fields --markdown > docs/config.md`")


def test_every_key_is_in_the_reference_once_with_its_default():
    text = markdown()
    for key, default, _ in field_docs():
        assert text.count(f"| `{key}` |") == 1, key
    assert '| `rewards` | `[{"function": "builtin:exact_answer"' in text  # models as a config would write them


def test_the_installed_command_prints_it():
    exe = Path(sys.executable).with_name("hubgrpo")
    r = subprocess.run([str(exe), "config", "fields", "--markdown"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout == markdown()
