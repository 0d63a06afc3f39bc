"""A worker without a model or a server: a fake round engine and the coordinator API in process, failing on script."""

from __future__ import annotations

from pathlib import Path

from safetensors.torch import load_file, save_file

from hubgrpo import layout
from hubgrpo.coordinator.core import Coordinator
from hubgrpo.errors import Refused
from tests.support.coord_helpers import submission_record, write_adapter, write_rollouts


class FakeEngine:
    """Rounds without a model: the leased adapter with B moved a little."""

    def run_round(self, adapter_dir, lease, out: Path, on_step=None, rebase=None):
        base = load_file(Path(adapter_dir) / layout.ADAPTER_WEIGHTS)
        write_adapter(out, seed=int(lease.seed) % 1000 + 1, b_scale=0.01)
        delta = load_file(out / layout.ADAPTER_WEIGHTS)
        moved = {k: base[k] + delta[k] if "lora_B" in k else base[k] for k in base}
        save_file(moved, str(out / layout.ADAPTER_WEIGHTS))
        (out / layout.ADAPTER_CONFIG).write_bytes((Path(adapter_dir) / layout.ADAPTER_CONFIG).read_bytes())
        sub = submission_record(lease)
        write_rollouts(out, lease)
        (out / layout.SUBMISSION_FILE).write_bytes(sub.to_json())
        return sub


class ScriptedClient:
    """The coordinator API in process, with scripted failures per call (popped in order; None = answer)."""

    def __init__(self, coord: Coordinator, script: dict[str, list]):
        self.coord, self.script = coord, script

    def _fail(self, name: str) -> None:
        queue = self.script.get(name, [])
        err = queue.pop(0) if queue else None
        if err is not None:
            raise err

    def lease(self, worker, user=None):
        self._fail("lease")
        return self.coord.lease(worker, user)

    def heartbeat(self, lease):
        return self.coord.heartbeat(lease)

    def submit(self, lease, commit):
        self._fail("submit")
        return self.coord.submit(lease, commit)

    def release(self, lease):
        self.coord.release(lease)

    def adapter(self, version, adapter_id, cache, max_bytes):  # what the adapter route serves, in process
        import shutil

        self._fail("adapter")
        dest = cache / adapter_id
        if not dest.is_dir():
            shutil.copytree(self.coord.version_dir(version, adapter_id), dest)
        return dest


def refusal(code: str, wait: float | None) -> Refused:
    return Refused(code, f"{code} refusal", hint=f"wait_s={wait}" if wait else None, wait_s=wait)
