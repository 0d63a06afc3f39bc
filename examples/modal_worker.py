"""hubgrpo workers on Modal GPUs: each function call runs one ``hubgrpo worker`` until the run finishes.

    export HUBGRPO_WHEEL=https://huggingface.co/spaces/you/run1-coordinator/resolve/main/wheels/hubgrpo-0.1.0-py3-none-any.whl
    modal secret create huggingface HF_TOKEN=hf_...          # once: the token each worker authenticates with
    modal run examples/modal_worker.py --repo you/run1 --coordinator you/run1-coordinator --workers 4

``HUBGRPO_WHEEL`` is the wheel the run's Space publishes (``hubgrpo space deploy`` prints its URL), so the
workers run exactly the hubgrpo that coordinates the run; a private Space's wheel needs a token to download, so
publish the run's Space publicly or host the wheel where the image build can fetch it. The token reaches the
container only through the Modal secret, never on a command line.
"""

import os
import secrets

import modal

WHEEL = os.environ.get("HUBGRPO_WHEEL", "hubgrpo")  # read where the image is defined: on your machine
GPU = os.environ.get("HUBGRPO_MODAL_GPU", "A10G")

image = modal.Image.debian_slim(python_version="3.11").pip_install(WHEEL)
app = modal.App("hubgrpo-worker", image=image)


@app.function(gpu=GPU, secrets=[modal.Secret.from_name("huggingface")], timeout=6 * 3600)
def worker(repo: str, coordinator: str, name: str) -> int:
    """One worker process, until the coordinator says the run is finished; returns its exit code."""
    import subprocess

    cmd = ["hubgrpo", "worker", "--repo", repo, "--coordinator", coordinator, "--name", name]
    return subprocess.run(cmd).returncode


@app.local_entrypoint()
def main(repo: str, coordinator: str, workers: int = 2):
    tag = secrets.token_hex(2)
    names = [f"modal-{i:02d}-{tag}" for i in range(workers)]
    codes = list(worker.starmap([(repo, coordinator, name) for name in names]))
    print(dict(zip(names, codes)))
