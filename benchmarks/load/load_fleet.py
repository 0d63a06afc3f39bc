"""The simulated fleet of ``coordinator_load.py``: one asyncio process, raw HTTP (``raw_http.py``), every request on its own schedule.

Each worker leases at a fixed phase of its round, heartbeats every ``beat_s`` and submits at the end of the round,
on a schedule that does not wait for the server (open loop: a slow answer does not slow the arrivals, so latency
grows without bound past saturation instead of hiding it). The calls go to the coordinator's plain routes
(``POST /hubgrpo/api/<name>``, ``--route gradio`` for Gradio's ``/gradio_api/run/<name>``). A round is delivered as
the worker would: four PUTs through the lease's presigned URLs (rounds on S3), one commit of the run repo (rounds
in the repo) or one POST of the ``upload`` route (mode ``hub``: ``hub.submissions: coordinator``, the JSON body
``CoordinatorClient.upload`` sends, which is also the submit), the adapter a pre-built synthetic one, the rollouts honest ones for the lease's prompts (the
coordinator recomputes their rewards), submission.json last. Where submit answers ``checking`` the worker polls
``verdict`` as the real client does; the time from the submit to the final verdict is ``submit_to_verdict``.
In mode ``hub`` each worker also downloads the version it leased from the coordinator's adapter route
(``GET /hubgrpo/api/adapter/<version>/<adapter id>/<file>``, both files; ``adapter``), once per adapter id, as the
real worker's cache does.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import json
import random
import time
from pathlib import Path

ENDPOINTS = ("lease", "heartbeat", "submit")  # the calls of the target (verdict polls are counted too)
HUB_ENDPOINTS = ("lease", "heartbeat", "upload", "verdict", "adapter")  # mode hub: every call is in the target
CALLS = (*ENDPOINTS, "verdict", "upload", "adapter")
SLOW_S = 0.05  # calls at least this slow are kept with their start time (do they cluster around merges?)


class Recorder:
    """Latency samples (within the measurement window) and outcome counters."""

    def __init__(self):
        self.lat: dict[str, list[float]] = collections.defaultdict(list)
        self.outcomes: collections.Counter = collections.Counter()
        self.window: tuple[float, float] = (0.0, 0.0)
        self.delivered: set[str] = set()
        self.refused: set[str] = set()
        self.slow: list[tuple[str, float, float]] = []  # (endpoint, started, seconds) of calls ≥ SLOW_S
        self.bytes: dict[str, int] = {}

    def sample(self, endpoint: str, started: float, seconds: float) -> None:
        if self.window[0] <= started < self.window[1]:
            self.lat[endpoint].append(seconds)
            if seconds >= SLOW_S and endpoint in (*ENDPOINTS, *HUB_ENDPOINTS):
                self.slow.append((endpoint, round(started, 3), round(seconds, 4)))


class Fleet:
    """The simulated workers against one coordinator URL."""

    def __init__(self, args, mode: str, url: str, repo: Path, variant: Path, rec: Recorder):
        from benchmarks.load.raw_http import RawHTTP

        from hubgrpo import layout

        self.args, self.mode, self.rec, self.layout, self.url = args, mode, rec, layout, url
        self.plain = getattr(args, "route", "plain") == "plain"
        self.base = url + ("/hubgrpo/api" if self.plain else "/gradio_api/run")
        self.api, self.s3 = RawHTTP(512), RawHTTP(512)  # a cheap client: see raw_http.py
        self.files = {n: (variant / n).read_bytes() for n in layout.ADAPTER_FILES}
        self.b64 = {n: base64.b64encode(body).decode("ascii") for n, body in self.files.items()}
        self.variant = variant
        self.store = open_store(str(repo))
        self.cfg = None
        self.cached: dict[str, set[str]] = collections.defaultdict(set)  # mode hub: adapter ids each worker has
        self.moved: dict[str, str] = {}  # mode hub: adapter id -> base64 of that version moved by the round's step
        self.bytes = collections.Counter()  # mode hub: bytes uploaded ("up", the JSON bodies) and downloaded ("down")
        self.tasks: set[asyncio.Task] = set()

    def spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def call(self, name: str, data: list, body: bytes | None = None) -> tuple[bool, object]:
        started, t = time.time(), time.perf_counter()
        try:
            status, body = await self.api.request("POST", f"{self.base}/{name}",
                                                  body or json.dumps({"data": data}).encode(),
                                                  {"Content-Type": "application/json"})
            answer = json.loads(body)
            envelope = answer if self.plain else answer["data"][0]
        except Exception as e:  # deliberate: a benchmark counts every failure, whatever it is
            self.rec.outcomes[f"{name}_transport_{type(e).__name__}"] += 1
            return False, None
        finally:
            self.rec.sample(name, started, time.perf_counter() - t)
        if envelope.get("ok"):
            return True, envelope["result"]
        err = envelope.get("error") or {}
        self.rec.outcomes[f"{name}_refused_{err.get('code')}"] += 1
        return False, err

    async def worker(self, i: int, t0: float, stop_leasing: float) -> None:
        rng = random.Random(i)
        start = t0 + rng.uniform(0, self.args.round_s)
        while start < stop_leasing:
            await asyncio.sleep(max(0.0, start - time.time()))
            self.spawn(self.round(f"sim{i:04d}", start))
            start += self.args.round_s

    async def round(self, name: str, start: float) -> None:
        from hubgrpo.layout import PROTOCOL_VERSION

        ok, lease = await self.call("lease", [name, None, None, PROTOCOL_VERSION])
        if not ok:
            return
        self.rec.outcomes["lease_ok"] += 1
        if self.mode == "hub" and not await self.download(name, lease):
            return
        held = {"lease": lease}
        end = start + self.args.round_s - 1.5  # upload, then submit 0.5 s before the next round's lease
        beat = start + self.args.beat_s
        while beat < end:
            self.spawn(self.heartbeat(held, beat))
            beat += self.args.beat_s
        await asyncio.sleep(max(0.0, end - time.time()))
        if self.mode == "hub":
            return await self.upload(held["lease"], end + 1.0)
        token = await self.deliver(held["lease"])
        if token is None:
            return
        sub_id = self.layout.submission_id(lease["worker"], lease["lease_id"])
        self.rec.delivered.add(sub_id)
        await asyncio.sleep(max(0.0, end + 1.0 - time.time()))
        await self.submit(held["lease"], sub_id, "submit", [held["lease"], token, None])

    async def submit(self, lease: dict, sub_id: str, name: str, data: list, body: bytes | None = None) -> None:
        """Submit (``submit``; mode hub: ``upload``, which delivers and submits at once), then poll the verdict as
        the client does while it is ``checking``; record the time to the verdict."""
        started, t = time.time(), time.perf_counter()
        ok, answer = await self.call(name, data, body)
        if ok and name == "upload":
            self.rec.delivered.add(sub_id)
        while ok and answer.get("status") == "checking":
            await asyncio.sleep(min(5.0, max(0.05, float(answer.get("wait_s") or 0.5))))
            ok, answer = await self.call("verdict", [lease, None])
        self.rec.sample("submit_to_verdict", started, time.perf_counter() - t)
        if ok:
            self.rec.outcomes[f"{name}_{answer['status']}"] += 1
        elif answer and answer.get("error") in ("InvalidSubmission", "LeaseError"):
            self.rec.refused.add(sub_id)

    async def download(self, name: str, lease: dict) -> bool:
        """Mode hub: the leased version's two files from the adapter route, unless this worker has them (False:
        the round is abandoned, as the real worker's would be)."""
        sha = lease["base_sha"]
        if sha in self.cached[name]:
            return True
        started, t = time.time(), time.perf_counter()
        try:
            for file in self.layout.ADAPTER_FILES:
                status, body = await self.api.request("GET", f"{self.url}/hubgrpo/api/adapter/{lease['base_version']}"
                                                      f"/{sha}/{file}")
                if status != 200:
                    raise RuntimeError(f"HTTP {status}")
                if self.rec.window[0] <= started < self.rec.window[1]:
                    self.bytes["down"] += len(body)
                if file == self.layout.ADAPTER_WEIGHTS and sha not in self.moved:
                    self.moved[sha] = self.step(body, lease["base_version"])
        except Exception as e:  # deliberate: a benchmark counts every failure, whatever it is
            self.rec.outcomes[f"adapter_failed_{type(e).__name__}_{str(e)[:20]}"] += 1
            return False
        finally:
            self.rec.sample("adapter", started, time.perf_counter() - t)
        self.rec.outcomes["adapter_ok"] += 1
        self.cached[name].add(sha)
        return True

    def step(self, weights: bytes, version: int) -> str:
        """Mode hub: the round's adapter, base64 — the downloaded version with every B moved by the synthetic
        round's B (``variant``: 0.01·N(0, 1)), the sign alternating with the version's parity so that the merged
        versions do not drift (a round that sent one fixed adapter whatever its base would be refused
        ``out_of_bounds`` once the global moved away from it: measured, one round in six)."""
        from safetensors.torch import load, save

        if not hasattr(self, "delta"):
            self.delta = {k: v for k, v in load(self.files[self.layout.ADAPTER_WEIGHTS]).items() if ".lora_B" in k}
        sign = -1.0 if version % 2 else 1.0
        moved = {k: v + sign * self.delta[k] if k in self.delta else v for k, v in load(weights).items()}
        if len(self.moved) > 64:  # keep the newest versions only
            self.moved.pop(next(iter(self.moved)))
        return base64.b64encode(save(moved)).decode("ascii")

    async def upload(self, lease: dict, at: float) -> None:
        """Mode hub: the round as ``CoordinatorClient.upload`` sends it (JSON, {file: base64}), which also submits
        it; the verdict polled while it is ``checking``."""
        try:
            files = self.round_files(lease)
            b64 = {**self.b64, **{n: base64.b64encode(files[n]).decode("ascii") for n in files if n not in self.b64}}
            b64[self.layout.ADAPTER_WEIGHTS] = self.moved[lease["base_sha"]]
            body = json.dumps({"data": [lease, b64, None]}).encode()
        except Exception as e:  # deliberate: counted, the round is then not uploaded
            self.rec.outcomes[f"deliver_failed_{type(e).__name__}"] += 1
            return
        sub_id = self.layout.submission_id(lease["worker"], lease["lease_id"])
        await asyncio.sleep(max(0.0, at - time.time()))
        if self.rec.window[0] <= time.time() < self.rec.window[1]:
            self.bytes["up"] += len(body)
        await self.submit(lease, sub_id, "upload", [], body)

    async def heartbeat(self, held: dict, at: float) -> None:
        await asyncio.sleep(max(0.0, at - time.time()))
        ok, renewed = await self.call("heartbeat", [held["lease"], None])
        if ok:
            held["lease"] = renewed
            self.rec.outcomes["heartbeat_ok"] += 1

    def warm_up(self) -> None:
        """Load what the first delivery would load lazily, before the schedule starts: the test helpers import
        torch and build the run's prompt data (1.8 s here). Measured once without it: no call of a 1000-worker
        fleet started in the first 0.9 s of the window, then 87 within 70 ms, which set the p99 of lease and
        heartbeat; the loop-lag probe missed it because the stall began just before the window opened."""
        lease = {"lease_id": "warm", "run_id": "warm", "round_id": 0, "worker": "warm", "base_version": 0,
                 "base_sha": "0" * 40, "prompt_indices": [0], "steps": 1, "seed": 0, "issued_at": 0.0, "deadline": 0.0}
        self.round_files(lease)

    def round_files(self, lease: dict) -> dict[str, bytes | Path]:
        """What the worker delivers for ``lease``: the adapter, honest rollouts, submission.json (last)."""
        from hubgrpo import runrepo
        from hubgrpo.layout import Lease
        from hubgrpo.task.rollouts import dumps
        from tests.support.coord_helpers import honest_rollouts, submission_record

        self.cfg = self.cfg or runrepo.read_config(self.store)
        bare = Lease.model_validate({**lease, "uploads": {}})
        layout = self.layout
        return {**self.files, layout.ROLLOUTS_FILE: dumps(honest_rollouts(bare, self.cfg)),
                layout.SUBMISSION_FILE: submission_record(bare, reward=random.random()).to_json()}

    async def deliver(self, lease: dict) -> str | None:
        """Upload the round (S3: presigned PUTs; repo: a commit in a thread); the token or commit to submit."""
        layout = self.layout
        try:
            files = self.round_files(lease)
            if self.mode == "s3":
                for name in layout.SUBMISSION_FILES:
                    status, _ = await self.s3.request("PUT", lease["uploads"][name], files[name],
                                                      {"If-None-Match": "*"})
                    if status not in (200, 412):
                        raise RuntimeError(f"PUT {name}: HTTP {status}")
                return layout.box_token(files[layout.SUBMISSION_FILE])
            sub_id = layout.submission_id(lease["worker"], lease["lease_id"])
            adds = {layout.submission_path(lease["base_version"], sub_id, n): body for n, body in files.items()}
            return await asyncio.to_thread(self.store.commit, adds, message=f"hubgrpo: submission {sub_id}")
        except Exception as e:  # deliberate: counted, the round is then not submitted
            self.rec.outcomes[f"deliver_failed_{type(e).__name__}"] += 1
            return None

    async def close(self) -> None:
        await self.api.aclose()
        await self.s3.aclose()


