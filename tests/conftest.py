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

# S3: never the developer's credentials or AWS itself. Fake keys, no profile files, no instance metadata, and an
# endpoint on a closed loopback port unless a test points a store at its own S3 server (``s3_server``).
os.environ.update(AWS_ACCESS_KEY_ID="hubgrpo-test-key", AWS_SECRET_ACCESS_KEY="hubgrpo-test-secret",
                  AWS_DEFAULT_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true",
                  AWS_ENDPOINT_URL="http://127.0.0.1:9", AWS_CONFIG_FILE=os.devnull,
                  AWS_SHARED_CREDENTIALS_FILE=os.devnull)
for _var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
    os.environ.pop(_var, None)

TEST_TOKEN = "hf_test_alice_token"


@pytest.fixture
def hub_emulator(tmp_path):
    """A fresh local Hub emulator (real HTTP on 127.0.0.1) with user 'alice' owning TEST_TOKEN."""
    from tests.support.hub_emulator import HubEmulator

    emu = HubEmulator(users={TEST_TOKEN: "alice"}).start()
    try:
        yield emu
    finally:
        emu.stop()


@pytest.fixture(scope="session")
def s3_server():
    """A moto S3 server (real HTTP on 127.0.0.1, conditional writes atomic) for the whole session."""
    from tests.support.s3_server import S3Server

    server = S3Server().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_bucket_url(s3_server, monkeypatch):
    """``s3://<a fresh bucket>`` on the session's S3 server, with AWS_ENDPOINT_URL pointing at it."""
    import uuid

    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.url)
    return f"s3://test-{uuid.uuid4().hex[:20]}"


@pytest.fixture(params=["local", "hub", "s3"])
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
    if request.param == "s3":
        from hubgrpo.store.s3 import S3Store

        bucket_url = request.getfixturevalue("s3_bucket_url")

        def make(name: str = "run"):
            s = S3Store(f"{bucket_url}/{name}", cache_dir=tmp_path / "s3-cache", retry_base_s=0.05)
            s.create(exist_ok=True)
            return s

        make.kind = "s3"
        make.url = bucket_url
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
