"""A real browser on the Space: `hubgrpo space` in its own process (the Hub emulator as the bucket), two simulated
workers run 2 versions, then headless Debian chromium (driven by Playwright, never `playwright install`) opens the
page and must show the leaderboard rows and the rendered reward plot. Screenshot: tests/artifacts/space.png."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hubgrpo.worker.client import CoordinatorClient
from hubgrpo.errors import CoordinatorError
from hubgrpo.space.api import free_port
from hubgrpo.store.hub import HubStore
from tests.support.space_support import ALICE, BOB, SECRET, SimWorker, make_run, run_versions, start_emulator

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"  # tests/artifacts/ (ignored)
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _space_process(emu_url: str, repo: str, port: int, log_path: Path) -> subprocess.Popen:
    """`hubgrpo space --repo REPO` as a separate process, pointed at the emulator."""
    env = dict(os.environ, HF_ENDPOINT=emu_url, HF_TOKEN=ALICE, HUBGRPO_SECRET=SECRET.decode(),
               OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "hubgrpo.cli", "space", "--repo", repo, "--port", str(port), "--refresh-s", "1",
           "--batch-wait-s", "0.1", "--quiet"]
    with log_path.open("wb") as log:
        return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _wait_up(url: str, proc: subprocess.Popen, log_path: Path, timeout: float = 60.0) -> None:
    client = CoordinatorClient(url, retries=0)
    end = time.time() + timeout
    while time.time() < end:
        assert proc.poll() is None, f"`hubgrpo space` exited:\n{log_path.read_text()[-2000:]}"
        try:
            client.status()
            return
        except CoordinatorError:
            time.sleep(0.3)
    raise AssertionError(f"`hubgrpo space` did not come up in {timeout:.0f} s:\n{log_path.read_text()[-2000:]}")


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _open_page(url: str, shot: Path) -> dict:
    """Load the page in headless chromium; wait for the leaderboard rows and the plot; screenshot it."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(url, wait_until="domcontentloaded", timeout=30_000)
            page.locator("#hg-leaderboard").get_by_text("bob-box", exact=True).first.wait_for(timeout=30_000)
            page.locator("#hg-reward-plot svg path, #hg-reward-plot canvas").first.wait_for(timeout=30_000)
            page.locator("#hg-worker-plot svg path, #hg-worker-plot canvas").first.wait_for(timeout=30_000)
            page.wait_for_timeout(500)  # let the plots finish their transitions
            shot.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(shot), full_page=True)
            return {"table": page.locator("#hg-leaderboard").inner_text(),
                    "plot_marks": page.locator("#hg-reward-plot svg path, #hg-reward-plot canvas").count(),
                    "legend": page.locator("#hg-worker-plot").inner_text(),
                    "reward_legend": page.locator("#hg-reward-plot").inner_text(),
                    "x_labels": page.locator("#hg-reward-plot svg g[aria-label^='X-axis'] g.role-axis-label text").evaluate_all(
                        "els => els.map(e => e.textContent)"),
                    "title": page.title()}
        finally:
            browser.close()


@pytest.mark.timeout(240)  # a Space process, two versions and Chromium on a loaded 2-core machine
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium; .ci/run does)")
def test_space_page_shows_leaderboard_and_reward_plot(tmp_path):
    pytest.importorskip("playwright", reason="playwright is not installed (the `test` extra installs it)")
    emu = start_emulator()
    proc = None
    try:
        make_run(emu, tmp_path, "browser")
        port, log_path = free_port(), tmp_path / "space.log"
        url = f"http://127.0.0.1:{port}"
        t0 = time.time()
        proc = _space_process(emu.url, "alice/browser", port, log_path)
        _wait_up(url, proc, log_path)
        t1 = time.time()
        own = HubStore("alice/browser", token=ALICE, endpoint=emu.url, cache_dir=tmp_path / "own")
        workers = [SimWorker(url, "alice-box", ALICE, tmp_path, store=own),
                   SimWorker(url, "bob-box", BOB, tmp_path, reader=own)]
        answers = run_versions(workers, 2)
        assert [a["merge_due"] for a in answers] == [False, True] * 2  # merged by the Space's tick thread
        owner = CoordinatorClient(url, token=ALICE)  # held-out scores, as `hubgrpo evaluate` records them
        for v in range(3):
            assert owner.record_eval(v, 0.25 * v, 4)["status"] == "recorded"
        t2 = time.time()
        seen = _open_page(url, ARTIFACTS / "space.png")
        print(f"\n`hubgrpo space`: up in {t1 - t0:.1f} s, 2 versions in {t2 - t1:.1f} s, page checked in "
              f"{time.time() - t2:.1f} s; RSS {_rss_mib(proc.pid):.0f} MiB")
        assert "alice-box" in seen["table"] and "bob-box" in seen["table"] and "rounds accepted" in seen["table"]
        assert seen["plot_marks"] > 0 and "alice-box" in seen["legend"] and "coordtest" in seen["title"]
        assert "held-out (greedy)" in seen["reward_legend"] and "training (recomputed)" in seen["reward_legend"]
        assert "training (smoothed)" in seen["reward_legend"]
        assert seen["x_labels"][:3] == ["0", "1", "2"], seen["x_labels"]  # versions: whole numbers on the axis
        assert all(label.isdigit() for label in seen["x_labels"]), seen["x_labels"]
        assert (ARTIFACTS / "space.png").stat().st_size > 10_000
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        emu.stop()
