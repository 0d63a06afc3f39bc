"""Proof of rollouts end to end, with the real engine (tiny model, real TRL rounds with keyed sampling) and real HTTP:
a verifier (``hubgrpo.worker.verifier``) replays a sample of every admitted round with its leased version and records
a verdict (``record_verdict``); an honest round passes, a forged one (completions sampled with other noise than the
lease's) fails and excludes its worker — no merge weight for its pending round, ranked last, later leases and
submissions refused — across a restart of the coordinator."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hubgrpo import layout
from hubgrpo.coordinator.core import Coordinator
from hubgrpo.errors import InvalidSubmission, Refused
from hubgrpo.worker.client import CoordinatorClient
from hubgrpo.worker.verifier import Verifier
from tests.support.coord_helpers import served_tiny_run
from tests.support.models_fixture import tiny_cache, tiny_config  # noqa: F401 (fixture)

EXE = Path(sys.executable).with_name("hubgrpo")
SECRET = b"proof-verdict-secret"
SETTINGS = ["merge.quorum=2", "rounds.versions=50", "rounds.steps=1", "coordinator.heartbeat_interval_s=1",
            "coordinator.verify=sample"]


@pytest.fixture(scope="module")
def served_run(tiny_cache, tmp_path_factory):  # noqa: F811
    """A served coordinator over a local run repo of the tiny model and a real engine to train its rounds."""
    with served_tiny_run(tmp_path_factory.mktemp("verdicts"), SETTINGS, SECRET) as run:
        yield run


@pytest.fixture(scope="module")
def held_run(tiny_cache, tmp_path_factory):  # noqa: F811
    """A run that merges an untrusted participant's round only once it passed its verdict (w1 is trusted)."""
    settings = [*SETTINGS, "merge.quorum=1", "coordinator.verify=untrusted", 'coordinator.trusted=["w1"]']
    with served_tiny_run(tmp_path_factory.mktemp("held"), settings, SECRET) as run:
        yield run


@pytest.fixture(scope="module")
def sharp_run(tiny_cache, tmp_path_factory):  # noqa: F811
    """A run of the tiny model sharpened (``proof_support.sharpen``: peaked like a real LM's, so that the policy,
    not the noise alone, picks the tokens); the verifier shares the engine, so it replays the same model."""
    from tests.support.proof_support import sharpen

    with served_tiny_run(tmp_path_factory.mktemp("sharp"), SETTINGS, SECRET) as run:  # quorum 2: rounds wait
        sharpen(run["engine"].model)
        yield run


def train_round(run: dict, name: str, *, forged: bool = False):
    """Lease and train a real round; ``forged``: its completions sampled with noise keyed by another seed than the
    lease's (everything else honest: rewards, adapter, token ids that decode to the texts). (lease, folder)."""
    client = CoordinatorClient(run["url"], retries=2)
    lease = client.lease(name)
    out = run["tmp"] / "rounds" / lease.lease_id
    adapter = client.adapter(lease.base_version, lease.base_sha, run["tmp"] / "bases", 1 << 30)
    engine = run["engine"]
    if forged:
        honest = engine.train_steps
        engine.train_steps = lambda rows, steps, *, seed, **kw: honest(rows, steps, seed=seed + 1, **kw)
    try:
        engine.run_round(adapter, lease, out)
    finally:
        engine.__dict__.pop("train_steps", None)
    return lease, out


def honest_again(run: dict, lease, out: Path) -> Path:
    """The round of ``lease`` trained again, honestly: the completions a forger would swap in after admission."""
    adapter = CoordinatorClient(run["url"], retries=2).adapter(lease.base_version, lease.base_sha,
                                                               run["tmp"] / "bases", 1 << 30)
    run["engine"].run_round(adapter, lease, out)
    return out


def submit(run: dict, lease, out) -> dict:
    sub_id = layout.submission_id(lease.worker, lease.lease_id)
    adds = {layout.submission_path(lease.base_version, sub_id, f): out / f for f in layout.SUBMISSION_FILES}
    commit = run["store"].commit(adds, message=f"hubgrpo: submission {sub_id}")
    return CoordinatorClient(run["url"], retries=2).submit(lease, commit)


