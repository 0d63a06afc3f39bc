"""The "Current figures" table at the top of benchmarks/README.md: each question's headline, from its current results.

    python benchmarks/figures.py           # rewrite the table between the README's markers
    python benchmarks/figures.py --check   # exit 1 when the table is not the one the results give

A question is a folder of ``benchmarks/``; ``QUESTIONS`` names the result(s) that answer it today. The headline,
date and commit come from each result's JSON (``"headline"`` and ``"meta"``, written by ``common.write``). A new
result becomes current when its name replaces the old one here (or when it is written under the same name).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
README = HERE / "README.md"
START, END = "<!-- figures:start (python benchmarks/figures.py) -->", "<!-- figures:end -->"
QUESTIONS = [  # folder, the question, the current result(s) that answer it
    ("speedup", "How much sooner do 2 real machines reach a training target than one process?",
     ["speedup-real-addition-mixed-fleet15", "speedup-real-addition-mixed-amd", "speedup-real-addition-mixed-shipped", "speedup-real-addition-mixed-piped", "speedup-real-addition-mixed",
      "speedup-real-demo-amd", "speedup-real-demo-fleet15",
      "speedup-real-demo-lr1e4-piped", "speedup-real-demo-lr1e4", "speedup-real-demo-piped-move", "speedup-real-demo-piped", "speedup-real-demo-nice",
      "speedup-real-demo-seq", "side-by-side-demo", "side-by-side-addition-mixed", "speedup-real-demo",
      "speedup-real-quota"]),
    ("scaleout", "How does the speed-up grow with N machines (simulated)?",
     ["scaleout-mixed-sched", "scaleout-mixed-sched-s0", "scaleout-mixed-sched-s1", "scaleout-mixed-sched-s2",
      "scaleout-mixed-sched-n8-s2", "scaleout-mixed-sched-n2-s0", "scaleout-mixed-sched-n2-s1",
      "scaleout-mixed-sched-n2-s2", "scaleout-mixed-outer15", "scaleout-mixed-fleet15-n2",
      "scaleout-mixed-default-full-n4-s1", "scaleout-mixed-fleet15-n2-s0", "scaleout-mixed-fleet15-n2-s1",
      "scaleout-mixed-fleet15-n2-s2", "scaleout-mixed-close", "scaleout-mixed-recheck-s1", "scaleout-mixed-fedasync",
      "scaleout-mixed-fedbuff-sqrt", "scaleout-mixed-outer15-fair-n4", "scaleout-mixed-outer15-fair-n8",
      "scaleout-mixed-outer15-n4", "scaleout-mixed-outer15-n8", "scaleout-mixed-outer15-s1",
      "scaleout-mixed-outer15-s2", "scaleout-mixed", "scaleout-smollm2-shipped", "scaleout-smollm2-quota"]),
    ("simulator", "Does the simulator reproduce the real 2-machine runs?", ["scaleout-validate-replay6-validate"]),
    ("learning", "Does a fleet learn as much per sample as one process?",
     ["learning-mixed-fleetdecay-pooled", "learning-mixed-fleet15-pooled", "learning-mixed-close-pooled", "learning-mixed-pooled", "learning-full-b4-pooled", "learning-b4-tiny-pooled"]),
    ("merge", "How long does a merge keep the next version waiting?", ["merge_latency-sweep"]),
    ("load", "How many workers does one coordinator serve?", ["coordinator_load-hub", "coordinator_load"]),
    ("round", "How fast is a worker's step, and what does coordination cost a round?",
     ["sharing-demo-speed", "generate-options", "profile-step-live-io", "profile-step-peft-io", "profile-step", "overhead-addition-mixed",
      "overhead-demo-seq", "overhead-demo-nice5-r1", "overhead-demo-nice5-r2", "overhead-demo-nice0-r1",
      "overhead-demo-nice0-r2", "overhead-demo"]),
    ("soak", "What does a long run leave in the repo and on disks?", ["soak"]),
    ("restart", "What does a coordinator killed at any moment lose?", ["restart-loss"]),
    ("gpu", "Do rounds and merges run on a GPU?", ["gpu_smoke"]),
    ("task", "Which built-in task keeps SmolLM2 learning for hundreds of steps?",
     ["task-headroom-close-lr-s0", "task-headroom-close-lr-s1", "task-headroom-close-lr-s2",
      "task-headroom-close-s1", "task-headroom-close-s2", "task-headroom", "task-headroom-s1", "task-headroom-s2",
      "task-headroom-lr-s1"]),
    ("proof", "Can a verifier show that the leased policy wrote a round's completions?",
     ["proof-smollm2-other-cpu", "proof-smollm2-long-other-cpu",
      "proof-smollm2-long-other-cpu-s1", "proof-smollm2-long-s1", "proof-smollm2-long-2", "proof-smollm2-long", "proof-smollm2-long-bf16",
      "proof-smollm2-far", "proof-smollm2-bf16", "proof-smollm2", "proof-tiny"]),
]


def rows() -> list[str]:
    out = ["| question | headline | date | commit | result |", "|---|---|---|---|---|"]
    for folder, question, names in QUESTIONS:
        if not names:
            scripts = ", ".join(f"`{p.name}`" for p in sorted((HERE / folder).glob("*.py")))
            out.append(f"| [{folder}]({folder}/): {question} | not measured yet ({scripts}) | – | – | – |")
            continue
        for name in names:
            result = json.loads((HERE / folder / "results" / f"{name}.json").read_text())
            meta = result["meta"]
            date = (meta.get("date") or "?")[:10]
            out.append(f"| [{folder}]({folder}/): {question} | {result['headline']} | {date} | "
                       f"{meta.get('commit') or '?'} | [{name}]({folder}/results/{name}.md) |")
    return out


def render(text: str) -> str:
    """``text`` with the table between the markers replaced."""
    if START not in text or END not in text:
        raise SystemExit(f"{README} has no {START} … {END} block")
    head, rest = text.split(START, 1)
    tail = rest.split(END, 1)[1]
    return head + START + "\n" + "\n".join(rows()) + "\n" + END + tail


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the README's table is stale")
    args = ap.parse_args()
    text = README.read_text()
    new = render(text)
    if args.check:
        if new != text:
            print("benchmarks/README.md: the Current figures table is stale: run python benchmarks/figures.py",
                  file=sys.stderr)
            return 1
        return 0
    README.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
