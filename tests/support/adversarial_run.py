"""A served coordinator over a local run repo with an honest and a hostile participant (HTTP + repo commits)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from safetensors.torch import load_file

from hubgrpo import layout
from hubgrpo.coordinator.core import Coordinator
from hubgrpo.coordinator.repo_init import init_repo
from hubgrpo.errors import InvalidSubmission
from hubgrpo.layout import RunState
from hubgrpo.space.api import serve
from hubgrpo.store.local import LocalStore
from hubgrpo.worker.client import CoordinatorClient
from tests.support.coord_helpers import (
    make_config,
    submission_record,
    trained_adapter,
    write_adapter,
    write_rollouts,
)

SECRET = b"adversarial-test-secret"


class Run:
    """A served coordinator over a local run repo, an honest worker and a hostile one (HTTP + repo commits)."""

    def __init__(self, tmp: Path, **settings):
        cfg = make_config(
            **{
                "merge.quorum": 1,
                "merge.max_staleness": 4,
                "rounds.versions": 1000,
                "coordinator.commit_budget_per_hour": 1000,
                **settings,
            }
        )
        self.tmp, self.store = tmp, LocalStore(tmp / "repo")
        init_repo(self.store, cfg, write_adapter(tmp / "v0", seed=0, b_scale=0.0))
        self.coord = Coordinator(self.store, SECRET, workdir=tmp / "coord")
        self.app, self.url = serve(self.coord, tick_interval=0.05)
        self.client = CoordinatorClient(self.url, retries=0)
        self.seed = 100

    def folder(self, lease, *, scale: float = 0.1) -> Path:
        """An honest round's folder (trained from the leased version), to be forged further by the caller."""
        self.seed += 1
        folder = trained_adapter(self.client, lease, self.tmp / "rounds" / f"{lease.lease_id}", self.seed, scale)
        (folder / layout.SUBMISSION_FILE).write_bytes(submission_record(lease).to_json())
        write_rollouts(folder, lease, self.coord.cfg)
        return folder

    def deliver(self, lease, folder: Path) -> dict:
        sub_id = layout.submission_id(lease.worker, lease.lease_id)
        adds = {layout.submission_path(lease.base_version, sub_id, f.name): f for f in folder.iterdir()}
        return self.client.submit(lease, self.store.commit(adds, message=f"hubgrpo: submission {sub_id}"))

    def honest_version(self) -> int:
        """An honest round, merged into a new version (quorum 1); returns the version it went into."""
        lease = self.client.lease("honest")
        answer = self.deliver(lease, self.folder(lease))
        assert answer["status"] in ("admitted", "merged")
        return self.wait_merged(answer["submission_id"])

    def wait_merged(self, sub_id: str) -> int:
        deadline = time.time() + 20
        while True:
            state = self.coord.state  # adopted: committed and in the coordinator's memory
            if sub_id in state.merged_ids:
                return next(r.version for r in state.versions if any(m.submission_id == sub_id for m in r.merged))
            assert time.time() < deadline, f"{sub_id} was never merged"
            time.sleep(0.05)

    def attack(self, mutate, name: str = "mallory") -> InvalidSubmission | dict:
        """Lease, forge the honest folder with ``mutate(folder, base weights)``, commit, submit; the refusal or
        the answer."""
        lease = self.client.lease(name)
        folder = self.folder(lease)
        base = load_file(
            self.client.adapter(lease.base_version, lease.base_sha, self.tmp / "bases", 1 << 30)
            / layout.ADAPTER_WEIGHTS
        )
        mutate(folder, base)
        try:
            return self.deliver(lease, folder)
        except InvalidSubmission as e:
            return e

    def refuse_each(self, attacks: dict) -> None:
        """Every attack (name: (mutation, code)) refused with its code and recorded, an honest version merged after
        each, every state.json written loading again and a restarted coordinator starting."""
        outcomes = {}
        for name, (mutate, code) in attacks.items():
            got = self.attack(mutate)
            assert isinstance(got, InvalidSubmission), f"{name}: admitted ({got})"
            outcomes[name] = got.code
            assert len(got.message) < 1000, f"{name}: the refusal quotes too much"
            version = self.honest_version()
            self.check_state_and_restart()
            assert self.coord.state.version >= version
        assert outcomes == {name: code for name, (_, code) in attacks.items()}
        assert set(outcomes.values()) <= {r["code"] for r in self.client.status()["refusals"]}

    def saved_state(self) -> RunState:
        """state.json once the checkpoint of the coordinator's current version is in the repo (checkpoints come
        from their own thread, just after the merge)."""
        deadline = time.time() + 30
        while True:
            state = RunState.from_json(self.store.read(layout.STATE_FILE))
            if state.version >= self.coord.state.version:
                return state
            assert time.time() < deadline, "no checkpoint of the current version"
            time.sleep(0.05)

    def check_state_and_restart(self) -> None:
        """Every state.json written loads again, and a coordinator restarted on the repo starts."""
        state = self.saved_state()
        assert RunState.from_json(state.to_json()) == state
        again = Coordinator(self.store, SECRET, workdir=self.tmp / f"restart-{time.monotonic_ns()}")
        assert again.state.version == state.version

    def close(self) -> None:
        self.client.close()
        self.app.close()


def record_edit(**fields):
    """Rewrite submission.json with raw JSON values (NaN, Infinity, 1e400 are written as such)."""

    def mutate(folder: Path, base) -> None:
        text = (folder / layout.SUBMISSION_FILE).read_text()
        data = json.loads(text)
        for key in fields:
            data[key] = f"@@{key}@@"
        text = json.dumps(data)
        for key, raw in fields.items():
            text = text.replace(f'"@@{key}@@"', raw)
        (folder / layout.SUBMISSION_FILE).write_text(text)

    return mutate
