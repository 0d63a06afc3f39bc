"""The Hub's commit quota in the speed-up benchmarks (``scaleout.py --commit-quota N|off|both``).

``hubgrpo simulate`` holds the run repo to the Hub's quota (128 commits per rolling virtual hour by default) and
sets the coordinator's budget to it; ``both`` runs every fleet under the quota and with free commits, and
``quota_ratios`` gives, per seed, the fleet's time to target with free commits over its time under the quota:
its speed-up under the quota as a fraction of its free-commit speed-up (both against the same N = 1 reference).
The issue's target is >= 0.9.
"""

from __future__ import annotations

import statistics

HUB_QUOTA = "128"
TARGET_RATIO = 0.9
# where rounds go: through the coordinator (``hub.submissions: coordinator``, what a Hub-only run uses; the
# simulation keeps the box in its own folder), or one commit of the run repo each
ROUNDS = {"box": ["hub.submissions=coordinator"], "repo": []}


def parse_quotas(spec: str) -> list[str]:
    """``--commit-quota``: ``both`` → the Hub's quota and off; else the one value (N or off)."""
    spec = str(spec).strip().lower()
    if spec == "both":
        return [HUB_QUOTA, "off"]
    if spec == "off" or (spec.isdigit() and int(spec) > 0):
        return [spec]
    raise SystemExit(f"--commit-quota {spec!r}: use a number of commits an hour, off, or both")


def quota_ratios(seeds: list[dict]) -> list[dict]:
    """Per (fleet, N) run under a quota and with free commits: time to target free / under the quota, per seed."""
    out = []
    keys = sorted({(r["fleet"], r["workers"], r["quota"]) for s in seeds for r in s["rows"]
                   if r.get("quota", "off") != "off" and r["workers"] > 1})
    for fleet, n, quota in keys:
        per_seed = {}
        for s in seeds:
            mine = {r.get("quota", "off"): r for r in s["rows"] if (r["fleet"], r["workers"]) == (fleet, n)}
            held, free = mine.get(quota), mine.get("off")
            if held and free and held["time_to_target_s"] and free["time_to_target_s"]:
                per_seed[s["seed"]] = free["time_to_target_s"] / held["time_to_target_s"]
            elif held and free:
                per_seed[s["seed"]] = None  # one of them did not reach the target
        ratios = [x for x in per_seed.values() if x is not None]
        out.append({"fleet": fleet, "workers": n, "quota": quota, "ratio_per_seed": per_seed,
                    "ratio_mean": statistics.mean(ratios) if ratios else None,
                    "met": bool(ratios) and len(ratios) == len(per_seed) and min(ratios) >= TARGET_RATIO})
    return out


def quota_sentence(report: dict) -> str:
    quotas = report["args"].get("quotas") or ["off"]
    said = " and ".join("free commits (quota off)" if q == "off" else f"the Hub's quota of {q} commits per rolling "
                        "virtual hour on the run repo (the coordinator's budget the same)" for q in quotas)
    rounds = report["args"].get("rounds", "repo")
    return (f"Commits: {said}; rounds {'off the commit path (hub.submissions)' if rounds == 'box' else 'one commit each'}"
            f". Measured at commit {report.get('commit', '?')}; "
            + (f"N = 1 from {report['args']['reference_from']} (recorded earlier, free commits)."
               if report["args"].get("reference_from") else f"N = 1 ran with quota {quotas[0]}."))


def ratio_markdown(report: dict) -> list[str]:
    rows = report.get("quota_ratios") or []
    if not rows:
        return []
    lines = ["", f"Speed-up under the quota as a fraction of the free-commit speed-up (time to target free / under "
             f"the quota; target >= {TARGET_RATIO}):", "", "| fleet | N | quota | per seed | mean | met |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        seeds = " / ".join(f"s{k} " + ("–" if v is None else f"{v:.2f}×") for k, v in r["ratio_per_seed"].items())
        mean = "–" if r["ratio_mean"] is None else f"{r['ratio_mean']:.2f}×"
        lines.append(f"| {r['fleet']} | {r['workers']} | {r['quota']} | {seeds} | {mean} | {'yes' if r['met'] else 'no'} |")
    return lines


def combine(paths: list, name: str) -> str:
    """One report over several ``scaleout.py`` results (e.g. one per seed and N): their rows, the summary and the
    ratios over all seeds; benchmarks/results/<name>.{md,json}; the markdown."""
    import json
    from pathlib import Path

    from benchmarks.scaleout import RESULTS, summarise, to_markdown

    runs = [json.loads(Path(p).read_text()) for p in paths]
    seeds = {}
    for run in runs:  # rows of the same seed from several runs (N = 4, N = 8) go together; N = 1 once
        for s in run["seeds"]:
            mine = seeds.setdefault(s["seed"], {**s, "rows": []})
            have = {(r["fleet"], r["workers"], r.get("quota", "off")) for r in mine["rows"]}
            mine["rows"] += [r for r in s["rows"] if (r["fleet"], r["workers"], r.get("quota", "off")) not in have]
    first = runs[0]
    report = {**first, "name": name, "seeds": [seeds[k] for k in sorted(seeds)], "combined_from": [str(p) for p in paths],
              "commit": ", ".join(sorted({r.get("commit", "?") for r in runs}))}
    report["args"] = {**first["args"], "seeds": ",".join(str(k) for k in sorted(seeds)), "reference_from": ", ".join(
        sorted({str(r["args"]["reference_from"]) for r in runs if r["args"].get("reference_from")})) or None}
    report["summary"], report["quota_ratios"] = summarise(report["seeds"]), quota_ratios(report["seeds"])
    md = to_markdown(report)
    (RESULTS / f"{name}.json").write_text(json.dumps(report, indent=1, default=str))
    (RESULTS / f"{name}.md").write_text(md)
    return md


if __name__ == "__main__":
    import argparse
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    ap = argparse.ArgumentParser(description="one report over several scaleout.py --commit-quota results")
    ap.add_argument("--runs", nargs="+", required=True)
    ap.add_argument("--name", required=True)
    a = ap.parse_args()
    print(combine(a.runs, a.name))
