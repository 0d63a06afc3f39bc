"""The limit of ``hub.submissions: coordinator``: rounds through the coordinator's upload route (real HTTP, the JSON +
base64 body ``CoordinatorClient.upload`` sends), kept in a folder on the coordinator's disk.

    python benchmarks/load/upload_route.py [--models demo,0.5b,1.5b] [--seq 6] [--conc 4] [--conc-rounds 12]
    python benchmarks/load/upload_route.py --quick   # the script checked: a 2-layer adapter, a few uploads

For each adapter size — the demo's (SmolLM2-135M-Instruct, configs/demo.yaml: r = 16 on all linear layers) and
Qwen2.5-0.5B / 1.5B at r = 16 on all linear layers; fp32 factors, PEFT's key names; the sizes are computed from the
architectures and checked against PEFT on the meta device — a fresh run repo (a local folder) whose version 0 has
that shape, and ``hubgrpo coordinator`` serving it in its own process (``hub.submissions: coordinator``, no merge
during the measurement: quorum 10,000). The client (this process) leases a round per upload and sends a body built
beforehand (the adapter B moved by 0.01·N(0, 1), honest rollouts, the record), so the coordinator does its whole
job on each: read and parse the body, decode base64, put the round in its box, read it back and run every
admission check (safetensors, keys, shapes, finiteness, step bound, update norm, the rewards recomputed).

Measured per size:
- ``sequential``: one upload at a time (``--seq``): wall time per round (the worker's wait), MB/s;
- ``concurrent``: ``--conc`` uploads in flight (a user's upload slots: ``guard.SLOTS_PER_USER``) for
  ``--conc-rounds`` rounds: rounds/s and MB/s, while a probe asks ``status`` every 50 ms (what an upload costs the
  other calls: the JSON body is parsed on the server's event loop);
- the coordinator process's CPU seconds per MB of adapter (from /proc, leases excluded), and in this process the
  part of it that is the wire format (parsing the JSON, decoding base64: ``routes.parse_arguments``);
- ``downloads``: the version's adapter from the coordinator's adapter route (``GET /hubgrpo/api/adapter/…``),
  which every round also costs the coordinator (sequential, MB/s and CPU per MB).

Writes ``results/upload_route.{md,json}``.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.common import options, results_dir, start, write  # noqa: E402
from benchmarks.load.load_stats import cpu_seconds, pct  # noqa: E402

RANK = 16
MODELS = {  # (layers, hidden, intermediate, heads, kv heads, head dim, transformers config class)
    "demo": (30, 576, 1536, 9, 3, 64, "LlamaConfig"),  # SmolLM2-135M-Instruct (configs/demo.yaml, lora.r 16)
    "0.5b": (24, 896, 4864, 14, 2, 64, "Qwen2Config"),  # Qwen2.5-0.5B
    "1.5b": (28, 1536, 8960, 12, 2, 128, "Qwen2Config"),  # Qwen2.5-1.5B
    "small": (2, 128, 256, 4, 2, 32, "LlamaConfig"),  # --quick: the script checked, not a model anyone trains
}
FLEET, ROUND_S = 64, 60.0  # the Hub-only target: 64 workers with 60-s rounds
MB = 1e6


def shapes(name: str) -> dict:
    from tests.support.adapter_factory import qwen_shapes

    layers, hidden, inter, heads, kv, hd, _ = MODELS[name]
    return qwen_shapes(layers=layers, hidden=hidden, inter=inter, heads=heads, kv_heads=kv, head_dim=hd)


def peft_lora_params(name: str) -> int:
    """LoRA parameters PEFT puts on the model (r = 16, all-linear), built on the meta device (no weights)."""
    import torch
    import transformers
    from peft import LoraConfig, get_peft_model

    layers, hidden, inter, heads, kv, hd, cls = MODELS[name]
    cfg = getattr(transformers, cls)(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                                     num_attention_heads=heads, num_key_value_heads=kv, head_dim=hd,
                                     vocab_size=49152 if name == "demo" else 151936, tie_word_embeddings=True)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    peft = get_peft_model(model, LoraConfig(r=RANK, lora_alpha=2 * RANK, target_modules="all-linear"))
    return sum(p.numel() for n, p in peft.named_parameters() if "lora_" in n)


def init_run(folder: Path, name: str) -> tuple[Path, bytes, bytes]:
    """A run repo whose version 0 has the model's LoRA shape (B = 0); (repo, a trained round's adapter bytes, its
    config bytes)."""
    import torch

    from hubgrpo.config import loads
    from hubgrpo.coordinator.repo_init import init_repo
    from hubgrpo.merge.adapter import Adapter, adapter_bytes, save_adapter_dir
    from hubgrpo.store.local import LocalStore
    from tests.support.adapter_factory import make_adapter

    base = make_adapter(shapes(name), r=RANK, seed=0, scale=0.02, alpha=2 * RANK, base_model_name_or_path="builtin:tiny")
    gen = torch.Generator().manual_seed(1)
    v0 = {k: torch.zeros_like(v) if ".lora_B" in k else v for k, v in base.weights.items()}
    save_adapter_dir(Adapter(weights=v0, config=base.config), folder / "v0")
    moved = {k: v + 0.01 * torch.randn(v.shape, generator=gen) if ".lora_B" in k else v for k, v in v0.items()}
    cfg = loads("base_model: builtin:tiny\nproject_name: upload-route\n"
                "params: {per_device_train_batch_size: 4, num_generations: 2, learning_rate: 0.1}\n"
                "rounds: {steps: 2, versions: 100000, lr_schedule: constant, reset_optimizer: true}\n"
                f"lora: {{r: {RANK}, alpha: {2 * RANK}, target_modules: [q_proj, k_proj, v_proj, o_proj, gate_proj,"
                " up_proj, down_proj]}\n"
                "merge: {method: ffa, quorum: 10000, max_norm_factor: null, rebase: false, staleness_per_worker: 0}\n"
                "coordinator: {lease_timeout_s: 3600, round_timeout_s: 3600, max_leases_per_user: 100000,"
                " lease_waits_for_merge_s: 0}\n"
                "hub: {submissions: coordinator}\n")
    init_repo(LocalStore(folder / "repo"), cfg, folder / "v0")
    return (folder / "repo", *adapter_bytes(Adapter(weights=moved, config=base.config)))


class Rounds:
    """Leases and upload bodies for one run, over one HTTP client."""

    def __init__(self, url: str, repo: Path, weights: bytes, config: bytes):
        import httpx

        from hubgrpo import runrepo
        from hubgrpo.store.local import LocalStore

        self.http = httpx.Client(base_url=url, timeout=600)
        self.cfg = runrepo.read_config(LocalStore(repo))
        self.files = {"adapter_model.safetensors": base64.b64encode(weights).decode(),
                      "adapter_config.json": base64.b64encode(config).decode()}
        self.adapter_mb, self.n = len(weights) / MB, 0

    def call(self, name: str, data: list) -> dict:
        answer = self.http.post(f"/hubgrpo/api/{name}", json={"data": data}).json()
        if not answer.get("ok"):
            raise RuntimeError(f"{name}: {answer.get('error')}")
        return answer["result"]

    def lease(self) -> dict:
        from hubgrpo.layout import PROTOCOL_VERSION

        self.n += 1
        return self.call("lease", [f"w{self.n}", None, None, PROTOCOL_VERSION])

    def body(self, lease: dict) -> bytes:
        """The upload's JSON body, as ``CoordinatorClient.upload`` sends it."""
        from hubgrpo.layout import Lease
        from hubgrpo.task.rollouts import dumps
        from tests.support.coord_helpers import honest_rollouts, submission_record

        bare = Lease.model_validate({**lease, "uploads": {}})
        files = {**self.files, "rollouts.json.gz": base64.b64encode(dumps(honest_rollouts(bare, self.cfg))).decode(),
                 "submission.json": base64.b64encode(submission_record(bare).to_json()).decode()}
        return json.dumps({"data": [lease, files, None]}).encode()

    def upload(self, body: bytes) -> float:
        t0 = time.perf_counter()
        answer = self.http.post("/hubgrpo/api/upload", content=body, headers={"Content-Type": "application/json"})
        wall = time.perf_counter() - t0
        result = answer.json()
        if not result.get("ok") or result["result"].get("status") != "admitted":
            raise RuntimeError(f"upload: HTTP {answer.status_code} {str(result)[:500]}")
        return wall


