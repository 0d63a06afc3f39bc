"""Where a round's upload to the coordinator goes: each step of its path timed alone, in this process, for the wire
of protocol 6 (the adapter whole, base64 in a JSON body) and of protocol 7 (an ffa round without its A factors, the
files as they are in a binary body), on the demo's adapter shape (SmolLM2-135M, r = 16 on all linear layers).

    python benchmarks/round/upload_spans.py [--repeats 5]
    python benchmarks/round/upload_spans.py --quick   # the script checked: a 2-layer adapter

Each step is the library call the worker or the coordinator makes (``Base64Text``/``json_body``,
``routes.parse_arguments``, base64, ``upload_body``, ``strip_a``, the untrusted safetensors read, ``complete_a``,
``check_tensors``, the step bound, the frozen-A check, the update norm), the least CPU time of ``--repeats`` runs
on one torch thread: what a step costs, not what a loaded machine makes of it. Disk writes and reads are the inbox's
(written once, read back once); HTTP on loopback is not in it (``overhead.py`` measures whole rounds).
Protocol 6's update norm is the general two-term formula (``gram_sq_norm``), as ``difference_sq_norm`` ran before
it learnt the shared A. Writes ``results/upload-spans.{md,json}``.
"""

from __future__ import annotations

import argparse
import base64
import itertools
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.common import options, results_dir, start, write  # noqa: E402

DEMO = dict(layers=30, hidden=576, inter=1536, heads=9, kv_heads=3, head_dim=64)  # SmolLM2-135M
SMALL = dict(layers=2, hidden=128, inter=256, heads=4, kv_heads=2, head_dim=32)


def best(fn, repeats: int) -> tuple[float, object]:
    """(the least CPU time of ``repeats`` calls in seconds, the last result): CPU time, so that a machine shared
    with other jobs slows the run, not the figures."""
    out, times = None, []
    for _ in range(repeats):
        t0 = time.process_time()
        out = fn()
        times.append(time.process_time() - t0)
    return min(times), out


def old_norm(sub, base) -> float:
    """The update norm as protocol 6's admission computed it: two rank-r terms per module."""
    from hubgrpo.merge import parse_modules
    from hubgrpo.merge.adapter import factors
    from hubgrpo.merge.lowrank import gram_sq_norm

    total = 0.0
    specs, base_specs = parse_modules(sub)[0], parse_modules(base)[0]
    for prefix, spec in specs.items():
        bs = base_specs[prefix]
        (b1, a1), (b2, a2) = factors(sub, spec), factors(base, bs)
        total += gram_sq_norm([(1.0, spec.scaling * b1 - bs.scaling * b2, a1), (bs.scaling, b2, a1 - a2)])
    return total ** 0.5


def adapters(shape: dict):
    """(version's adapter, a trained round of it, the round's safetensors bytes)."""
    import torch
    from safetensors.torch import save

    from hubgrpo.merge import Adapter
    from tests.support.adapter_factory import make_adapter, qwen_shapes

    base = make_adapter(qwen_shapes(**shape), r=16, seed=0, scale=0.02, alpha=32)
    gen = torch.Generator().manual_seed(1)
    moved = {k: v + 0.001 * torch.randn(v.shape, generator=gen) if ".lora_B" in k else v
             for k, v in base.weights.items()}
    return base, Adapter(weights=moved, config=base.config), save(moved, metadata={"format": "pt"})


