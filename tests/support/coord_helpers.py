"""Helpers for coordinator tests: synthetic PEFT adapters (no model), a fake clock, a simulated worker."""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors.torch import save_file

from hubgrpo import layout, runrepo
from hubgrpo.config import loads
from hubgrpo.layout import Lease, StepMetrics, Submission

MODULES = ("q_proj", "v_proj")
D_IN, D_OUT, R = 16, 16, 4


class FakeClock:
    def __init__(self, t: float | None = None):
        self.t = time.time() if t is None else t

    def __call__(self) -> float:
        return self.t

    def advance(self, s: float) -> None:
        self.t += s


def make_config(**overrides):
    text = ("base_model: builtin:tiny\nproject_name: coordtest\n"
            "params: {per_device_train_batch_size: 4, num_generations: 2, learning_rate: 0.1}\n"
            "rounds: {steps: 2, versions: 5, reset_optimizer: true, lr_schedule: constant}\n"  # synthetic updates
            # (B ~ 0.1·N(0,1)) fit 2 AdamW steps at lr 0.1; the merge the coordinator tests were written for:
            "merge: {method: svd, quorum: 2, rebase: false, staleness_per_worker: 0}\n"
            f"lora: {{r: {R}, alpha: 8, target_modules: [q_proj, v_proj]}}\n")
    return loads(text, overrides=[f"{k}={v}" for k, v in overrides.items()])


def adapter_config() -> dict:
    from peft import LoraConfig

    cfg = LoraConfig(r=R, lora_alpha=8, target_modules=list(MODULES), task_type="CAUSAL_LM",
                     base_model_name_or_path="builtin:tiny")
    d = cfg.to_dict()
    return json.loads(json.dumps(d, default=lambda o: sorted(o) if isinstance(o, set) else str(o)))


def write_adapter(folder: Path, seed: int, b_scale: float = 0.0, layers: int = 2, config: dict | None = None) -> Path:
    """A PEFT-format adapter folder; b_scale=0 gives B=0 (equal to the base model), like version 0. ``config``: the
    adapter_config.json to write (default: peft's own ``adapter_config()``)."""
    g = torch.Generator().manual_seed(seed)
    folder.mkdir(parents=True, exist_ok=True)
    sd = {}
    for i in range(layers):
        for m in MODULES:
            p = f"base_model.model.model.layers.{i}.self_attn.{m}"
            sd[f"{p}.lora_A.weight"] = torch.randn(R, D_IN, generator=torch.Generator().manual_seed(1000 + i))
            sd[f"{p}.lora_B.weight"] = b_scale * torch.randn(D_OUT, R, generator=g)
    save_file(sd, str(folder / layout.ADAPTER_WEIGHTS))
    (folder / layout.ADAPTER_CONFIG).write_text(json.dumps(adapter_config() if config is None else config))
    return folder


def base_adapter_dir(store, lease: Lease, dest: Path) -> Path:
    """The adapter ``lease`` is based on: from the coordinator when ``store`` is a ``CoordinatorClient`` (as a
    worker gets it), else read from its checkpoint's tag (every version is a checkpoint on a local folder) and
    checked against the lease's adapter id."""
    from hubgrpo import runrepo

    if hasattr(store, "adapter"):
        return store.adapter(lease.base_version, lease.base_sha, dest, 1 << 30)

    sha = store.tags()[layout.version_tag(lease.base_version)]
    folder = runrepo.adapter_at(store, sha, dest)
    got = layout.adapter_id((folder / layout.ADAPTER_WEIGHTS).read_bytes(), (folder / layout.ADAPTER_CONFIG).read_bytes())
    assert got == lease.base_sha, f"v{lease.base_version}'s checkpoint is not the leased adapter"
    return folder


def trained_adapter(store, lease: Lease, folder: Path, seed: int, b_scale: float) -> Path:
    """What a round of training produces: the leased base adapter with B moved by ``b_scale``·N(0, 1) (A kept, as
    a few optimizer steps barely move it). From version 0 (B = 0) this is ``write_adapter(seed, b_scale)``."""
    from safetensors.torch import load_file

    base_dir = base_adapter_dir(store, lease, folder.parent / "bases")
    base = load_file(base_dir / layout.ADAPTER_WEIGHTS)
    write_adapter(folder, seed, b_scale)
    delta = load_file(folder / layout.ADAPTER_WEIGHTS)
    weights = {k: (base[k] + delta[k]) if "lora_B" in k else base[k] for k in base}
    save_file(weights, str(folder / layout.ADAPTER_WEIGHTS))
    (folder / layout.ADAPTER_CONFIG).write_bytes((base_dir / layout.ADAPTER_CONFIG).read_bytes())
    return folder


def submission_record(lease: Lease, reward: float = 0.5, samples: int = 8) -> Submission:
    return Submission(
        submission_id=layout.submission_id(lease.worker, lease.lease_id), worker=lease.worker, lease=lease,
        base_version=lease.base_version, base_sha=lease.base_sha, base_model="builtin:tiny", steps=lease.steps,
        samples=samples, prompts=len(lease.prompt_indices), tokens=samples * 10, reward_mean=reward,
        reward_first=reward, reward_last=reward, step_metrics=[StepMetrics(step=1, reward=reward)],
        timings={"total": 1.0}, versions={"hubgrpo": "test"}, device="cpu", created_at=time.time())