class Probe:
    """``status`` asked every 50 ms from another client while the block runs: what uploads cost the other calls."""

    def __init__(self, url: str):
        self.url, self.lat, self.stop = url, [], threading.Event()
        self.thread = threading.Thread(target=self._ask, daemon=True)

    def _ask(self) -> None:
        import httpx

        with httpx.Client(base_url=self.url, timeout=60) as http:
            while not self.stop.is_set():
                t0 = time.perf_counter()
                http.post("/hubgrpo/api/status", json={"data": [None]})
                self.lat.append(time.perf_counter() - t0)
                self.stop.wait(0.05)

    def __enter__(self) -> "Probe":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(10)


def sequential(rounds: Rounds, pid: int, n: int) -> dict:
    walls, cpu = [], 0.0
    with Probe(str(rounds.http.base_url)) as probe:
        for _ in range(n):
            body = rounds.body(rounds.lease())
            c0 = cpu_seconds(pid)
            walls.append(rounds.upload(body))
            cpu += cpu_seconds(pid) - c0
    total = sum(walls)
    return {"rounds": n, "wall_s": pct(walls), "mb_per_s": round(n * rounds.adapter_mb / total, 1),
            "rounds_per_s": round(n / total, 2), "cpu_s_per_round": round(cpu / n, 3),
            "cpu_s_per_mb": round(cpu / (n * rounds.adapter_mb), 4), "body_mb": round(len(body) / MB, 1),
            "status_while_uploading": pct(probe.lat)}


