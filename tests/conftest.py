"""Shared fixtures. Nothing here reaches the internet: the Hub is the local emulator on 127.0.0.1."""

from __future__ import annotations

import os
import tempfile

import pytest

# Keep downloads of the Hub emulator's files out of the user's cache (set before huggingface_hub is imported).
os.environ["HF_HOME"] = tempfile.mkdtemp(prefix="hubgrpo-test-hf-")
os.environ.setdefault("HUBGRPO_CACHE", tempfile.mkdtemp(prefix="hubgrpo-test-cache-"))

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_HUB_DISABLE_XET", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.pop("HF_HUB_OFFLINE", None)  # it would block 127.0.0.1 too

TEST_TOKEN = "hf_test_alice_token"


@pytest.fixture
def hub_emulator(tmp_path):
    """A fresh local Hub emulator (real HTTP on 127.0.0.1) with user 'alice' owning TEST_TOKEN."""
    from tests.hub_emulator import HubEmulator

    emu = HubEmulator(users={TEST_TOKEN: "alice"}).start()
    try:
        yield emu
    finally:
        emu.stop()


@pytest.fixture(params=["local", "hub"])
def store_factory(request, tmp_path):
    """Returns make(name) -> a fresh Store of the parametrized backend; same name → same repo."""
    if request.param == "local":
        from hubgrpo.store.local import LocalStore

        def make(name: str = "run"):
            s = LocalStore(tmp_path / name)
            s.create(exist_ok=True)
            return s

        make.kind = "local"
        yield make
        return
    emu = request.getfixturevalue("hub_emulator")
    from hubgrpo.store.hub import HubStore

    def make(name: str = "run"):
        s = HubStore(f"alice/{name}", token=TEST_TOKEN, endpoint=emu.url)
        s.create(exist_ok=True)
        return s

    make.kind = "hub"
    make.emulator = emu
    yield make
