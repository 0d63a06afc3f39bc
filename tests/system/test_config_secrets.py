"""Secrets in configs and on disk, through the installed ``hubgrpo`` command and served coordinators:

- a value that came from the user's environment (``${VAR}``) is shown and stored as its placeholder, never as the
  value: ``hubgrpo config show``, the run repo's hubgrpo.yaml and model card;
- a config read from a run repo is never expanded: a ``${HUBGRPO_SECRET}`` planted there stays that text on the
  Space page, in the status and in ``hubgrpo status``, whatever the coordinator's environment holds;
- a reward kwarg's placeholder is filled only from names its runner lists in HUBGRPO_REWARD_ENV;
- the lease-signing secret file is 0600 from its first byte; a looser one is refused.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from hubgrpo import layout, runrepo
from hubgrpo.store.local import LocalStore

EXE = Path(sys.executable).with_name("hubgrpo")
JUDGE_KEY = "sk-judge-4f2a9c1e77"
PLANTED = "hubgrpo-secret-7d1f0b"
HF_TOKEN = "hf_coordinator_env_token_91c2"

USER_CONFIG = """\
base_model: builtin:tiny
project_name: secrets-test
data: {path: "builtin:addition", options: {digits: 1}}
rewards:
  - function: builtin:exact_answer
  - function: builtin:answer_format
    kwargs: {api_key: "${JUDGE_API_KEY}", header: "Bearer ${JUDGE_API_KEY}", plain: "keep me"}
