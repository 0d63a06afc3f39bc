"""What every benchmark shares: the repository root, the CLI in a subprocess, and the one result shape.

A result is ``<question>/results/<name>.json`` and ``.md``, written by ``write``::

    {"meta": {"script", "command", "commit", "date", "finished", "machine": {cpu, cores, python, torch, platform},
              "load": {"start": [1, 5, 15 min], "end": [...]}, "quick"},
     "headline": "one line: the figure this result stands for",
     ...what the script measured}

``start`` takes the meta when a benchmark begins (the commit it measures, the load before it); ``write`` adds the
end and writes both files (the markdown ends with the same meta in words). ``options`` gives every script
``--results DIR`` and ``--quick``: a quick run (the tiny model, a few steps) writes to a fresh temporary folder
unless ``--results`` names one, so it never replaces a kept result.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = "configs/tiny.yaml"


def hubgrpo(*args: str, env: dict | None = None) -> float:
    """Run the CLI (as a user would), with ``env`` added to this environment; seconds of wall time."""
    t0 = time.time()
    subprocess.run([sys.executable, "-m", "hubgrpo.cli", *args], check=True, cwd=ROOT,
                   stdout=subprocess.DEVNULL if os.environ.get("QUIET") else None,
                   env={**os.environ, **env} if env else None)
    return time.time() - t0


def sets(overrides: list[str]) -> list[str]:
    """``--set`` flags for config overrides."""
    return [x for o in overrides for x in ("--set", o)]


# part of every cached run's stamp: bump it when a default changes what a run does (its cached results go stale)
STAMP_EPOCH = 4


def _stamp(cmd: list) -> dict:
    """The command, the sha256 of its config (cmd[1]) as parsed with defaults left out, and ``STAMP_EPOCH``: a
    changed setting is another run; an edited comment, or a field the code gained with a default that leaves the run
    as it was, is not; a changed default is once ``STAMP_EPOCH`` is bumped."""
    from hubgrpo.config import load_config

    config = ROOT / str(cmd[1]) if len(cmd) > 1 else None
    digest = hashlib.sha256(load_config(config).model_dump_json(exclude_defaults=True).encode()).hexdigest() \
        if config and config.is_file() else None
    return {"command": [str(c) for c in cmd], "config_sha256": digest, "epoch": STAMP_EPOCH}


def epoch_of(meta: dict) -> int | None:
    """The ``STAMP_EPOCH`` a result was measured under: its meta's ``epoch``; for a result written before meta had
    one, the latest epoch whose bump (the commit that wrote ``STAMP_EPOCH = E``) its commit contains, read from
    git; None when neither says."""
    if isinstance(meta.get("epoch"), int):
        return meta["epoch"]
    commit = str(meta.get("commit") or "").removesuffix("+dirty")
    if not commit:
        return None
    for epoch in range(STAMP_EPOCH, 0, -1):
        bumps = subprocess.run(["git", "log", "--format=%H", "--reverse", "-S", f"STAMP_EPOCH = {epoch}", "--",
                                "benchmarks/common.py"], cwd=ROOT, capture_output=True, text=True).stdout.split()
        if bumps and subprocess.run(["git", "merge-base", "--is-ancestor", bumps[0], commit], cwd=ROOT,
                                               capture_output=True).returncode == 0:
            return epoch
    return None


def same_epoch(result: dict, source: str) -> None:
    """Stop the benchmark when ``result`` (read from ``source``, to be compared with runs of this code) was
    measured under another ``STAMP_EPOCH``: a default or the simulator has changed what a run does since."""
    epoch = epoch_of(result.get("meta") or {})
    if epoch != STAMP_EPOCH:
        sys.exit(f"{source} was measured under benchmarks/common.py STAMP_EPOCH {epoch or 'unknown'}, this code "
                 f"is at {STAMP_EPOCH}: a default or the simulator has changed what a run does since (bumped in "
                 "benchmarks/LOG.md's entries), so its runs are not comparable with this one's; measure it again")


def cached_run(out: Path, cmd: list, result_file: str) -> dict:
    """``hubgrpo CMD --output OUT`` (output silenced) unless ``out`` holds its result from the same command on
    the same config file contents (the runs are deterministic for a seed, so a long benchmark resumes); the result
    JSON, with ``real_wall_s`` when run."""
    stamp = out / "command.json"
    if (out / result_file).is_file() and stamp.is_file() and json.loads(stamp.read_text()) == _stamp(cmd):
        return json.loads((out / result_file).read_text())
    t0 = time.time()
    subprocess.run([sys.executable, "-m", "hubgrpo.cli", *map(str, cmd), "--output", str(out)], check=True, cwd=ROOT,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stamp.write_text(json.dumps(_stamp(cmd)))
    result = json.loads((out / result_file).read_text())
    result["real_wall_s"] = round(time.time() - t0, 1)
    return result


def simulate(out: Path, config: str, workers: int, seed: int, args: list[str], quota: str = "off") -> dict:
    """``hubgrpo simulate`` in a subprocess, under the commit quota ``quota`` (``--commit-quota``); its
    simulation.json (reused from an earlier run of the same command in the same ``out``)."""
    return cached_run(out, ["simulate", config, "--workers", str(workers), "--seed", str(seed), "--no-progress",
                            "--commit-quota", str(quota), *args], "simulation.json")


def local_hub() -> None:
    """For a process that talks to the Hub emulator on 127.0.0.1: no telemetry, no xet, and not offline (offline
    blocks loopback too). Call it before huggingface_hub is imported."""
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("HF_HUB_DISABLE_XET", "1")
    os.environ.pop("HF_HUB_OFFLINE", None)


def git_commit() -> str:
    """The commit measured: ``git rev-parse --short HEAD``, with ``+dirty`` when tracked files other than results
    have changes; in a copy of the tree without git (a GPU machine), ``$HUBGRPO_BENCH_COMMIT`` as the sender says."""
    def git(*a: str) -> str:
        try:
            return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        except OSError:  # no git on this machine
            return ""
    head = git("rev-parse", "--short", "HEAD")
    if not head:
        return os.environ.get("HUBGRPO_BENCH_COMMIT", "")
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)benchmarks/*/results/*")
    return head + ("+dirty" if dirty else "")


def machine() -> dict:
    """CPU model, cores, Python and torch versions (torch read from its metadata, not imported)."""
    cpu = platform.processor() or platform.machine()
    info = Path("/proc/cpuinfo")
    if info.is_file():
        cpu = next((line.split(":", 1)[1].strip() for line in info.read_text().splitlines()
                    if line.startswith("model name")), cpu)
    try:
        torch = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch = None
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "torch": torch,
            "platform": platform.platform()}


def utc(t: float | None = None) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t))


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def start(quick: bool = False) -> dict:
    """The meta of a run that starts now: this process's command line, the commit, date, machine and load."""
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    return {"script": str(shown), "command": " ".join(["python", str(shown), *sys.argv[1:]]),
            "commit": git_commit(), "epoch": STAMP_EPOCH, "date": utc(), "machine": machine(),
            "load": {"start": _load()},
            "quick": quick}