def wait_merged(coord, sub_id: str, timeout: float = 60.0):
    import time

    deadline = time.time() + timeout
    while sub_id not in coord.state.merged_ids:
        assert time.time() < deadline, f"{sub_id} was not merged"
        time.sleep(0.05)
    return {m.submission_id: m for v in coord.state.versions for m in v.merged}


def row(status: dict, worker: str) -> dict:
    return next(r for r in status["leaderboard"] if r["worker"] == worker)


@pytest.mark.timeout(600)
def test_an_honest_round_passes_and_a_forged_one_excludes_its_worker_across_a_restart(served_run, tmp_path):
    run = served_run
    client = CoordinatorClient(run["url"], retries=2)
    verifier = Verifier(run["store"], client, engine=run["engine"], workdir=tmp_path / "verifier")

    forged_lease, forged_out = train_round(run, "w2", forged=True)
    spare_lease, spare_out = train_round(run, "w2")  # a second round of w2's, submitted after the verdict
    forged = submit(run, forged_lease, forged_out)
    assert forged["status"] == "admitted"  # its rewards are its completions': verified rewards let it in
    assert [t["submission_id"] for t in client.status()["verify"]["todo"]] == [forged["submission_id"]]

    results = verifier.run(once=True)  # checked while pending: before any merge
    assert [r["submission_id"] for r in results] == [forged["submission_id"]]
    assert not results[0]["passed"] and results[0]["mismatches"] > 0, results[0]["reason"]
    assert results[0]["status"] == "recorded"
    assert results[0]["tokens"] <= 0.5 * sum(map(len, _batch0_ids(forged_out)))  # a sample, not the round
    status = client.status()
    assert status["verify"]["excluded"] == ["w2"] and status["verify"]["failed"] == 1
    assert row(status, "w2")["excluded"] and row(status, "w2")["failed"] == 1
    with pytest.raises(Refused) as e:
        client.lease("w2")
    assert e.value.code == "excluded" and e.value.hint
    with pytest.raises(InvalidSubmission) as e2:
        submit(run, spare_lease, spare_out)
    assert e2.value.code == "excluded"

    lease, out = train_round(run, "w1")
    honest = submit(run, lease, out)
    merged = wait_merged(run["coord"], honest["submission_id"])  # the quorum of 2: w2's pending round and w1's
    assert merged[forged["submission_id"]].weight == 0.0 and merged[honest["submission_id"]].weight == 1.0

    results = verifier.run(once=True)
    assert [r["submission_id"] for r in results] == [honest["submission_id"]]
    assert results[0]["passed"] and results[0]["checked"] > 0 and results[0]["mismatches"] == 0
    assert verifier.run(once=True) == []  # every round has its verdict
    status = client.status()
    assert row(status, "w1")["checked"] == 1 and row(status, "w1")["failed"] == 0 and not row(status, "w1")["excluded"]
    assert status["leaderboard"][-1]["worker"] == "w2"  # ranked last
    from hubgrpo.space.view import leaderboard_rows

    assert leaderboard_rows(status)[-1][-1] == "EXCLUDED (1 failed of 1)"  # the Space page
    assert leaderboard_rows(status)[0][-1] == "1 checked, 0 failed"
    report = {k: results[0][k] for k in ("passed", "completions", "tokens", "checked", "mismatches", "reason")}
    assert client.record_verdict(honest["submission_id"], report)["status"] == "duplicate"

    run["coord"].flush()  # the verdicts reach state.json
    shown = subprocess.run([str(EXE), "status", "--repo", str(run["store"].location)], capture_output=True,
                           text=True, timeout=120, env={**os.environ, "COLUMNS": "250"})
    assert shown.returncode == 0, shown.stderr
    assert "EXCLUDED" in shown.stdout and "2 rounds checked, 1 failed; excluded: w2" in shown.stdout, shown.stdout
    again = Coordinator(run["store"], SECRET, workdir=tmp_path / "restarted")
    assert again.status()["verify"]["excluded"] == ["w2"] and again.status()["verify"]["checked"] == 2
    with pytest.raises(Refused) as e:
        again.lease("w2")
    assert e.value.code == "excluded"
    assert again.lease("w1").worker == "w1"
    from hubgrpo.card import run_card

    card = run_card(run["cfg"], again.state)
    assert "Proof of rollouts" in card and "2 rounds checked, 1 failed; excluded: w2." in card
    assert "`verify_tolerance: strict`: float32 workers" in card  # the default, for a participant to read