_SOURCES: dict = {}


def honest_rollouts(lease: Lease, cfg=None, *, reward: float = 0.5):
    """The rollouts a round of ``lease`` could have produced: in every batch the first ``reward`` share of the
    completions answers its prompt (``<answer>…</answer>``), the rest does not; rewards scored with the run's own
    reward functions, as the coordinator recomputes them."""
    from hubgrpo.layout import RolloutBatch, Rollouts
    from hubgrpo.task import rollouts as rl
    from hubgrpo.task.data import PromptSource
    from hubgrpo.task.rewards import load_rewards

    cfg = cfg or make_config()
    key = cfg.data.model_dump_json() + str(cfg.params.seed)
    source = _SOURCES.get(key) or _SOURCES.setdefault(key, PromptSource.from_config(cfg))
    rewards = load_rewards(cfg.rewards)
    n_batches, per_batch, group = rl.expected_shape(cfg, lease)
    prompts = list(dict.fromkeys(lease.prompt_indices))
    batches = []
    for b in range(n_batches):
        idx = [prompts[(b * per_batch // group + j // group) % len(prompts)] for j in range(per_batch)]
        rows = source.rows(idx)
        texts = [f"<answer>{r.get('answer') if j < round(reward * per_batch) else 'no'}</answer>"
                 for j, r in enumerate(rows)]
        comps = [[{"role": "assistant", "content": t}] for t in texts] if cfg.data.chat_template else texts
        batches.append(RolloutBatch(prompt_indices=idx, completions=comps,
                                    rewards=rl.score(rewards, source, idx, comps)))
    return Rollouts(reward_names=[r.__name__ for r in rewards], batches=batches)


def write_rollouts(folder: Path, lease: Lease, cfg=None, *, reward: float = 0.5) -> Path:
    """``honest_rollouts`` written as the submission's rollouts file."""
    from hubgrpo.task.rollouts import dumps

    (folder / layout.ROLLOUTS_FILE).write_bytes(dumps(honest_rollouts(lease, cfg, reward=reward)))
    return folder


def push_submission(store, lease: Lease, tmp: Path, *, seed: int, reward: float = 0.5, b_scale: float = 0.1,
                    mutate=None) -> str:
    """What a worker does after training: one commit with its submission folder. Returns the commit sha."""
    from hubgrpo import runrepo

    sub_id = layout.submission_id(lease.worker, lease.lease_id)
    folder = trained_adapter(store, lease, tmp / sub_id, seed, b_scale)
    (folder / layout.SUBMISSION_FILE).write_bytes(submission_record(lease, reward).to_json())
    write_rollouts(folder, lease, runrepo.read_config(store), reward=reward)
    if mutate:
        mutate(folder)
    adds = {layout.submission_path(lease.base_version, sub_id, f.name): f for f in folder.iterdir()}
    return store.commit(adds, message=f"hubgrpo: submission {sub_id}")


def local_coordinator(tmp_path: Path, secret: bytes = b"test-secret", **overrides):
    """(store, coordinator, clock): a run initialised on a LocalStore under ``tmp_path`` (version 0: B = 0)."""
    from hubgrpo.coordinator.core import Coordinator
    from hubgrpo.coordinator.repo_init import init_repo
    from hubgrpo.store.local import LocalStore

    cfg = make_config(**overrides)
    store = LocalStore(tmp_path / "repo")
    clock = FakeClock()
    init_repo(store, cfg, write_adapter(tmp_path / "v0", seed=0, b_scale=0.0), clock=clock)
    return store, Coordinator(store, secret, clock=clock, workdir=tmp_path / "work"), clock


def round_folder(store, lease, tmp_path, seed: int, mutate=None) -> Path:
    """A trained round's folder, as the worker engine leaves it."""
    folder = trained_adapter(store, lease, tmp_path / "rounds" / f"{lease.lease_id}", seed, 0.1)
    write_rollouts(folder, lease, runrepo.read_config(store))
    (folder / layout.SUBMISSION_FILE).write_bytes(submission_record(lease).to_json())
    if mutate:
        mutate(folder)
    return folder


@contextmanager
def served_tiny_run(tmp: Path, settings: list[str], secret: bytes):
    """A served coordinator over a local run repo of the tiny model (``tiny_config(settings)``; the tiny-model
    cache fixture must be active) and a real engine to train its rounds: a dict of store, coord, url, engine, cfg,
    tmp."""
    from hubgrpo.coordinator.core import Coordinator
    from hubgrpo.coordinator.repo_init import init_repo
    from hubgrpo.space.api import serve
    from hubgrpo.store.local import LocalStore
    from hubgrpo.worker.engine import RoundEngine
    from tests.support.models_fixture import tiny_config

    cfg = tiny_config(settings)
    engine = RoundEngine(cfg, worker="w1")
    store = LocalStore(tmp / "repo")
    init_repo(store, cfg, engine.init_adapter(tmp / "v0"))
    coord = Coordinator(store, secret, workdir=tmp / "coord")
    app, url = serve(coord, tick_interval=0.05)
    try:
        yield {"store": store, "coord": coord, "url": url, "engine": engine, "cfg": cfg, "tmp": tmp}
    finally:
        app.close()
