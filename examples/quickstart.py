"""hubgrpo from Python, end to end, on the tiny built-in model (CPU, about a minute, offline).

    python examples/quickstart.py [WORKDIR]

1. init a run (a local folder as the bucket; ``user/name`` would be a Hub repo, with HF_TOKEN set),
2. run it with a coordinator and 2 worker processes on this machine until 3 versions are merged,
3. read the leaderboard and the versions,
4. push the last version as a standalone PEFT adapter with a model card (a local folder here; ``user/name`` on the
   Hub), and load it back to generate.
"""

import sys
import tempfile
from pathlib import Path

from hubgrpo import init_run, leaderboard, load_adapter, load_config, push_adapter, run_local, versions

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml"


def main(workdir: Path) -> dict:
    cfg = load_config(CONFIG, overrides=["rounds.versions=3", "rounds.steps=2"])
    repo = str(workdir / "run")                      # or "you/run1" on the Hub
    init_run(cfg, repo)
    status = run_local(cfg, repo, workers=2)         # returns when version 3 is merged
    print(f"run finished: version {status['version']} in {status['wall_s']:.0f} s")
    for row in leaderboard(repo):  # a worker whose rounds were all refused or not merged yet has no mean reward
        mean = "-" if row["mean_reward"] is None else f"{row['mean_reward']:.3f}"
        print(f"  {row['worker']:<10} rounds {row['accepted']}  mean reward {mean}")
    for v in versions(repo):
        reward = "-" if v["reward"] is None else f"{v['reward']:.3f}"
        print(f"  version {v['version']}: reward {reward}  contributors {', '.join(v['contributors']) or '-'}")
    adapter = str(workdir / "adapter")               # or "you/run1-adapter" on the Hub
    sha = push_adapter(repo, adapter)
    print(f"pushed the last version to {adapter} ({sha[:12]})")
    model, tokenizer = load_adapter(adapter)
    ids = tokenizer("What is 2 + 3?", return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    print("sample:", repr(tokenizer.decode(out[0, ids.shape[1]:])))
    return status


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="hubgrpo-quickstart-")))
