"""The report of ``coordinator_load.py --modes hub`` (``load_hub.py``): the target's verdict, latencies per endpoint,
refusals by code, versions, the Hub commits an hour, the machine's load, and where the next limit is (this run's
CPU per round combined with ``upload_route.py``'s CPU per MB for larger adapters)."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.load.load_fleet import HUB_ENDPOINTS

LIMIT_MS = 100.0
ROUND_MB = 1.75  # the synthetic adapter every mode of coordinator_load.py builds (coordinator_load.make_adapter)
UPLOAD_ROUTE = Path(__file__).resolve().parent / "results" / "upload_route.json"


def refusals(r: dict) -> dict:
    """Refusals the fleet was answered, by endpoint and code."""
    return {k: v for k, v in r["outcomes"].items() if "_refused_" in k}


def verdict(r: dict, hour_s: float = 3600.0) -> tuple[bool, list[str]]:
    """Met or not, and why: every p99 within 100 ms, no `budget` refusal, nothing lost or merged twice, no 429 of
    the quota, a window of an hour."""
    why = []
    for k in HUB_ENDPOINTS:
        lat = r["latency"].get(k, {})
        if not lat.get("n") and k == "verdict":
            continue  # polled only while an upload answers `checking`: every upload answered its verdict itself
        if not lat.get("n"):
            why.append(f"no {k} call measured")
        elif lat["p99_ms"] > LIMIT_MS:
            why.append(f"{k} p99 {lat['p99_ms']} ms > {LIMIT_MS:.0f} ms")
    budget = sum(v for k, v in refusals(r).items() if k.endswith("_refused_budget"))
    if budget:
        why.append(f"{budget} `budget` refusal(s)")
    if r["lost"] or r["duplicates_merged"]:
        why.append(f"lost {r['lost']}, merged twice {r['duplicates_merged']}")
    q429 = r["commits"]["emulator_at_end"].get("quota_429", 0)
    if q429:
        why.append(f"{q429} commit(s) answered 429 by the quota")
    span = r["window"][1] - r["window"][0]
    if span < hour_s:
        why.append(f"measured {span / 60:.0f} min, not an hour")
    return not why, why


def _lat_rows(r: dict) -> list[str]:
    rows = ["| call | n | p50 ms | p99 ms | max ms | p99 ≤ 100 ms |", "|---|---|---|---|---|---|"]
    for k in (*HUB_ENDPOINTS, "submit_to_verdict", "loop_lag"):
        lat = r["latency"].get(k, {})
        ok = "" if k in ("submit_to_verdict", "loop_lag") else ("yes" if lat.get("n") and lat["p99_ms"] <= LIMIT_MS
                                                                 else "no")
        if k == "verdict" and not lat.get("n"):
            ok = "not needed: every upload answered with its verdict"
        rows.append(f"| {k} | {lat.get('n', 0)} | {lat.get('p50_ms', '-')} | {lat.get('p99_ms', '-')} | "
                    f"{lat.get('max_ms', '-')} | {ok} |")
    return rows


def load_summary(r: dict) -> str:
    mins = [m["loadavg"][0] for m in r["per_minute"]]
    if not mins:
        return "no sample"
    return (f"1-min load average over {len(mins)} samples (one a minute): min {min(mins):.2f}, mean "
            f"{sum(mins) / len(mins):.2f}, max {max(mins):.2f} on {r.get('cpus', 2)} CPUs")


def next_limit(r: dict, rounds_per_s: float) -> list[str]:
    """Where the next limit is: the coordinator's CPU per round (measured here at 1.75 MB) grown by upload_route's
    CPU per MB (uploads and downloads) for the real adapters; bandwidth; the upload's stall; the quota."""
    per_round = r["rounds"]["server_cpu_s_per_round"]
    c = r["commits"]
    out = ["## Where the next limit is", ""]
    out.append(f"- The quota: {c['per_hour']} commits an hour of the run repo were measured (checkpoints "
               f"{c['per_hour_by_kind'].get('checkpoint')}, anything else {c['per_hour_by_kind'].get('other')}), "
               f"against the emulator's quota of {r['quota']} and the coordinator's budget of {r['budget']}: the "
               "commits do not grow with the fleet (rounds and versions make none), so the quota is not the next "
               "limit at any fleet size; what it bounds is how often a checkpoint lands (at most every "
               f"{r['checkpoint_interval_s']:.0f} s here), i.e. what a restart can lose.")
    if not per_round:
        return out + ["- (no upload measured: no CPU per round)"]
    out.append(f"- The coordinator's CPU: {r['server_cpu_cores']} cores for {rounds_per_s:.2f} rounds/s, i.e. "
               f"{per_round:.3f} CPU-s per round (lease, heartbeat, upload with its admission checks, verdict, the "
               f"adapter download, its share of merges and checkpoints) with the {ROUND_MB} MB synthetic adapter "
               f"— one core holds {60 / per_round:.0f} workers with 60-s rounds of that size.")
    if UPLOAD_ROUTE.is_file():
        up = json.loads(UPLOAD_ROUTE.read_text())
        out += ["", "Combined with `benchmarks/results/upload_route.md` (CPU per MB of the upload route and the "
                "adapter route, measured one at a time / 4 in flight): CPU per round ≈ this run's "
                f"{per_round:.3f} s + (adapter MB − {ROUND_MB}) × (upload + download CPU-s per MB); a round also "
                "downloads the new version (one per round: versions change faster than rounds here).", "",
                "| adapter | MB | CPU-s per round | cores for 64 workers × 60-s rounds | workers per core at 60-s "
                "rounds | MB/s in (base64 wire) + out for 64 workers | an upload's parse + decode, s (stalls "
                "the event loop) | `status` p99 ms while one upload is in flight (upload_route) |",
                "|---|---|---|---|---|---|---|---|"]
        for name, m in up["models"].items():
            mb = m["adapter_mb"]
            per_mb = m["concurrent"]["cpu_s_per_mb"] + m["downloads"].get("cpu_s_per_mb", 0)
            cpu = per_round + (mb - ROUND_MB) * per_mb
            wire = (m["wire"]["parse_s_per_mb"] + m["wire"]["b64decode_s_per_mb"]) * mb
            out.append(f"| {name} | {mb} | {cpu:.3f} | {64 / 60 * cpu:.2f} | {60 / cpu:.0f} | "
                       f"{64 / 60 * mb * 4 / 3:.1f} + {64 / 60 * mb:.1f} | {wire:.3f} | "
                       f"{m['sequential']['status_while_uploading']['p99_ms']:.0f} |")
    out += ["", "- Bandwidth: measured here "
            f"{r['rounds']['mb_up_per_s']} MB/s in and {r['rounds']['mb_down_per_s']} MB/s out (loopback); the table "
            "gives it for the real adapters: a Space's network, not loopback, then bounds it."]
    return out