def _batch0_ids(folder) -> list[list[int]]:
    from hubgrpo.task.rollouts import read

    data = read(folder / layout.ROLLOUTS_FILE, 1 << 30)
    return data.batches[0].completion_ids or []


@pytest.mark.timeout(60)
def test_hostile_verdicts_are_refused_with_their_codes(served_run):
    coord = served_run["coord"]
    for sub_id, report, code in [
        ("nobody-lease", {"passed": False, "completions": 1, "tokens": 1, "checked": 1, "mismatches": 1},
         "unknown_submission"),
        ("x", {"passed": "no"}, "bad_verdict"),
        ("x", [1, 2], "bad_verdict"),
        (7, {}, "bad_verdict"),
        ("x", {"passed": True, "completions": 1, "tokens": 1, "checked": 5, "mismatches": 0}, "bad_verdict"),
        ("x", {"passed": True, "completions": 1, "tokens": 1, "checked": 1, "mismatches": 0, "extra": 1},
         "bad_verdict"),
    ]:
        with pytest.raises(InvalidSubmission) as e:
            coord.record_verdict(sub_id, report)
        assert e.value.code == code, (sub_id, report, e.value.message)


def _prompt_with_answer(batch) -> None:
    """Every completion's prompt ids replaced by another prompt's (a prompt that could carry the answer)."""
    batch.prompt_ids = [list(reversed(ids)) for ids in batch.prompt_ids]


def _texts_rewritten(batch) -> None:
    """Honest token ids, other texts (the rewards are computed on the texts)."""
    batch.completions = ["<answer>42</answer>" for _ in batch.completions]


def _completions_swapped(batch) -> None:
    """Two honest completions of one prompt, each under the other's index (not the noise that sampled it)."""
    assert batch.prompt_ids[0] == batch.prompt_ids[1]  # one group
    for ids in (batch.completion_ids, batch.completions):
        ids[0], ids[1] = ids[1], ids[0]


def _no_ids(batch) -> None:
    batch.prompt_ids = batch.completion_ids = None


@pytest.mark.timeout(300)
@pytest.mark.parametrize("attack, reason", [(_prompt_with_answer, "prompt ids"), (_texts_rewritten, "text"),
                                            (_completions_swapped, "replayed tokens differ"),
                                            (_no_ids, "no token ids")])
def test_a_round_edited_after_an_honest_generation_fails_its_replay(served_run, tmp_path, attack, reason):
    from hubgrpo.task.rollouts import read

    run = served_run
    if "honest" not in run:  # one honest round of a worker that is not excluded, never submitted
        run["honest"] = train_round(run, "w3")
    lease, out = run["honest"]
    client = CoordinatorClient(run["url"], retries=2)
    verifier = Verifier(run["store"], client, engine=run["engine"], workdir=tmp_path / "verifier", budget=1.0)
    data = read(out / layout.ROLLOUTS_FILE, 1 << 30)
    assert verifier.replay(lease, data, b"k" * 32)["passed"]  # the whole batch, as generated
    attack(data.batches[0])
    verdict = verifier.replay(lease, data, b"k" * 32)
    assert not verdict["passed"] and reason in verdict["reason"], verdict


@pytest.mark.timeout(300)
def test_an_untrusted_round_merges_only_once_it_passed(held_run, tmp_path):
    import time

    run = held_run
    client = CoordinatorClient(run["url"], retries=2)
    trusted = submit(run, *train_round(run, "w1"))
    wait_merged(run["coord"], trusted["submission_id"])  # w1 is trusted: no verdict needed
    held = submit(run, *train_round(run, "w2"))
    time.sleep(1.0)  # the tick thread would have merged it by now (quorum 1)
    status = client.status()
    assert status["pending"] == [held["submission_id"]] and status["version"] == 1
    assert [t["submission_id"] for t in status["verify"]["todo"]][0] == held["submission_id"]
    shown = subprocess.run(  # the verifier as its owner runs it: through the installed entry point
        [str(EXE), "evaluate", "--verify", "--once", "--repo", str(run["store"].location), "--coordinator", run["url"]],
        capture_output=True, text=True, timeout=240)
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert "verified 2 rounds, 0 failed" in shown.stdout, shown.stdout  # the held round, and the trusted one after
    assert shown.stdout.index(held["submission_id"]) < shown.stdout.index(trusted["submission_id"])  # pending first
    merged = wait_merged(run["coord"], held["submission_id"])  # merged once it passed
    assert merged[held["submission_id"]].weight == 1.0 and client.status()["version"] == 2


