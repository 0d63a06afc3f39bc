"""A worker on another CPU, for ``proof_model.py``: honest completions sampled in a child process whose kernels
round differently from the verifier's.

Strangers' workers run on other processors than the verifier's: another vector width or another matrix-product
kernel rounds the same sums in another order. This machine can play such a worker: ``ENV`` makes torch's own
kernels (softmax, norms, elementwise) run without vector instructions and oneDNN's matrix products at SSE4.1, in
a child process (both are read once, when torch loads). The child gets the parent's model weights exactly (the
state dict of the leased model, base included) and the calls' seeds and prompts, samples with keyed Gumbel-max
(``proof_model.sample``) and returns the completions; the parent replays them with its own kernels.

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
# torch's kernels unvectorised, oneDNN at SSE4.1 (this machine's own: AVX2 or wider)
ENV = {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41"}
SUFFIX = "-other"


def sample_elsewhere(b, dtype: str, threads: int, calls: list[tuple[int, list[list[int]]]]) -> dict:
    """{"completions": per call, its completions; "capability": the child's torch CPU capability}: the leased
    model of ``b`` in ``dtype`` sampled in a child process with ``ENV``, ``threads`` threads."""
    import torch

    with tempfile.TemporaryDirectory(prefix="proof-other-cpu-") as tmp:
        src, out = Path(tmp) / "in.pt", Path(tmp) / "out.json"
        torch.save({"weights": b.model("leased", dtype).state_dict(), "calls": calls, "dtype": dtype,
                    "threads": threads, "model": b.name, "overrides": list(b.overrides)}, src)
        env = os.environ | ENV
        subprocess.run([sys.executable, __file__, str(src), str(out)], env=env, check=True, timeout=6 * 3600)
        return json.loads(out.read_text())


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
    completions = [sample(b, model, prompts, seed) for seed, prompts in job["calls"]]
    out.write_text(json.dumps({"completions": completions, "capability": torch.backends.cpu.get_cpu_capability()}))


if __name__ == "__main__":
    child(Path(sys.argv[1]), Path(sys.argv[2]))
