"""Rounds of an ffa run uploaded without their A factors, in the binary body (``hubgrpo.upload_body``), to a real
coordinator app on 127.0.0.1 (``hub.submissions: coordinator``): admitted and merged exactly, the old full shape
and the JSON body still accepted, every hostile variant refused by name, a malformed body refused before any
endpoint runs."""

from __future__ import annotations

import json
import struct
import time

import httpx
import pytest
import torch
from safetensors.torch import load, load_file, save

from hubgrpo import layout, runrepo, upload_body
from hubgrpo.coordinator.core import Coordinator
from hubgrpo.coordinator.repo_init import init_repo
from hubgrpo.errors import InvalidSubmission
from hubgrpo.merge.frozen_a import is_a_key, strip_a
from hubgrpo.space.app import serve_space
from hubgrpo.store.local import LocalStore
from hubgrpo.worker.client import CoordinatorClient
from hubgrpo.worker.json_body import Base64Text
from tests.support.coord_helpers import make_config, submission_record, trained_adapter, write_adapter, write_rollouts


@pytest.fixture
def run(tmp_path, monkeypatch):
    """(store, client, url) of a served ffa run whose rounds go through the upload route; quorum 3."""
    monkeypatch.setenv("HUBGRPO_CACHE", str(tmp_path / "cache"))
    store = LocalStore(tmp_path / "repo")
    cfg = make_config(**{"hub.submissions": "coordinator", "merge.method": "ffa", "merge.quorum": 3})
    init_repo(store, cfg, write_adapter(tmp_path / "v0", seed=0))
    coord = Coordinator(store, b"b-only-secret", workdir=tmp_path / "coord")
    app, url = serve_space(coord, batch_wait_s=0.1, tick_interval=0.05)
    client = CoordinatorClient(url, retries=1)
    yield store, client, url
    client.close()
    app.hubgrpo_uploads.close()
    app.close(verbose=False)


def _round(store, client, tmp_path, seed: int, mutate=None):
    """(lease, folder) of a trained round whose adapter file holds no A factors (``mutate`` changes its tensors)."""
    lease = client.lease(f"w{seed}")
    folder = trained_adapter(store, lease, tmp_path / "rounds" / lease.lease_id, seed, 0.1)
    write_rollouts(folder, lease, runrepo.read_config(store))
    (folder / layout.SUBMISSION_FILE).write_bytes(submission_record(lease).to_json())
    weights = folder / layout.ADAPTER_WEIGHTS
    data = strip_a(weights.read_bytes())
    weights.write_bytes(save(mutate(load(data))) if mutate else data)
    return lease, folder


def _b_key(tensors: dict) -> str:
    return next(k for k in sorted(tensors) if ".lora_B" in k)


def _adapter(store) -> dict:
    """The run repo's adapter at its head (the last checkpoint)."""
    return load(store.read(layout.ADAPTER_WEIGHTS, store.head()))


def _smuggled_a(store):
    v0 = _adapter(store)
    key = next(k for k in sorted(v0) if is_a_key(k))
    return lambda w: {**w, key: v0[key] + 0.5}


@pytest.mark.timeout(180)
def test_b_only_rounds_are_admitted_merged_and_hostile_ones_refused(run, tmp_path):
    store, client, url = run
    v0 = _adapter(store)
    lease, folder = _round(store, client, tmp_path, seed=1)
    assert client.upload(lease, folder, frozen_a=True)["status"] == "admitted"
    inbox = [p for p in (tmp_path / "cache" / "rounds").rglob(layout.ADAPTER_WEIGHTS)]
    assert len(inbox) == 1 and not any(is_a_key(k) for k in load_file(inbox[0]))  # kept as it came: half the bytes
    full_lease = client.lease("w2")  # the old shape (every A factor sent, equal to the run's): still admitted
    full = trained_adapter(store, full_lease, tmp_path / "full", 2, 0.1)
    write_rollouts(full, full_lease, runrepo.read_config(store))
    (full / layout.SUBMISSION_FILE).write_bytes(submission_record(full_lease).to_json())
    assert client.upload(full_lease, full)["status"] == "admitted"

    hostile = {
        "shape": lambda w: {**w, _b_key(w): torch.zeros(3, 2)},
        "extra_keys": lambda w: {**w, "base_model.model.lm_head.lora_B.weight": torch.zeros(2, 2)},
        "missing_keys": lambda w: {k: v for k, v in w.items() if k != _b_key(w)},
        "a_changed": _smuggled_a(store),
        "nonfinite": lambda w: {**w, _b_key(w): torch.full_like(w[_b_key(w)], float("inf"))},
    }
    for seed, (code, mutate) in enumerate(hostile.items(), start=10):
        bad_lease, bad = _round(store, client, tmp_path, seed, mutate)
        with pytest.raises(InvalidSubmission) as exc:
            client.upload(bad_lease, bad)  # as it is: nothing stripped from what the test made
        assert exc.value.code == code, exc.value.message
    assert len([p for p in (tmp_path / "cache" / "rounds").rglob(layout.ADAPTER_WEIGHTS)]) == 2  # refused: gone

    json_lease, json_folder = _round(store, client, tmp_path, seed=3)  # the JSON body (gradio_client's) alike
    files = {n: Base64Text.of((json_folder / n).read_bytes()) for n in layout.SUBMISSION_FILES}
    answer = client._call("upload", json_lease.model_dump(mode="json"), files)
    assert answer["status"] in ("admitted", "merged"), answer
    deadline = time.monotonic() + 60
    while runrepo.read_state(store).version < 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    v1 = _adapter(store)  # the checkpoint: a whole PEFT adapter, A as at v0
    assert runrepo.read_state(store).version == 1 and set(v1) == set(v0)
    assert all(torch.equal(v1[k], v0[k]) for k in v0 if is_a_key(k))
    assert not all(torch.equal(v1[k], v0[k]) for k in v0)



@pytest.mark.timeout(120)
def test_a_malformed_binary_body_is_refused_before_any_endpoint_runs(run):
    url = run[2]
    post = httpx.Client(base_url=url, timeout=30).post
    octet = {"Content-Type": upload_body.MEDIA_TYPE}
    lease = post("/hubgrpo/api/lease", content=b"\x00" * 8, headers=octet)
    assert lease.status_code == 415 and "application/json" in lease.json()["error"]["message"]
    head = json.dumps({"data": [{}, {layout.ADAPTER_WEIGHTS: 10}, None]}).encode()
    short = post("/hubgrpo/api/upload", content=struct.pack("<I", len(head)) + head + b"\x00" * 9, headers=octet)
    assert short.status_code == 400 and "10 bytes of files" in short.json()["error"]["message"]
    lying = post("/hubgrpo/api/upload", content=struct.pack("<I", 1 << 30) + head, headers=octet)
    assert lying.status_code == 400 and "head claims" in lying.json()["error"]["message"]
    nan = b'{"data": [{}, {"x": NaN}, null]}'
    strict = post("/hubgrpo/api/upload", content=struct.pack("<I", len(nan)) + nan, headers=octet)
    assert strict.status_code == 400 and "not accepted JSON" in strict.json()["error"]["message"]
    huge = post("/hubgrpo/api/upload", content=b"\x00" * (64 << 20), headers=octet)  # past what a round weighs
    assert huge.status_code == 413
