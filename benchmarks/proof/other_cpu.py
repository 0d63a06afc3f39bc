"""A worker on another CPU, for ``proof_model.py``: honest completions sampled in a child process whose kernels
round differently from the verifier's.

Strangers' workers run on other processors than the verifier's: another vector width or another matrix-product
kernel rounds the same sums in another order. This machine can play such a worker in a child process (``ENV`` is
read once, when the libraries load): MKL's matrix products in its reproducible "compatible" code path instead of
the one tuned for this processor, and torch's own kernels (softmax, activations, ...) without vector
instructions. Checked on an AMD EPYC (AVX2) with fixed inputs: float32 ``linear`` of 64×576 by 576×1536 then
differs from this process's by up to 4.6e-5 (MKL_CBWR; MKL_ENABLE_INSTRUCTIONS=SSE4_2 and ONEDNN_MAX_CPU_ISA
change nothing there), softmax by 4e-9, SiLU by 5e-7 (ATEN_CPU_CAPABILITY); each run records the product's
difference (``probe``). The child gets the parent's model weights exactly (the state dict of the leased model, base
included) and the calls' seeds and prompts, samples with keyed Gumbel-max (``proof_model.sample``) and returns the
completions; the parent replays them with its own kernels.

    python benchmarks/proof/proof_model.py --pairs fp32-other/fp32 ...   # a worker spec ending in -other
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENV = {"MKL_CBWR": "COMPATIBLE", "ATEN_CPU_CAPABILITY": "default"}
SUFFIX = "-other"


def probe():
    """A float32 matrix product and a softmax of fixed inputs (exact in float32 on any kernel), to compare the
    child's kernels with the parent's."""
    import torch

    a = ((torch.arange(64 * 576) % 17 - 8) / 7.0).view(64, 576)
    w = ((torch.arange(1536 * 576) % 13 - 6) / 5.0).view(1536, 576)
    x = torch.nn.functional.linear(a, w)
    return x, torch.softmax(x / 100.0, -1)


def sample_elsewhere(b, dtype: str, threads: int, calls: list[tuple[int, list[list[int]]]]) -> dict:
    """{"completions": per call, its completions; "capability": the child's torch CPU capability; "probe": the
    largest differences of ``probe`` between child and parent}: the leased model of ``b`` in ``dtype`` sampled in
    a child process with ``ENV``, ``threads`` threads."""
    import torch

    with tempfile.TemporaryDirectory(prefix="proof-other-cpu-") as tmp:
        src, out = Path(tmp) / "in.pt", Path(tmp) / "out.json"
        torch.save({"weights": b.model("leased", dtype).state_dict(), "calls": calls, "dtype": dtype,
                    "threads": threads, "model": b.name, "overrides": list(b.overrides)}, src)
        env = os.environ | ENV
        subprocess.run([sys.executable, __file__, str(src), str(out)], env=env, check=True, timeout=6 * 3600)
        found = json.loads(out.read_text())
        theirs = torch.load(Path(tmp) / "probe.pt")
        found["probe"] = {"matmul": float((theirs[0] - probe()[0]).abs().max()),
                          "softmax": float((theirs[1] - probe()[1]).abs().max())}
        return found


def child(src: Path, out: Path) -> None:
    import torch

    sys.path.insert(0, str(ROOT))
    from benchmarks.proof.proof_model import sample, setup

    job = torch.load(src, weights_only=False)
    b = setup(job["model"], 0, tuple(job["overrides"]))
    model = b.model("leased", job["dtype"])
    missing, unexpected = model.load_state_dict(job["weights"], strict=True)
    assert not missing and not unexpected
    torch.set_num_threads(job["threads"])
    torch.save(probe(), out.parent / "probe.pt")
    completions = [sample(b, model, prompts, seed) for seed, prompts in job["calls"]]
    out.write_text(json.dumps({"completions": completions, "capability": torch.backends.cpu.get_cpu_capability()}))


if __name__ == "__main__":
    child(Path(sys.argv[1]), Path(sys.argv[2]))