def concurrent(rounds: Rounds, pid: int, conc: int, n: int) -> dict:
    bodies = [rounds.body(rounds.lease()) for _ in range(n)]
    with Probe(str(rounds.http.base_url)) as probe:
        c0, t0 = cpu_seconds(pid), time.perf_counter()
        with ThreadPoolExecutor(conc) as pool:
            walls = list(pool.map(rounds.upload, bodies))
        wall, cpu = time.perf_counter() - t0, cpu_seconds(pid) - c0
    return {"rounds": n, "in_flight": conc, "wall_s": pct(walls), "rounds_per_s": round(n / wall, 2),
            "mb_per_s": round(n * rounds.adapter_mb / wall, 1), "cpu_s_per_mb": round(cpu / (n * rounds.adapter_mb), 4),
            "server_cpu_utilisation": round(cpu / wall, 2), "status_while_uploading": pct(probe.lat)}


def downloads(rounds: Rounds, pid: int, n: int) -> dict:
    lease = rounds.lease()
    path = f"/hubgrpo/api/adapter/{lease['base_version']}/{lease['base_sha']}/adapter_model.safetensors"
    walls, cpu, size = [], 0.0, 0
    for _ in range(n):
        c0, t0 = cpu_seconds(pid), time.perf_counter()
        resp = rounds.http.get(path)
        walls.append(time.perf_counter() - t0)
        cpu += cpu_seconds(pid) - c0
        if resp.status_code != 200:
            return {"served": False, "status": resp.status_code, "answer": resp.text[:300]}
        size = len(resp.content)
    return {"served": True, "rounds": n, "mb": round(size / MB, 2), "wall_s": pct(walls),
            "mb_per_s": round(n * size / MB / sum(walls), 1), "cpu_s_per_mb": round(cpu / (n * size / MB), 4)}


def wire_cost(body: bytes, adapter_mb: float) -> dict:
    """In this process: seconds per MB of adapter to parse the body as the route does, and to decode base64."""
    from hubgrpo.space.routes import parse_arguments

    t0 = time.process_time()
    data = parse_arguments(body)
    t1 = time.process_time()
    for text in data[1].values():
        base64.b64decode(text, validate=True)
    t2 = time.process_time()
    return {"parse_s_per_mb": round((t1 - t0) / adapter_mb, 4), "b64decode_s_per_mb": round((t2 - t1) / adapter_mb, 4)}


