"""The restart chaos loop: a coordinator subprocess SIGKILLed at random moments and restarted on its port while
model-free workers lease, fetch and upload (``tests/integration/test_checkpoint_restart.py`` and
``benchmarks/restart/restart_loss.py`` run it), and the check of the history it leaves."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from pathlib import Path

from hubgrpo import layout, runrepo
from tests.support.chaos_helpers import chaos_env, kill, start_coordinator, wait_for
from tests.support.space_support import ALICE, SimWorker

REPO = "alice/restarts"


def _work(url: str, name: str, tmp: Path, stop: threading.Event, answers: list) -> None:
    """Lease, fetch, upload — again and again; outages (the coordinator is being killed) are waited out."""
    worker = SimWorker(url, name, None, tmp)
    while not stop.is_set():
        try:
            lease = worker.lease()
            answers.append(worker.finish(lease, reward=0.5))
        except Exception as e:  # deliberate: refusals (stale after a restart) and outages are the point
            answers.append({"error": type(e).__name__, "code": getattr(e, "code", None)})
            time.sleep(0.2)
    worker.close()


def _status(url: str) -> dict:
    from hubgrpo.worker.client import CoordinatorClient

    with CoordinatorClient(url, retries=0) as c:
        return c.status()


def _beyond(status: dict) -> bool:
    """A checkpoint past version 0 exists (the history keeps two tags whatever the kill) and two versions since."""
    cp = status["checkpoint"]["version"]
    return cp >= 1 and status["version"] >= cp + 2


def _after(status: dict, restart: tuple) -> bool:
    """Three versions since the restart, and a checkpoint newer than the one it resumed from."""
    _, _, held, first = restart
    return status["version"] >= first + 3 and status["checkpoint"]["version"] > held.version


def kill_loop(store, emu_url: str, tmp_path: Path, kills: int, seed: int = 36) -> tuple[list, list]:
    """Serve the run, keep four workers busy, SIGKILL and restart the coordinator ``kills`` times at random
    moments (each once a checkpoint past v0 and versions beyond the last one exist; after the last restart, once
    it checkpointed again). Returns (restarts, the workers' answers); a
    restart is (live version before the kill, its last checkpoint then, the repo's state at the kill, the version
    the restarted one reported first)."""
    from hubgrpo.space.api import free_port

    env, port, rng = chaos_env(emu_url, ALICE), free_port(), random.Random(seed)
    url, log = f"http://127.0.0.1:{port}", tmp_path / "coordinator.log"
    proc = start_coordinator(REPO, port, env, tmp_path / "work", log)
    stop, answers, restarts, threads = threading.Event(), [], [], []
    try:
        wait_for(lambda: _status(url), 120, "the coordinator to serve")
        threads = [threading.Thread(target=_work, args=(url, f"w{i}", tmp_path, stop, answers), daemon=True)
                   for i in range(4)]
        for t in threads:
            t.start()
        for k in range(kills):
            wait_for(lambda: _beyond(_status(url)), 120, "a checkpoint past v0 and versions beyond it")
            time.sleep(rng.uniform(0.0, 3.0))  # any moment: mid-merge, mid-checkpoint, mid-upload
            before = _status(url)
            kill(proc)
            held = runrepo.read_state(store)  # what the repo holds at the kill: the last checkpoint
            proc = start_coordinator(REPO, port, env, tmp_path / f"work{k}", log)
            after = wait_for(lambda: _status(url), 120, "the restarted coordinator")
            restarts.append((before["version"], before["checkpoint"]["version"], held, after["version"]))
            # the checkpoint it resumes from is no older than the last one it reported before the kill
            assert after["version"] >= held.version >= before["checkpoint"]["version"], restarts
        # the restarted coordinator checkpoints once more, so that the history holds a tag made after the restart
        wait_for(lambda: _after(_status(url), restarts[-1]), 120, "a checkpoint after the last restart")
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        kill(proc)
    return restarts, answers


def check_history(store, tmp_path) -> None:
    """No round merged twice, versions 0..V each once, every tag the adapter its version record names, loadable
    with PEFT on a tiny model of the synthetic adapters' shapes."""
    from peft import PeftModel
    from transformers import Qwen2Config, Qwen2ForCausalLM

    final = runrepo.read_state(store)
    twice = [s for s, n in Counter(final.merged_ids).items() if n > 1]
    assert not twice, twice
    assert [v.version for v in final.versions] == list(range(final.version + 1))
    tags = {layout.parse_tag(t): sha for t, sha in store.tags().items() if layout.parse_tag(t) is not None}
    assert final.version in tags and len(tags) >= 2
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=2))  # the synthetic adapters
    for v, sha in sorted(tags.items()):
        folder = runrepo.adapter_at(store, sha, tmp_path / "tags")
        aid = layout.adapter_id((folder / layout.ADAPTER_WEIGHTS).read_bytes(),
                                (folder / layout.ADAPTER_CONFIG).read_bytes())
        assert final.versions[v].adapter_id == aid and final.versions[v].tag == layout.version_tag(v)
        peft_model = PeftModel.from_pretrained(model, str(folder), adapter_name=f"v{v}")
        assert any("lora_B" in n for n, _ in peft_model.named_parameters())
        model = peft_model.unload()
    return final