@pytest.mark.timeout(300)
def test_a_round_whose_files_change_after_admission_is_judged_as_admitted(held_run, tmp_path):
    """A forger commits clean completions (the same lease, sampled honestly) over its admitted ones: the verifier
    judges the bytes admission read (the coordinator's copy, whose sha256 the status lists), so the round fails and
    its worker is excluded; under ``coordinator.verify: untrusted`` it merges with weight 0."""
    run = held_run
    client = CoordinatorClient(run["url"], retries=2)
    lease, out = train_round(run, "w4", forged=True)
    forged = submit(run, lease, out)
    clean = honest_again(run, lease, tmp_path / "clean")
    sub_id = forged["submission_id"]
    path = layout.submission_path(lease.base_version, sub_id, layout.ROLLOUTS_FILE)
    run["store"].commit({path: clean / layout.ROLLOUTS_FILE}, message="clean completions over the admitted ones")
    row = next(t for t in client.status()["verify"]["todo"] if t["submission_id"] == sub_id)
    assert row["sha256"][layout.ROLLOUTS_FILE] == hashlib.sha256((out / layout.ROLLOUTS_FILE).read_bytes()).hexdigest()
    verifier = Verifier(run["store"], client, engine=run["engine"], workdir=tmp_path / "verifier")
    verdict = next(r for r in verifier.run(once=True) if r["submission_id"] == sub_id)
    assert not verdict["passed"] and verdict["mismatches"] > 0, verdict
    assert wait_merged(run["coord"], sub_id)[sub_id].weight == 0.0
    assert "w4" in client.status()["verify"]["excluded"]


@pytest.mark.timeout(300)
def test_a_record_whose_lease_is_not_the_signed_one_is_refused(served_run, tmp_path):
    """The verifier replays with the record's lease (its seed, its sampling settings): admission holds the record's
    lease to the signed one, all but what a renewal changes."""
    import json

    run = served_run
    lease, out = train_round(run, "w6")
    record = json.loads((out / layout.SUBMISSION_FILE).read_text())
    record["lease"]["seed"] += 1  # completions forged with this seed would replay as honest
    (out / layout.SUBMISSION_FILE).write_text(json.dumps(record))
    with pytest.raises(InvalidSubmission) as e:
        submit(run, lease, out)
    assert e.value.code == "lease_mismatch" and "seed" in e.value.message, e.value


@pytest.fixture(scope="module")
def inbox_run(tiny_cache, tmp_path_factory):  # noqa: F811
    """A held run (untrusted rounds merge once they passed) whose rounds are uploaded to the coordinator and kept on
    its own disk (``hub.submissions: coordinator``, what ``hubgrpo init`` writes for a Hub run)."""
    settings = [*SETTINGS, "merge.quorum=1", "coordinator.verify=untrusted", 'coordinator.trusted=["w1"]',
                "hub.submissions=coordinator"]
    with served_tiny_run(tmp_path_factory.mktemp("inbox"), settings, SECRET) as run:
        yield run


