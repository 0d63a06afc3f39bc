"""A hostile coordinator against the gradio transport (``transport="gradio"``: the default for a Space id, as in
``hubgrpo worker --coordinator user/space``).

The http transport caps every answer and gives each call an overall deadline (``test_hostile_coordinator``);
gradio_client reads whatever the app sends, for as long as it trickles. Over real HTTP on 127.0.0.1: a huge
``/config`` must be cut off (``too_large``) with memory bounded, and a trickling one must end soon after the
client's ``timeout`` (``unreachable``), the token going nowhere else.
"""

from __future__ import annotations

import time
import tracemalloc

import pytest

from hubgrpo.errors import CoordinatorError
from hubgrpo.worker.client import CoordinatorClient
from tests.support.hostile_coordinator import TOKEN, HostileCoordinator, gradio_config, huge, token_stayed_home, trickle


@pytest.mark.timeout(60)
@pytest.mark.parametrize("declared", [True, False], ids=["declared", "chunked"])
def test_a_huge_gradio_config_is_cut_off_and_memory_stays_bounded(declared):
    with HostileCoordinator(config=huge(200 << 20, declared=declared)) as coord:
        c = CoordinatorClient(coord.url, token=TOKEN, transport="gradio", retries=0, timeout=10)
        tracemalloc.start()
        try:
            with pytest.raises(CoordinatorError) as e:
                c.lease("w1")
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
            c.close()
    assert e.value.code == "too_large" and "MiB" in e.value.message, e.value
    assert peak < 48 << 20, f"peak {peak / 2**20:.0f} MiB while refusing a 200 MiB answer"
    token_stayed_home(coord)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("where", ["config-body", "config-headers", "call"])
def test_a_trickling_gradio_answer_times_out_as_a_whole(where):
    """A byte every 0.2 s for 20 s: every read is quick; the call must still give up soon after `timeout` (2 s)."""
    slow = trickle(interval=0.2, for_s=20, headers_too=where == "config-headers")
    behaviours = {"config": slow} if where.startswith("config") else {"config": gradio_config(""), "*": slow}
    with HostileCoordinator(**behaviours) as coord:
        c = CoordinatorClient(coord.url, token=TOKEN, transport="gradio", retries=0, timeout=2)
        t0 = time.monotonic()
        with pytest.raises(CoordinatorError) as e:
            c.lease("w1")
        took = time.monotonic() - t0
        c.close()
    assert e.value.code == "unreachable" and took < 8, (e.value, took)
    token_stayed_home(coord)