def start_coordinator(repo: Path, work: Path) -> tuple[subprocess.Popen, str]:
    import httpx

    from hubgrpo.space.api import free_port

    port = free_port()
    env = dict(os.environ, HUBGRPO_CACHE=str(work / "cache"), HUBGRPO_SECRET="upload-route", OMP_NUM_THREADS="1",
               GRADIO_ANALYTICS_ENABLED="False")
    proc = subprocess.Popen([str(Path(sys.executable).with_name("hubgrpo")), "coordinator", "--repo", str(repo),
                             "--port", str(port), "--quiet"], env=env, stdout=open(work / "coordinator.log", "wb"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    url, end = f"http://127.0.0.1:{port}", time.time() + 180
    while time.time() < end and proc.poll() is None:
        try:
            if httpx.post(f"{url}/hubgrpo/api/status", json={"data": [None]}, timeout=5).is_success:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError((work / "coordinator.log").read_text(errors="replace")[-3000:])


def measure(name: str, args, tmp: Path) -> dict:
    work = tmp / name
    work.mkdir()
    repo, weights, config = init_run(work, name)
    proc, url = start_coordinator(repo, work)
    try:
        rounds = Rounds(url, repo, weights, config)
        rounds.upload(rounds.body(rounds.lease()))  # warm-up: the first admission loads what the rest reuse
        out = {"adapter_mb": round(rounds.adapter_mb, 2), "lora_params": len(weights) // 4,
               "sequential": sequential(rounds, proc.pid, args.seq),
               "concurrent": concurrent(rounds, proc.pid, args.conc, args.conc_rounds),
               "downloads": downloads(rounds, proc.pid, args.seq),
               "wire": wire_cost(rounds.body(rounds.lease()), rounds.adapter_mb)}
        box = work / "cache" / "rounds"
        out["box_rounds"] = sum(1 for _ in box.rglob("submission.json"))
        return out
    finally:
        os.killpg(proc.pid, 9)
        proc.wait(30)


def next_limit(name: str, r: dict) -> dict:
    """What 64 workers with 60-s rounds ask of the route, against what was measured."""
    need_rounds = FLEET / ROUND_S
    need_mb = need_rounds * r["adapter_mb"]
    return {"rounds_per_s_needed": round(need_rounds, 2), "mb_per_s_needed": round(need_mb, 1),
            "wire_mb_per_s_needed": round(need_mb * 4 / 3, 1),
            "server_cores_needed": round(need_mb * r["concurrent"]["cpu_s_per_mb"], 2),
            "rounds_per_s_measured": r["concurrent"]["rounds_per_s"],
            "workers_at_60s_rounds": int(r["concurrent"]["rounds_per_s"] * ROUND_S),
            "met": r["concurrent"]["rounds_per_s"] >= need_rounds}


def _p99(phase: dict) -> str:
    st = phase["status_while_uploading"]
    return f"{st['p99_ms']:.0f} ms" if st.get("n") else "– (no `status` call fell inside an upload)"


def _ms(phase: dict) -> str:
    st = phase["status_while_uploading"]
    if not st.get("n"):  # every upload ended before the probe's first call (small adapters)
        return "–"
    return f"{st['p50_ms']:.0f} / {st['p99_ms']:.0f} / {st['max_ms']:.0f}"


def report(res: dict) -> str:
    lines = ["# Rounds through the coordinator's upload route (`hub.submissions: coordinator`)", "",
             "Real HTTP on 127.0.0.1: `hubgrpo coordinator` in its own process (one torch thread), this process the "
             "client. Each round: the JSON + base64 body `CoordinatorClient.upload` sends; the coordinator parses "
             "it, decodes it, puts it in its box (a folder under `$HUBGRPO_CACHE/rounds`), reads it back and runs "
             "every admission check (rewards recomputed). No merge during the measurement. Adapter: fp32 LoRA "
             "factors, r = 16 on all linear layers; MB = 10⁶ bytes.", "",
             "| adapter | LoRA params (PEFT, meta device) | adapter MB | body MB | one at a time: s per round "
             "(p50) | MB/s | `status` meanwhile p50 / p99 / max ms | 4 in flight: rounds/s | MB/s | `status` "
             "meanwhile p50 / p99 / max ms | coordinator CPU s per MB | of it: JSON parse + base64 (s/MB) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in res["models"].items():
        s, c, w = r["sequential"], r["concurrent"], r["wire"]
        lines.append(f"| {name} | {r['lora_params']:,} ({r['peft_lora_params']:,}) | {r['adapter_mb']} | {s['body_mb']} "
                     f"| {s['wall_s']['p50_ms'] / 1e3:.2f} | {s['mb_per_s']} | {_ms(s)} | {c['rounds_per_s']} "
                     f"| {c['mb_per_s']} | {_ms(c)} | {c['cpu_s_per_mb']} "
                     f"| {w['parse_s_per_mb'] + w['b64decode_s_per_mb']:.4f} |")
    lines += ["", "Downloads of a version's adapter from the coordinator (`GET /hubgrpo/api/adapter/…`, one at a time):",
              "", "| adapter | MB/s | coordinator CPU s per MB |", "|---|---|---|"]
    for name, r in res["models"].items():
        d = r["downloads"]
        lines.append(f"| {name} | {d.get('mb_per_s', 'not served: ' + str(d.get('status')))} | "
                     f"{d.get('cpu_s_per_mb', '-')} |")
    lines += ["", f"## Where the next limit is: {FLEET} workers with {ROUND_S:.0f}-s rounds", "",
              "| adapter | rounds/s needed | adapter MB/s needed (wire, base64) | coordinator cores needed for "
              "uploads | rounds/s measured (4 in flight) | workers with 60-s rounds it holds | met |",
              "|---|---|---|---|---|---|---|"]
    for name, r in res["models"].items():
        n = r["next_limit"]
        lines.append(f"| {name} | {n['rounds_per_s_needed']} | {n['mb_per_s_needed']} ({n['wire_mb_per_s_needed']}) "
                     f"| {n['server_cores_needed']} | {n['rounds_per_s_measured']} | {n['workers_at_60s_rounds']} "
                     f"| {'yes' if n['met'] else 'no'} |")
    lines += ["", *verdict(res["models"]), "", *res["notes"], ""]
    return "\n".join(lines)


def verdict(models: dict) -> list[str]:
    """The limits, read off the figures."""
    out = ["What limits this route:"]
    for name, r in models.items():
        n, s, w = r["next_limit"], r["sequential"], r["wire"]
        wire = (w["parse_s_per_mb"] + w["b64decode_s_per_mb"]) / r["concurrent"]["cpu_s_per_mb"]
        out.append(f"- {name} ({r['adapter_mb']} MB): {FLEET} workers with {ROUND_S:.0f}-s rounds need "
                   f"{n['server_cores_needed']} of the coordinator's cores for uploads alone (a Space has 2 vCPU, "
                   f"shared with leases, merges and downloads); the JSON + base64 wire format is {wire:.0%} of that "
                   f"CPU; while one upload is in flight `status` answers in {_p99(s)}"
                   f" at p99 (the issue's target for every call: 100 ms).")
    out.append("- So the next limit is not the Hub's quota but one machine: its CPU per MB (about 60 MB of adapter "
               "per core-second) and the stall of each upload, whose body is parsed on the event loop and decoded "
               "holding the GIL (together about as long as the stall measured). A binary upload streamed to the box "
               "(no JSON, no base64) would remove both and that share of the CPU; past one machine, rounds go to an S3 box (presigned uploads: the "
               "coordinator reads each round once, never receives it).")
    return out


NOTES = [
    "Reading the figures:",
    "- Every round also costs the coordinator at least one download of the version it trains on (more with "
    "`merge.rebase`, which fetches each newer version between steps): the traffic out is at least the traffic in.",
    "- The body is parsed on the server's event loop (`routes.read_body` + `parse_arguments`), so while a large "
    "body is parsed no other call is answered: the `status` column shows what an upload costs the other calls.",
    "- Loopback has no network limit: on a Space the coordinator's CPU (2 vCPU on the free tier) and its inbound "
    "bandwidth both bound this route; the CPU per MB above is the figure that carries over.",
]


def headline(models: dict) -> str:
    return "one upload in flight: `status` p99 " + ", ".join(
        f"{_p99(r['sequential'])} ({name}, {r['adapter_mb']} MB)"
        for name, r in models.items()) + "; the target is 100 ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="demo,0.5b,1.5b")
    ap.add_argument("--seq", type=int, default=6, help="uploads one at a time (and downloads)")
    ap.add_argument("--conc", type=int, default=4, help="uploads in flight")
    ap.add_argument("--conc-rounds", type=int, default=12, help="uploads in the concurrent phase")
    ap.add_argument("--report-only", action="store_true", help="rewrite the .md from the .json")
    options(ap, __file__)
    args = ap.parse_args()
    if args.quick:  # a check of the script: a small adapter, a few uploads
        args.models, args.seq, args.conc, args.conc_rounds = "small", 2, 2, 2
    args.results = results_dir(args, __file__)
    if args.report_only:
        res = json.loads((args.results / "upload_route.json").read_text())
        (args.results / "upload_route.md").write_text(report(res))
        return
    meta = start(args.quick)
    models = {}
    with tempfile.TemporaryDirectory(prefix="hubgrpo-upload-route-") as tmp:
        for name in args.models.split(","):
            r = measure(name, args, Path(tmp))
            r["lora_params"] = sum(RANK * (o + i) for o, i in shapes(name).values())
            r["peft_lora_params"] = peft_lora_params(name)
            r["next_limit"] = next_limit(name, r)
            models[name] = r
            print(name, json.dumps(r), flush=True)
    res = {"models": models, "notes": NOTES}
    write(args.results, "upload_route", res, report(res), meta, headline(models))
    print(report(res))


if __name__ == "__main__":
    main()