@pytest.mark.timeout(300)
def test_rounds_kept_on_the_coordinators_disk_are_verified_through_it(inbox_run, tmp_path):
    """The verifier cannot read the coordinator's disk: it asks ``round_files`` (evaluators only), which serves only
    a round awaiting its verdict. Before it, every held round of a Hub run waited for a verdict that never came."""
    import time

    run = inbox_run
    client = CoordinatorClient(run["url"], retries=2)
    held_lease, held_out = train_round(run, "w2")
    forged_lease, forged_out = train_round(run, "w3", forged=True)
    held = client.upload(held_lease, held_out)
    forged = client.upload(forged_lease, forged_out)
    assert held["status"] == forged["status"] == "admitted" and not list(run["store"].list_files("submissions"))
    inbox = Path(run["coord"].inbox.location)
    [swapped] = inbox.rglob(f"{forged['submission_id']}/{layout.ROLLOUTS_FILE}")
    swapped.unlink()  # after admission the forger puts clean completions in (a presigned POST can overwrite)
    swapped.write_bytes((honest_again(run, forged_lease, tmp_path / "clean") / layout.ROLLOUTS_FILE).read_bytes())
    time.sleep(1.0)  # the tick thread would have merged them by now (quorum 1)
    status = client.status()
    assert sorted(status["pending"]) == sorted([held["submission_id"], forged["submission_id"]])
    todo = {t["submission_id"]: t["base_version"] for t in status["verify"]["todo"]}
    names = (layout.SUBMISSION_FILE, layout.ROLLOUTS_FILE)
    got = client.round_files(held["submission_id"], todo[held["submission_id"]], names)
    assert got[layout.ROLLOUTS_FILE] == (held_out / layout.ROLLOUTS_FILE).read_bytes()  # the round as uploaded
    for sub_id, base in [("w2-nosuchlease", 0), ("../../etc", 0), (held["submission_id"], "0")]:
        with pytest.raises(InvalidSubmission) as e:  # only a round awaiting its verdict, as listed
            client.round_files(sub_id, base, names) if isinstance(base, int) else run["coord"].round_files(sub_id, base)
        assert e.value.code == "unknown_submission", e.value
    shown = subprocess.run(  # the verifier as its owner runs it: through the installed entry point
        [str(EXE), "evaluate", "--verify", "--once", "--repo", str(run["store"].location), "--coordinator", run["url"]],
        capture_output=True, text=True, timeout=240)
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert "verified 2 rounds, 1 failed" in shown.stdout, shown.stdout  # the forged round judged as admitted
    merged = wait_merged(run["coord"], held["submission_id"])  # merged once it passed
    assert merged[held["submission_id"]].weight == 1.0
    status = client.status()
    assert status["verify"]["excluded"] == ["w3"] and forged["submission_id"] not in status["pending"]


@pytest.mark.timeout(300)
def test_completions_of_another_adapter_exclude_their_worker(sharp_run, tmp_path):
    """The round's update trained honestly from the leased version, its completions (and their rewards, token ids,
    texts: all consistent) sampled by another adapter with the lease's own noise."""
    import torch

    run, engine = sharp_run, sharp_run["engine"]
    client = CoordinatorClient(run["url"], retries=2)
    lease = client.lease("w2")
    base = client.adapter(lease.base_version, lease.base_sha, tmp_path / "bases", 1 << 30)
    engine.load_adapter(base)
    torch.manual_seed(3)
    for name, p in engine.trainer.model.named_parameters():
        if "lora_B" in name:
            p.data.normal_(0, 0.5)
    other = engine.save_adapter(tmp_path / "other")
    engine.run_round(other, lease, tmp_path / "forged")
    engine.run_round(base, lease, tmp_path / "honest")
    shutil.copy(tmp_path / "forged" / layout.ROLLOUTS_FILE, tmp_path / "honest" / layout.ROLLOUTS_FILE)
    answer = submit(run, lease, tmp_path / "honest")
    assert answer["status"] == "admitted"  # the rewards are its completions': admitted, pending (quorum 2)
    verifier = Verifier(run["store"], client, engine=engine, workdir=tmp_path / "verifier", budget=1.0)
    results = verifier.run(once=True)
    assert [r["submission_id"] for r in results] == [answer["submission_id"]]
    assert not results[0]["passed"] and results[0]["mismatches"] > 0, results[0]
    assert client.status()["verify"]["excluded"] == ["w2"]
    with pytest.raises(Refused):
        client.lease("w2")