def spans(frozen: bool, base, data: bytes, folder: Path, repeats: int) -> list[tuple[str, str, float]]:
    """(side, step, seconds) of one upload's path: protocol 6 (``frozen`` False) or 7."""
    from hubgrpo import upload_body
    from hubgrpo.merge import Adapter, parse_modules, update_norm
    from hubgrpo.merge.frozen_a import complete_a, strip_a
    from hubgrpo.merge.submission_checks import check_step_bound, check_tensors
    from hubgrpo.merge.untrusted_files import read_safetensors
    from hubgrpo.space.routes import parse_arguments, parse_binary
    from hubgrpo.worker.json_body import Base64Text, json_body

    out, path = [], folder / "adapter_model.safetensors"
    lease = {"lease_id": "x" * 32, "worker": "w0", "base_version": 0}
    if frozen:
        t, sent = best(lambda: strip_a(data), repeats)
        out.append(("worker", "leave the A factors out", t))
        t, body = best(lambda: upload_body.pack([lease, {"adapter_model.safetensors": sent}, None]), repeats)
        out.append(("worker", "binary body", t))
        t, args = best(lambda: parse_binary(body), repeats)
        out.append(("coordinator", "split the binary body", t))
        received = args[1]["adapter_model.safetensors"]
    else:
        t, text = best(lambda: Base64Text.of(data), repeats)
        out.append(("worker", "base64", t))
        t, body = best(lambda: json_body({"data": [lease, {"adapter_model.safetensors": text}, None]}), repeats)
        out.append(("worker", "JSON body", t))
        t, args = best(lambda: parse_arguments(body), repeats)
        out.append(("coordinator", "parse the JSON body", t))
        t, received = best(lambda: base64.b64decode(args[1]["adapter_model.safetensors"], validate=True), repeats)
        out.append(("coordinator", "base64 decode", t))
    writes = 1 if frozen else 2  # protocol 6 wrote a decoded folder, then copied it into the inbox
    t, _ = best(lambda: [path.write_bytes(received) for _ in range(writes)], repeats)
    out.append(("coordinator", "write into the inbox (protocol 6: twice)", t))
    t, _ = best(lambda: (folder / "copy").write_bytes(path.read_bytes()), repeats)
    out.append(("coordinator", "read back from the inbox (a copy)", t))
    t, weights = best(lambda: read_safetensors(path, len(received)), repeats)
    if frozen:
        weights = complete_a(weights, base.weights)
    out.append(("coordinator", "parse and load the safetensors", t))
    t, _ = best(lambda: check_tensors(weights, base.weights), repeats)
    out.append(("coordinator", "keys, shapes, dtypes, finite", t))
    sub = Adapter(weights=weights, config=base.config)
    t, _ = best(lambda: (max(float(v.abs().max()) for v in base.weights.values()), check_step_bound(sub, base, 1.0)),
                repeats)
    if frozen:  # the largest entry is remembered per version: only the check itself
        t, _ = best(lambda: check_step_bound(sub, base, 1.0), repeats)
    out.append(("coordinator", "step bound", t))
    import torch

    t, _ = best(lambda: all(sub.weights[k] is v or torch.equal(sub.weights[k], v)
                            for k, v in base.weights.items() if ".lora_A" in k), repeats)
    out.append(("coordinator", "frozen A equal", t))
    norm = ((lambda: update_norm(sub, parse_modules(sub)[0], base, parse_modules(base)[0])) if frozen
            else (lambda: old_norm(sub, base)))
    t, _ = best(norm, repeats)
    out.append(("coordinator", "update norm", t))
    return out


def report(r: dict) -> str:
    lines = ["# A round's upload, step by step", "",
             f"Adapter {r['adapter_mb']:.2f} MB (fp32, r = 16, all linear layers of {r['shape']}); protocol 7 sends "
             f"{r['sent_mb']:.2f} MB of it. CPU time, the least of {r['repeats']} per step, one torch thread, one "
             "process; HTTP on loopback, the rewards' recomputation and the merge are not in it.", "",
             "| side | step | protocol 6 (ms) | protocol 7 (ms) |", "|---|---|---|---|"]
    old = {(s, n): t for s, n, t in r["protocol_6"]}
    new = {(s, n): t for s, n, t in r["protocol_7"]}
    order: list = []  # the path's order: both protocols' steps, each where it first comes
    for pair in itertools.zip_longest(old, new):
        order += [k for k in pair if k is not None and k not in order]
    for key in order:
        fmt = lambda d: f"{1000 * d[key]:.1f}" if key in d else "–"  # noqa: E731
        lines.append(f"| {key[0]} | {key[1]} | {fmt(old)} | {fmt(new)} |")
    lines.append(f"| | **sum** | **{1000 * sum(old.values()):.0f}** | **{1000 * sum(new.values()):.0f}** |")
    return "\n".join(lines + [""])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    options(ap, __file__)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    meta = start(args.quick)
    shape = SMALL if args.quick else DEMO
    base, _, data = adapters(shape)
    from hubgrpo.merge.frozen_a import strip_a

    with tempfile.TemporaryDirectory(prefix="hubgrpo-upload-spans-") as tmp:
        r = {"shape": "a 2-layer model" if args.quick else "SmolLM2-135M", "repeats": args.repeats,
             "adapter_mb": len(data) / 1e6, "sent_mb": len(strip_a(data)) / 1e6,
             "protocol_6": spans(False, base, data, Path(tmp), args.repeats),
             "protocol_7": spans(True, base, data, Path(tmp), args.repeats)}
    old, new = (sum(t for *_, t in r[k]) for k in ("protocol_6", "protocol_7"))
    write(results_dir(args, __file__), "upload-spans", r, report(r), meta,
          f"a round's upload path: {1000 * old:.0f} ms (protocol 6) → {1000 * new:.0f} ms (protocol 7) of CPU, "
          f"{r['adapter_mb']:.1f} → {r['sent_mb']:.1f} MB sent")
    print(report(r))


if __name__ == "__main__":
    main()