def open_store(spec: str):
    """The run repo: ``hub:<repo id>`` on the Hub endpoint of ``HF_ENDPOINT``/``HF_TOKEN`` (the emulator), else a
    local folder."""
    if spec.startswith("hub:"):
        from hubgrpo.store.hub import HubStore

        return HubStore(spec.removeprefix("hub:"))
    from hubgrpo.store.local import LocalStore

    return LocalStore(spec, fsync=False)


async def loop_lag(rec: Recorder, stop: float, every: float = 0.05) -> None:
    """How late this process's event loop wakes a 50-ms sleep (``loop_lag``): when it is as large as the calls'
    latency, the latency is spent in the generator, not in the server."""
    while time.time() < stop:
        started, t = time.time(), time.perf_counter()
        await asyncio.sleep(every)
        lag = max(0.0, time.perf_counter() - t - every)
        rec.sample("loop_lag", max(started, min(started + lag, rec.window[0])), lag)  # a stall across the
        # window's opening counts (measured once: a 2.4-s stall that began just before it went unseen)


def generate(args, mode: str, url: str, repo: Path, variant: Path, workers: int, out: Path) -> None:
    """``--generate``: run the fleet in this process; write its Recorder as JSON to ``out``."""
    async def main() -> Recorder:
        rec = Recorder()
        fleet = Fleet(args, mode, url, repo, variant, rec)
        fleet.warm_up()
        t0 = time.time() + 1.0
        warm = t0 + args.round_s
        rec.window = (warm, warm + args.measure_s)
        stop = warm + args.measure_s
        workers_ = [asyncio.get_running_loop().create_task(fleet.worker(i, t0, stop)) for i in range(workers)]
        lag = asyncio.get_running_loop().create_task(loop_lag(rec, stop))
        await asyncio.gather(*workers_, lag)
        deadline = time.time() + args.round_s + 60
        while fleet.tasks and time.time() < deadline:  # rounds leased before the stop finish
            await asyncio.sleep(0.5)
        rec.outcomes["rounds_unfinished_at_end"] = len(fleet.tasks)
        await fleet.close()
        rec.bytes = dict(fleet.bytes)
        return rec

    import gc

    from benchmarks.load.load_stats import gc_pauses

    gc_pauses(out.parent / "fleet_gc_pauses.txt")
    gc.collect()
    gc.freeze()
    gc.disable()  # measured: the fleet's own full GC passes (up to 286 ms) stalled its event loop and every call in
    # flight — ~80 calls of a 1000-worker window at once; a run of minutes can afford its cyclic garbage
    t_cpu = time.process_time()
    rec = asyncio.run(main())
    out.write_text(json.dumps({"lat": rec.lat, "outcomes": rec.outcomes, "window": rec.window,
                               "delivered": sorted(rec.delivered), "refused": sorted(rec.refused), "slow": rec.slow,
                               "generator_cpu_s": time.process_time() - t_cpu, "bytes": rec.bytes}))