def _near_miss(model, engine, lease, batch, warp) -> tuple[int, int, int] | None:
    """(completion, position, token) of batch 0: a token other than the recorded one whose perturbed score lies
    below the replayed choice by more than the ``strict`` tolerance and less than half the ``wide`` one."""
    import torch

    from hubgrpo.proof.noise import gumbel
    from hubgrpo.proof.verify import STRICT, completion_logits, run_tolerance, teacher_batch

    ids, mask, length = teacher_batch(batch.prompt_ids, batch.completion_ids, engine.tokenizer.pad_token_id)
    logits = completion_logits(model, ids, mask, length)
    stop = engine.trainer.eos_token_ids
    for i, c in enumerate(batch.completion_ids):
        warped = warp.apply(logits[i, : len(c)])
        noise = gumbel(lease.seed, torch.full((len(c),), i), torch.arange(len(c)), warped.size(-1))
        deficit = (warped + noise).amax(-1, keepdim=True) - (warped + noise)
        inside = (deficit > STRICT.at(warped)[:, None]) & (deficit < 0.5 * run_tolerance("wide").at(warped)[:, None])
        inside[:, stop] = False  # the completion keeps its end
        hits = inside.nonzero().tolist()
        if hits:
            return i, *hits[0]
    return None


def _continued(model, engine, lease, prompt: list[int], prefix: list[int], index: int, warp, most: int) -> list[int]:
    """``prefix`` (of completion ``index`` of the round) continued as the lease's keyed sampling continues it."""
    import torch
    from transformers import GenerationConfig, LogitsProcessorList

    from hubgrpo.proof.sampling import KeyedGumbelProcessor, cut_at_eos

    stop = engine.trainer.eos_token_ids
    if len(prefix) >= most or prefix[-1] in stop:
        return prefix
    ids = torch.tensor([prompt + prefix])
    config = GenerationConfig(max_new_tokens=most - len(prefix), do_sample=False, eos_token_id=stop,
                              pad_token_id=engine.tokenizer.pad_token_id)
    processor = KeyedGumbelProcessor(lease.seed, torch.tensor([index]), len(prompt), warp)
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config,
                         logits_processor=LogitsProcessorList([processor]))
    return prefix + cut_at_eos(out[:, ids.size(1):], stop)[0]


@pytest.mark.timeout(300)
def test_the_verifier_replays_with_its_runs_tolerance(served_run, tmp_path):
    """One token of an honest round replaced by a near miss — a token the leased version and the lease's noise rank
    just below the one they choose, within the tolerance of ``coordinator.verify_tolerance: wide``, beyond that of
    ``strict`` — and the rest of its completion sampled on from there as the lease samples: a verifier of a wide run
    passes the round, one of a strict run fails it."""
    from hubgrpo.proof.sampling import Warp
    from hubgrpo.task.rollouts import lease_params, read

    run, engine = served_run, served_run["engine"]
    verifier = Verifier(run["store"], CoordinatorClient(run["url"], retries=2), engine=engine,
                        workdir=tmp_path / "verifier", budget=1.0)
    for name in ("w4", "w5", "w6", "w7", "w8"):  # a near miss is not in every round of the tiny model
        lease, out = train_round(run, name)
        data = read(out / layout.ROLLOUTS_FILE, 1 << 30)
        batch, p = data.batches[0], lease_params(verifier.cfg, lease)
        warp = Warp(p["temperature"], p.get("top_k"), p["top_p"])
        assert verifier.replay(lease, data, b"k" * 32)["passed"]  # honest, and the leased version is loaded
        model = engine.trainer.model.eval()
        found = _near_miss(model, engine, lease, batch, warp)
        if found:
            break
        model.train()
    assert found, "no near miss in five rounds"
    i, pos, token = found
    forged = _continued(model, engine, lease, batch.prompt_ids[i], batch.completion_ids[i][:pos] + [token], i, warp,
                        int(p["max_completion_length"]))
    model.train()
    batch.completion_ids[i] = forged
    batch.completions[i] = engine.tokenizer.decode(forged, skip_special_tokens=True)
    assert verifier.cfg.coordinator.verify_tolerance == "strict"  # the default, read from the run's config
    strict = verifier.replay(lease, data, b"k" * 32)
    verifier.cfg.coordinator.verify_tolerance = "wide"  # a run that lets bfloat16 workers in
    wide = verifier.replay(lease, data, b"k" * 32)
    assert wide["passed"] and wide["mismatches"] == 0, wide
    assert not strict["passed"] and strict["mismatches"] == 1, strict