def footer(meta: dict) -> str:
    """The meta in words, as the last paragraph of a result's markdown."""
    m = meta.get("machine") or {}
    hw = ", ".join(str(x) for x in (m.get("cpu"), m.get("cores") and f"{m['cores']} cores",
                                    m.get("python") and f"Python {m['python']}",
                                    m.get("torch") and f"torch {m['torch']}") if x)
    load = meta.get("load") or {}
    said = " → ".join(f"{v[0]:.1f}" for v in (load.get("start"), load.get("end")) if v)
    parts = [f"commit {meta.get('commit') or '?'}", meta.get("date") or "date unknown"]
    if hw:
        parts.append(hw)
    if said:
        parts.append(f"load {said}")
    text = "Measured at " + "; ".join(parts) + "."
    if meta.get("command"):
        text += f" Command: `{meta['command']}`."
    if meta.get("recovered"):
        text += f" ({meta['recovered']})"
    return text


def _replace(path: Path, text: str) -> None:
    """``path`` holds ``text`` or what it held before, never a part of it (a run killed mid-write)."""
    part = path.with_name(path.name + ".part")
    part.write_text(text)
    os.replace(part, path)


def write(folder: Path, name: str, data: dict, markdown: str, meta: dict, headline: str | None = None) -> Path:
    """``folder/name.json`` ({"meta", "headline", **data}) and ``folder/name.md`` (``markdown`` and the meta);
    the JSON's path."""
    meta = {**meta, "finished": utc(), "load": {**meta.get("load", {}), "end": _load()}}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    _replace(path, json.dumps({"meta": meta, "headline": headline, **data}, indent=1, default=str) + "\n")
    _replace(folder / f"{name}.md", markdown.rstrip("\n") + "\n\n" + footer(meta) + "\n")
    print(f"wrote {path} and {name}.md", flush=True)
    return path


