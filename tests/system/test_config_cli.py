"""Config, through the command: ``hubgrpo --help`` answers, and importing the CLI loads no heavy library."""

from __future__ import annotations

import subprocess
import sys


def test_help_is_fast_and_light():
    code = ("import sys, time; t=time.time(); from hubgrpo.cli.main import app; import hubgrpo.config, hubgrpo.layout, "
            "hubgrpo.errors, hubgrpo.store.base; heavy=[m for m in ('torch','gradio','transformers','trl','peft') "
            "if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
    r = subprocess.run([sys.executable, "-m", "hubgrpo.cli", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "config" in r.stdout
