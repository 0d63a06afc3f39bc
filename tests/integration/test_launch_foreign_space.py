"""`hubgrpo launch --install space` (the default) installs the wheel the coordinator's Space publishes and runs it
in each job with the user's HF_TOKEN as a secret: whoever owns that Space writes the code that gets the token.

A coordinator is just a URL (here a Space id) a participant was given, so a Space in a namespace the user does not
own (their name or one of their orgs) is refused before any job starts, with the way out named. Against the Hub
emulator over real HTTP; the emulator's job creation is replaced by a recorder, so nothing is ever installed or run
here (a job would pip-install the Space's wheel into this environment).
"""

from __future__ import annotations

import pytest
from huggingface_hub import HfApi

from hubgrpo import __version__, layout
from tests.conftest import TEST_TOKEN
from tests.support.hub_emulator import HubEmulator
from tests.support.hub_emulator_state import HubError

MALLORY = "hf_test_mallory_token"


@pytest.fixture
def emu(monkeypatch):
    emu = HubEmulator(users={TEST_TOKEN: "alice", MALLORY: "mallory"}).start()
    created: list[dict] = []

    def record(api, req, ns):  # never a process: a job here would run `pip install` on this machine
        created.append({"ns": ns, "command": req.json().get("command")})
        raise HubError(503, "no jobs in this test")

    monkeypatch.setattr(emu.api.jobs, "create", record)
    emu.created = created
    monkeypatch.setenv("HF_TOKEN", TEST_TOKEN)
    monkeypatch.setenv("HF_ENDPOINT", emu.url)
    try:
        yield emu
    finally:
        emu.stop()


def publish_wheel(emu, token: str, space: str) -> None:
    api = HfApi(endpoint=emu.url, token=token)
    api.create_repo(space, repo_type="space", space_sdk="gradio")
    api.upload_file(path_or_fileobj=b"not a wheel", repo_id=space, repo_type="space",
                    path_in_repo=f"{layout.WHEELS_DIR}/{layout.wheel_name(__version__)}")


@pytest.mark.timeout(60)
def test_launch_refuses_to_run_another_users_space_wheel_with_your_token(emu, capsys):
    from hubgrpo.cli.main import main

    publish_wheel(emu, MALLORY, "mallory/coord")
    code = main(["launch", "--repo", "mallory/run", "--coordinator", "mallory/coord", "--flavor", "cpu-basic"])
    err = capsys.readouterr().err
    assert emu.created == [], "a job that installs mallory's wheel with alice's token was requested"
    assert code != 0 and "mallory/coord" in err and "--install" in err, err
    assert TEST_TOKEN not in err


@pytest.mark.timeout(60)
def test_launch_still_installs_the_wheel_of_your_own_space(emu, capsys):
    from hubgrpo.cli.main import main

    publish_wheel(emu, TEST_TOKEN, "alice/coord")
    main(["launch", "--repo", "alice/run", "--coordinator", "alice/coord", "--flavor", "cpu-basic"])
    assert [c["ns"] for c in emu.created] == ["alice"], capsys.readouterr().err  # it got as far as the job
    assert layout.wheel_name(__version__) in emu.created[0]["command"][-1]