params: {per_device_train_batch_size: 4, num_generations: 2}
rounds: {steps: 1, versions: 2}
lora: {r: 2, alpha: 4}
coordinator: {secret: "${HUBGRPO_SECRET}", url: "${HUBGRPO_COORDINATOR:-}"}
hub: {repo_id: "${HF_USER:-me}/secrets-run", token: "${HF_TOKEN}"}
"""
USER_ENV = {"JUDGE_API_KEY": JUDGE_KEY, "HUBGRPO_SECRET": PLANTED, "HF_TOKEN": HF_TOKEN, "HF_USER": "carol-env",
            "HUBGRPO_COORDINATOR": "https://coord-from-env.example"}
VALUES = [JUDGE_KEY, PLANTED, HF_TOKEN, "carol-env", "coord-from-env"]


def cli(*args: str, env: dict | None = None, timeout: float = 180, cwd: Path | None = None):
    base = {k: v for k, v in os.environ.items() if k not in USER_ENV}
    return subprocess.run([str(EXE), *args], capture_output=True, text=True, timeout=timeout,
                          env={**base, "OMP_NUM_THREADS": "1", **(env or {})}, cwd=cwd)


def leaks(text: str) -> list[str]:
    return [v for v in VALUES if v in text]


@pytest.mark.timeout(60)
def test_config_show_and_validate_show_placeholders_not_values(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(USER_CONFIG)
    shown = cli("config", "show", str(path), env=USER_ENV)
    assert shown.returncode == 0, shown.stderr
    assert leaks(shown.stdout + shown.stderr) == []
    assert "${JUDGE_API_KEY}" in shown.stdout and "Bearer ${JUDGE_API_KEY}" in shown.stdout
    assert "${HF_USER:-me}/secrets-run" in shown.stdout and "keep me" in shown.stdout
    unset = cli("config", "show", str(path), env={"JUDGE_API_KEY": JUDGE_KEY, "HUBGRPO_SECRET": PLANTED,
                                                  "HF_TOKEN": HF_TOKEN})
    assert unset.returncode == 0, unset.stderr
    assert "me/secrets-run" in unset.stdout and "${HF_USER" not in unset.stdout  # a written default is no secret
    overridden = cli("config", "show", str(path), "--set", "rewards=[{function: 'builtin:exact_answer'}]",
                     env=USER_ENV)
    assert overridden.returncode == 0 and "JUDGE_API_KEY" not in overridden.stdout, overridden.stderr
    env_model = tmp_path / "model.yaml"
    env_model.write_text(USER_CONFIG.replace("base_model: builtin:tiny", "base_model: ${MODEL_DIR}/tiny"))
    valid = cli("config", "validate", str(env_model), env={**USER_ENV, "MODEL_DIR": "/home/carol-env"})
    assert valid.returncode == 0 and leaks(valid.stdout) == [] and "${MODEL_DIR}/tiny" in valid.stdout, valid.stdout


@pytest.mark.timeout(240)
def test_init_stores_placeholders_and_refuses_environment_values_where_readers_need_the_value(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(USER_CONFIG)
    done = cli("init", str(path), "--repo", str(tmp_path / "repo"), env=USER_ENV)
    assert done.returncode == 0, done.stderr[-2000:]
    store = LocalStore(tmp_path / "repo")
    stored = store.read(layout.CONFIG_FILE).decode()
    card = store.read(layout.MODEL_CARD).decode()
    assert leaks(stored) == [] and leaks(card) == [] and leaks(done.stdout + done.stderr) == []
    assert "${JUDGE_API_KEY}" in stored and "${HF_USER:-me}/secrets-run" in stored
    cfg = runrepo.read_config(store)  # loads back, never expanded
    assert cfg.rewards[1].kwargs == {"api_key": "${JUDGE_API_KEY}", "header": "Bearer ${JUDGE_API_KEY}",
                                     "plain": "keep me"}
    assert cfg.coordinator.secret is None and cfg.hub.token is None

    lr = tmp_path / "lr.yaml"
    lr.write_text(USER_CONFIG.replace("num_generations: 2}", "num_generations: 2, learning_rate: \"${LR}\"}"))
    refused = cli("init", str(lr), "--repo", str(tmp_path / "repo2"), env={**USER_ENV, "LR": "0.02"})
    assert refused.returncode == 2, refused.stderr
    assert "params.learning_rate" in refused.stderr and "${LR}" in refused.stderr and "--set" in refused.stderr
    assert not (tmp_path / "repo2").exists() or not LocalStore(tmp_path / "repo2").head()


PLANTED_CONFIG = {"data.system_prompt": "${HUBGRPO_SECRET}", "hub.repo_id": "${HF_TOKEN}"}


def planted_repo(tmp_path: Path) -> LocalStore:
    """A run repo whose hubgrpo.yaml somebody with write access edited to name the reader's secrets."""
    from hubgrpo.coordinator.repo_init import init_repo
    from tests.support.coord_helpers import make_config, write_adapter

    store = LocalStore(tmp_path / "repo")
    init_repo(store, make_config(), write_adapter(tmp_path / "v0", seed=0))
    text = store.read(layout.CONFIG_FILE).decode()
    text = text.replace("system_prompt: null", "system_prompt: ${HUBGRPO_SECRET}")
    text = text.replace("repo_id: null", "repo_id: prefix-${HF_TOKEN}")
    assert "${HUBGRPO_SECRET}" in text and "${HF_TOKEN}" in text
    store.commit({layout.CONFIG_FILE: text.encode()}, message="plant placeholders")
    return store


def refresh_output(url: str) -> list:
    """What the Space page's refresh shows (the page calls it on load and on its timer)."""
    deps = httpx.get(f"{url}/config", timeout=10).json()["dependencies"]
    fn = next(d["id"] for d in deps if len(d.get("outputs", [])) == 8)
    r = httpx.post(f"{url}/gradio_api/run/predict", json={"fn_index": fn, "data": [], "session_hash": "t"},
                   timeout=30)
    r.raise_for_status()
    return r.json()["data"]


def wait_line(proc: subprocess.Popen, prefix: str, timeout: float) -> str:
    end = time.time() + timeout
    while time.time() < end:
        line = proc.stdout.readline()
        if line.startswith(prefix):
            return line
        if not line and proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode}: {proc.stderr.read()[-2000:]}")
    raise AssertionError(f"no line starting {prefix!r} in {timeout} s")