def headline(res: dict) -> str:
    """The first fleet: its p99s and the Hub commits an hour."""
    r = res["runs"][0]
    p99 = ", ".join(f"{k} {r['latency'][k]['p99_ms']:.0f} ms" for k in HUB_ENDPOINTS if r["latency"].get(k, {}).get("n"))
    return (f"Hub-only run, {r['workers']} workers under the commit quota: p99 {p99}; "
            f"{r['commits']['per_hour']} Hub commits an hour; {r['lost']} rounds lost")


def to_markdown(res: dict) -> str:
    a = res["args"]
    lines = [f"# Hub-only run under the commit quota: {a.get('hub_workers')} workers, {a['round_s']:.0f}-s rounds",
             ""]
    for r in res["runs"]:
        lines += run_section({**r, "quota": a["commit_quota"], "budget": a["hub_budget"]}, a)
    return "\n".join(lines) + "\n"


def run_section(r: dict, a: dict) -> list[str]:
    """One fleet size: the verdict, the setup, latencies, refusals, rounds, commits, CPU, the next limit, the load."""
    lines: list[str] = []
    met, why = verdict(r)
    span = r["window"][1] - r["window"][0]
    rps = r["rounds"]["uploads_per_s"]
    lines += [f"## {r['workers']} workers: target {'MET' if met else 'NOT MET'}" + ("" if met else
              f" ({'; '.join(why)})"), "",
              f"Measured over {span / 60:.1f} min after one round of warm-up. {load_summary(r)}.", "",
              "Setup: the Hub emulator (`tests/support/hub_emulator.py`, its own process) with the commit quota on: "
              f"**{a['commit_quota']} commits per repo per rolling hour**; the run repo there; "
              "`hub.submissions: coordinator` (no S3); the coordinator app (`hubgrpo.space.api.serve`, plain "
              "routes) in its own process; the open-loop fleet in another (asyncio, raw HTTP). Config as "
              f"`hubgrpo init` fits it: merge ffa, quorum {a['hub_quorum']}, max_staleness 8, commit budget "
              f"{a['hub_budget']}/hour, checkpoint every {r['checkpoint_interval_s']:.0f} s"
              + (f" (init: {'; '.join(r['init_changes'])})" if r["init_changes"] else "") + ". "
              f"Each worker per round: lease, the leased version from the adapter route (both files, once "
              f"per adapter id), a heartbeat every {a['beat_s']:.0f} s, the round through `upload` (JSON "
              "{name: base64}: a pre-built synthetic adapter — r = 16 on q_proj/v_proj of 8 layers of width "
              f"896, fp32, {ROUND_MB} MB, not a real model's: see the next-limit table — with honest rollouts "
              "whose rewards the coordinator recomputes), verdict polled while `checking`.", ""]
    lines += _lat_rows(r)
    refs = refusals(r)
    lines += ["", "Refusals answered to the fleet, by call and code: "
              + (", ".join(f"{k} {v}" for k, v in sorted(refs.items())) or "none")
              + f" (`budget`: {sum(v for k, v in refs.items() if k.endswith('_refused_budget'))}). "
              "Rounds refused at admission, by reason: "
              + (", ".join(f"{k} {v}" for k, v in r["refusals_at_coordinator"].items()) or "none") + ".", "",
              f"Rounds: delivered {r['delivered']}, merged {r['merged']}, refused {r['refused']}, pending at "
              f"end {r['pending_at_end']}, lost {r['lost']}, merged twice {r['duplicates_merged']}; "
              f"{rps} uploads/s in the window. Versions merged: {r['versions']} (last checkpoint "
              f"{(r.get('final_checkpoint') or {}).get('version')}). Outcomes: "
              + ", ".join(f"{k} {v}" for k, v in r["outcomes"].items()) + ".", ""]
    c = r["commits"]
    lines += [f"Hub commits (counted at the emulator): **{c['per_hour']} an hour** in the window "
              f"({c['in_window']} in {span / 60:.1f} min: checkpoints {c['in_window_by_kind']['checkpoint']}, "
              f"anything else {c['in_window_by_kind']['other']}; the emulator's own counter: "
              f"{c['emulator_applied_in_window']} applied in the window); {c['all']} in the repo's history in all "
              f"(init included); the quota's 429s: {c['emulator_at_end'].get('quota_429', 0)}. Other commits: "
              + ("; ".join(f"`{m}`" for m in c["other_messages"]) or "none") + ".", "",
              f"CPU: coordinator {r['server_cpu_cores']} cores ({r['server_cpu_ms_per_call']} ms per call, "
              f"{r['rounds']['server_cpu_s_per_round']} s per round), Hub emulator {r['hub_cpu_cores']} cores, "
              f"fleet {r['generator_cpu_cores']} cores; GC pauses ≥ 10 ms in the coordinator: "
              f"{r['server_gc_pauses']}. Busiest processes mid-window: "
              + "; ".join(f"`{p}`" for p in r["busiest_processes"]) + ".", ""]
    lines += next_limit(r, rps)
    lines += ["", "Load average (1, 5, 15 min) and the coordinator's version / checkpoint, one sample a minute:",
              "", "| min | load | version | checkpoint | pending | Hub commits applied | 429s |",
              "|---|---|---|---|---|---|---|"]
    t0 = r["per_minute"][0]["t"] if r["per_minute"] else 0
    for m in r["per_minute"]:
        h = m.get("hub") or {}
        lines.append(f"| {(m['t'] - t0) / 60:.0f} | {' / '.join(f'{x:.2f}' for x in m['loadavg'])} | "
                     f"{m.get('version', m.get('status_error', '-'))} | {m.get('checkpoint', '-')} | "
                     f"{m.get('pending', '-')} | {h.get('commits_applied', '-')} | {h.get('quota_429', '-')} |")
    return lines
