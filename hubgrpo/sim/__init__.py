"""``hubgrpo simulate``: N machines on one — real GRPO rounds, the real coordinator, a virtual clock.

``fleet`` (speeds, the cost model, dropouts), ``loop`` (the discrete-event simulation), ``report`` (the JSON, the
PNG, time to a target). Like the CLI, it drives both roles in one process: the worker's round engine and the
coordinator.
"""