def options(ap: argparse.ArgumentParser, script: str) -> None:
    """``--results DIR`` (default: the question's results/ folder; with ``--quick`` a new temporary folder) and
    ``--quick``."""
    ap.add_argument("--results", type=Path, default=None,
                    help=f"folder for the result files (default {Path(script).resolve().parent.relative_to(ROOT)}"
                         "/results; with --quick a new temporary folder)")
    ap.add_argument("--quick", action="store_true", help="the smallest honest run (tiny model, a few steps): "
                    "checks the script, its numbers mean little")


def results_dir(args: argparse.Namespace, script: str) -> Path:
    """Where ``args`` says to write: ``--results``, else a temporary folder for ``--quick``, else results/."""
    if args.results is not None:
        return Path(args.results)
    if getattr(args, "quick", False):
        return Path(tempfile.mkdtemp(prefix="hubgrpo-bench-quick-"))
    return Path(script).resolve().parent / "results"


def read(path: Path) -> dict:
    """A result JSON."""
    return json.loads(Path(path).read_text())


def path_s(r: dict) -> float:
    """A round's seconds on its worker's path that are not training: the wait for its lease and its download,
    and (in sequence) its upload and submit; a pipelined worker (``"pipelined"`` rows) delivers while it trains
    the next round, and its lease wait includes any wait for that delivery."""
    s = r.get("lease_s", 0.0) + r.get("download_s", 0.0)
    return s if r.get("pipelined") else s + r.get("upload_s", 0.0) + r.get("submit_s", 0.0)


# Random models of real shapes (the GPU benchmarks and a profile on a GPU machine, which reaches no model hub)
SHAPES = {  # (config class name, kwargs) of the real models
    "smollm2-135m": ("LlamaConfig", dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                         num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True)),
    "qwen2.5-0.5b": ("Qwen2Config", dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                         num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True)),
}
QUICK = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
VOCAB = {"smollm2-135m": 49152, "qwen2.5-0.5b": 151936}  # the real models' embedding rows


def random_model(name: str, out: Path, quick: bool, vocab_size: int | None = None) -> str:
    """A random model with the real model's shapes and the built-in tiny tokenizer; returns its folder.
    ``vocab_size``: the embedding's rows (default: the tokenizer's; ids past it decode to nothing)."""
    import torch
    import transformers
    from transformers import PreTrainedTokenizerFast

    from hubgrpo.worker.models import tiny_dir

    tok = PreTrainedTokenizerFast.from_pretrained(tiny_dir())
    cls_name, shape = SHAPES[name]
    config = getattr(transformers, cls_name)(
        vocab_size=vocab_size or len(tok), max_position_embeddings=1024, pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id, bos_token_id=None, **(QUICK if quick else shape))
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.generation_config.eos_token_id = [tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")]
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)