@pytest.mark.timeout(180)
def test_a_placeholder_planted_in_a_run_repo_never_reads_the_coordinator_s_environment(tmp_path):
    store = planted_repo(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in USER_ENV}
    env.update(HUBGRPO_SECRET=PLANTED, HF_TOKEN=HF_TOKEN, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([str(EXE), "space", "--repo", str(tmp_path / "repo"), "--port", "0", "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        url = wait_line(proc, "coordinator + UI", 120).split(" at ")[1].split()[0]
        page = json.dumps(refresh_output(url))
        status = httpx.post(f"{url}/hubgrpo/api/status", json={"data": []}, timeout=30).text
        assert leaks(page + status) == [], leaks(page + status)
        assert "${HUBGRPO_SECRET}" in page and "prefix-${HF_TOKEN}" in page
    finally:
        proc.terminate()
        proc.wait(30)
    shown = cli("status", "--repo", str(tmp_path / "repo"), "--json", env={"HUBGRPO_SECRET": PLANTED,
                                                                           "HF_TOKEN": HF_TOKEN})
    assert shown.returncode == 0 and leaks(shown.stdout + shown.stderr) == [], shown.stderr
    assert runrepo.read_config(store).data.system_prompt == "${HUBGRPO_SECRET}"


JUDGE = '''
def judge(prompts, completions, api_key="none", **kw):
    return [float(len(api_key)) for _ in completions]
'''


@pytest.mark.timeout(60)
def test_a_reward_kwarg_placeholder_is_filled_only_from_names_its_runner_allows(tmp_path, monkeypatch):
    from hubgrpo.config import RewardConfig
    from hubgrpo.errors import ConfigError
    from hubgrpo.task.rewards import load_rewards

    (tmp_path / "judge.py").write_text(JUDGE)
    spec = f"{tmp_path / 'judge.py'}:judge"
    monkeypatch.setenv("JUDGE_API_KEY", JUDGE_KEY)
    monkeypatch.setenv("HUBGRPO_SECRET", PLANTED)
    monkeypatch.delenv("HUBGRPO_REWARD_ENV", raising=False)
    asked = [RewardConfig(function=spec, kwargs={"api_key": "${JUDGE_API_KEY}"})]
    with pytest.raises(ConfigError, match="HUBGRPO_REWARD_ENV=JUDGE_API_KEY"):
        load_rewards(asked)
    monkeypatch.setenv("HUBGRPO_REWARD_ENV", "JUDGE_API_KEY")
    assert load_rewards(asked)[0](["p"], ["c"]) == [float(len(JUDGE_KEY))]
    planted = [RewardConfig(function=spec, kwargs={"api_key": "x${HUBGRPO_SECRET}"})]
    with pytest.raises(ConfigError, match="HUBGRPO_SECRET") as e:
        load_rewards(planted)
    assert PLANTED not in str(e.value) + str(e.value.hint)


@pytest.mark.timeout(120)
def test_the_coordinator_refuses_to_start_on_reward_placeholders_it_may_not_fill(tmp_path):
    store = planted_repo(tmp_path)
    text = store.read(layout.CONFIG_FILE).decode().replace(
        "kwargs: {}", "kwargs: {api_key: '${HUBGRPO_SECRET}'}", 1)
    store.commit({layout.CONFIG_FILE: text.encode()}, message="plant a reward kwarg")
    r = cli("coordinator", "--repo", str(tmp_path / "repo"), "--port", "0", timeout=45,
            env={"HUBGRPO_SECRET": PLANTED, "HUBGRPO_REWARD_ENV": "JUDGE_API_KEY"})
    assert r.returncode == 2, (r.returncode, r.stdout[-1000:], r.stderr[-2000:])
    assert "HUBGRPO_SECRET" in r.stderr and "HUBGRPO_REWARD_ENV" in r.stderr and PLANTED not in r.stdout + r.stderr


# ------------------------------------------------------------------------------- the lease-signing secret file

AUDIT = r'''
import os, stat, sys
os.umask(0)
folder = os.path.join(os.environ["HUBGRPO_CACHE"], "secrets")
seen = []
def hook(event, args):
    if event in ("open", "os.chmod", "os.rename", "os.replace", "os.link") and os.path.isdir(folder):
        for name in os.listdir(folder):
            try:
                seen.append((event, name, stat.S_IMODE(os.stat(os.path.join(folder, name)).st_mode)))
            except OSError:
                pass
sys.addaudithook(hook)
from hubgrpo.cli.embedded import coordinator_secret
from hubgrpo.store.local import LocalStore
secret = coordinator_secret(LocalStore(sys.argv[1]))
print(len(secret), sorted({m for _, _, m in seen}))
'''


@pytest.mark.timeout(60)
def test_the_secret_file_is_never_readable_by_others_not_even_for_an_instant(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "HUBGRPO_SECRET"}
    env["HUBGRPO_CACHE"] = str(tmp_path / "cache")
    r = subprocess.run([sys.executable, "-c", AUDIT, str(tmp_path / "repo")], capture_output=True, text=True,
                       timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    length, modes = r.stdout.split(" ", 1)
    assert int(length) == 64 and modes.strip() != "[]", r.stdout
    assert all(m & 0o077 == 0 for m in json.loads(modes)), f"modes seen while it was written: {modes}"
    files = list((tmp_path / "cache" / "secrets").iterdir())
    assert len(files) == 1 and stat.S_IMODE(files[0].stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "cache" / "secrets").stat().st_mode) == 0o700


@pytest.mark.timeout(120)
def test_a_coordinator_refuses_a_secret_file_others_can_read(tmp_path):
    from hubgrpo.coordinator.repo_init import init_repo
    from tests.support.coord_helpers import make_config, write_adapter

    init_repo(LocalStore(tmp_path / "repo"), make_config(), write_adapter(tmp_path / "v0", seed=0))
    env = {"HUBGRPO_CACHE": str(tmp_path / "cache")}
    first = subprocess.Popen([str(EXE), "coordinator", "--repo", str(tmp_path / "repo"), "--port", "0", "--quiet"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**{k: v for k, v in os.environ.items() if k != "HUBGRPO_SECRET"}, **env})
    try:
        wait_line(first, "coordinator for", 90)
    finally:
        first.terminate()
        first.wait(30)
    (secret_file,) = (tmp_path / "cache" / "secrets").iterdir()
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    kept = secret_file.read_bytes()
    secret_file.chmod(0o644)
    r = cli("coordinator", "--repo", str(tmp_path / "repo"), "--port", "0", env=env, timeout=90)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert str(secret_file) in r.stderr and "0644" in r.stderr and "chmod 600" in r.stderr
    assert secret_file.read_bytes() == kept and kept.decode() not in r.stdout + r.stderr  # nothing lost or shown


@pytest.mark.timeout(60)
def test_a_whole_run_from_the_users_own_config_grants_its_reward_placeholders_and_nothing_else(tmp_path, monkeypatch):
    """``hubgrpo run CONFIG``: the reward kwargs' placeholders of the user's own file are granted for the run (the
    coordinator and its workers read them back from the repo); a name only the repo carries is not; the variable is
    restored afterwards."""
    from hubgrpo.cli.embedded import _restore_env, grant_reward_env
    from hubgrpo.config import RewardConfig, load_config
    from hubgrpo.errors import ConfigError
    from hubgrpo.task.rewards import fill_kwargs

    (tmp_path / "run.yaml").write_text("base_model: builtin:tiny\nproject_name: p\nrewards:\n  - function: builtin:exact_answer\n"
                                       "    kwargs: {api_key: '${JUDGE_API_KEY}'}\n")
    monkeypatch.setenv("JUDGE_API_KEY", JUDGE_KEY)
    monkeypatch.setenv("HUBGRPO_REWARD_ENV", "OTHER")
    cfg = load_config(tmp_path / "run.yaml")
    previous = grant_reward_env(cfg)
    try:
        assert os.environ["HUBGRPO_REWARD_ENV"] == "OTHER,JUDGE_API_KEY"
        stored = RewardConfig(function="builtin:exact_answer", kwargs={"api_key": "${JUDGE_API_KEY}"})
        assert fill_kwargs(stored) == {"api_key": JUDGE_KEY}
        with pytest.raises(ConfigError, match="HUBGRPO_SECRET"):
            fill_kwargs(RewardConfig(function="builtin:exact_answer", kwargs={"k": "${HUBGRPO_SECRET}"}))
    finally:
        _restore_env("HUBGRPO_REWARD_ENV", previous)
    assert os.environ["HUBGRPO_REWARD_ENV"] == "OTHER"
