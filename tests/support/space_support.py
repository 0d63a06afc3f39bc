"""Shared set-up for the Space tests (no tests here): a run repo on the Hub emulator with synthetic adapters,
users with and without access, and a simulated worker that submits through the store or through the Space."""

from __future__ import annotations

import time
from pathlib import Path


from hubgrpo import layout
from hubgrpo.coordinator.repo_init import init_repo
from hubgrpo.worker.client import CoordinatorClient
from hubgrpo.coordinator.core import Coordinator
from hubgrpo.store.hub import HubStore
from tests.support import coord_helpers
from tests.support.chaos_helpers import wait_for
from tests.support.coord_helpers import (MODULES, R, make_config, submission_record, trained_adapter,
                                 write_rollouts)

SECRET = b"space-test-secret"
ALICE, BOB, MALLORY = "hf_space_alice", "hf_space_bob", "hf_space_mallory"
USERS = {ALICE: "alice", BOB: "bob", MALLORY: "mallory"}
ORGS = {"bob": ["friends"]}  # bob is allowed through his org


# What peft's LoraConfig(r=R, lora_alpha=8, target_modules=MODULES).to_dict() holds that matters to admission and
# merging; written by hand so these tests never import peft (which imports transformers: ~9 s on 2 busy cores).
ADAPTER_CONFIG = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": "builtin:tiny",
                  "r": R, "lora_alpha": 8, "lora_dropout": 0.0, "target_modules": sorted(MODULES), "bias": "none",
                  "use_rslora": False, "use_dora": False, "fan_in_fan_out": False, "inference_mode": False}


def write_adapter(folder: Path, seed: int, b_scale: float = 0.0, layers: int = 2) -> Path:
    """``coord_helpers.write_adapter`` with the hand-written config (b_scale=0: equal to the base model)."""
    return coord_helpers.write_adapter(folder, seed, b_scale, layers, config=ADAPTER_CONFIG)


def push_submission(store, lease, tmp: Path, *, seed: int, reward: float, reader=None) -> str:
    """A worker with write access: one commit with its submission folder. Returns the commit sha."""
    folder = submission_folder(lease, tmp, seed=seed, reward=reward, reader=reader or store)
    adds = {layout.submission_path(lease.base_version, folder.name, f.name): f for f in folder.iterdir()}
    return store.commit(adds, message=f"hubgrpo: submission {folder.name}")


def start_emulator():
    """A Hub emulator with alice (run owner), bob (member of the allowed org 'friends') and mallory."""
    from tests.support.hub_emulator import HubEmulator

    emu = HubEmulator(users=USERS).start()
    emu.api.orgs.update(ORGS)
    return emu


def make_run(emu, tmp_path: Path, name: str = "run", **overrides) -> HubStore:
    """alice/<name> on the emulator: version 0 with a synthetic adapter; alice and the org 'friends' allowed; every
    version a checkpoint (tagged) unless ``coordinator.checkpoint_every_s`` is given."""
    settings = {"coordinator.allowed_users": "[alice, friends]", "rounds.versions": 2, "merge.quorum": 2,
                "coordinator.rate_limit_per_minute": 600, "coordinator.checkpoint_every_s": 0, **overrides}
    cfg = make_config(**settings)
    store = HubStore(f"alice/{name}", token=ALICE, endpoint=emu.url, cache_dir=tmp_path / "hf-cache",
                     retry_base_s=0.05)
    init_repo(store, cfg, write_adapter(tmp_path / f"{name}-v0", seed=0, b_scale=0.0))
    return store


def new_coordinator(store: HubStore, tmp_path: Path) -> Coordinator:
    """A coordinator over ``store`` (a fresh work dir each time, like a restarted Space)."""
    return Coordinator(store, SECRET, workdir=tmp_path / f"coord-{time.monotonic_ns()}")


def submission_folder(lease, dest: Path, *, seed: int, reward: float, mutate=None, reader=None) -> Path:
    """What a worker's round leaves behind: adapter files and submission.json, in ``dest/<submission id>``; the
    adapter is the leased version (read through ``reader``) with B moved a little (version 0 without a reader)."""
    where = dest / layout.submission_id(lease.worker, lease.lease_id)
    folder = trained_adapter(reader, lease, where, seed, 0.1) if reader is not None else write_adapter(where, seed, 0.1)
    (folder / layout.SUBMISSION_FILE).write_bytes(submission_record(lease, reward).to_json())
    write_rollouts(folder, lease, reward=reward)
    if mutate:
        mutate(folder)
    return folder


class SimWorker:
    """A worker without a model: leases, 'trains' (a synthetic adapter), then commits + submits (``store``) or
    uploads through the Space (``store=None``)."""

    def __init__(self, url: str, name: str, token: str | None, tmp: Path, *, transport: str = "http",
                 store: HubStore | None = None, reader: HubStore | None = None):
        """``store``: commits there; else uploads. The leased version comes from the coordinator's adapter route,
        as a worker's does (``reader``, the repo, is no longer read: callers may still pass it)."""
        self.client = CoordinatorClient(url, token=token, transport=transport, retries=1, backoff=0.05)
        self.name, self.tmp, self.store, self.reader = name, tmp / name, store, reader or store
        self.seed = abs(hash(name)) % 1000

    def lease(self):
        return self.client.lease(self.name)

    def finish(self, lease, reward: float) -> dict:
        """Deliver the round's submission for ``lease`` and return the coordinator's answer."""
        self.seed += 1
        if self.store is not None:
            sha = push_submission(self.store, lease, self.tmp, seed=self.seed, reward=reward, reader=self.client)
            return self.client.submit(lease, sha)
        return self.client.upload(lease, submission_folder(lease, self.tmp, seed=self.seed, reward=reward,
                                                           reader=self.client))

    def close(self) -> None:
        self.client.close()


def run_versions(workers: list[SimWorker], versions: int, rewards=(0.2, 0.4)) -> list[dict]:
    """Each version: every worker leases, then each delivers (quorum = len(workers)), then the background merge
    is waited for. Returns all answers."""
    answers = []
    for v in range(versions):
        target = workers[0].client.status()["version"] + 1
        leases = [w.lease() for w in workers]
        for i, (w, lease) in enumerate(zip(workers, leases)):
            answers.append(w.finish(lease, reward=rewards[i % len(rewards)] + 0.1 * v))
        wait_for_version(workers[0].client, target)
    return answers


def wait_for_version(client, version: int, timeout: float = 30.0) -> dict:
    """Poll ``status`` until the run reaches ``version`` (merges run in the server's background thread)."""
    def reached():
        status = client.status()
        return status if status["version"] >= version else None

    return wait_for(reached, timeout, f"version {version}", poll=0.05)


def wait_for_checkpoint(client, version: int, timeout: float = 30.0) -> dict:
    """Poll ``status`` until the run repo holds a checkpoint of ``version`` or later (a served coordinator commits
    it from its tick thread after the merge, so the live version comes first)."""
    def reached():
        status = client.status()
        return status if status["checkpoint"]["version"] >= version else None

    return wait_for(reached, timeout, f"the checkpoint of version {version}", poll=0.05)
