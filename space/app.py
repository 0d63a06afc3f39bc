"""hubgrpo coordinator Space: the run's API (lease / heartbeat / release / submit / upload / status) and its web UI.

Set by `hubgrpo space deploy`: variable HUBGRPO_REPO (the run repo, user/name), secrets HF_TOKEN (writes the run
repo) and HUBGRPO_SECRET (signs leases). The hubgrpo package is deployed beside this file. A run whose rewards are
not built in needs the variable HUBGRPO_ALLOW_REWARD (comma-separated module:function names the coordinator may run
to recompute rewards).
"""

import os

from hubgrpo.space.auth import make_auth
from hubgrpo.coordinator.core import Coordinator
from hubgrpo.space.app import build_space, launch_kwargs
from hubgrpo.store import open_store

store = open_store(os.environ["HUBGRPO_REPO"], token=os.environ.get("HF_TOKEN"), endpoint=os.environ.get("HF_ENDPOINT"))
allow = [f.strip() for f in os.environ.get("HUBGRPO_ALLOW_REWARD", "").split(",") if f.strip()]
coord = Coordinator(store, os.environ["HUBGRPO_SECRET"].encode(), allow_code=allow)
demo = build_space(coord, auth=make_auth(coord))

if __name__ == "__main__":
    demo.launch(**launch_kwargs())
