"""hubgrpo: asynchronous GRPO + LoRA across machines that share only a Hub repo and a Gradio Space.

The Python API (``hubgrpo.python_api``; loaded on first use, so ``import hubgrpo`` stays light)::

    from hubgrpo import load_config, init_run, run_local, leaderboard, versions, push_adapter, load_adapter
"""

__version__ = "0.1.0"

_PYTHON_API = ("init_run", "run_local", "leaderboard", "versions", "push_adapter", "load_adapter", "store_for")
__all__ = ["__version__", "load_config", *_PYTHON_API]


def __getattr__(name: str):
    """The public API, imported lazily (the command line and the Space import this package without torch)."""
    if name == "load_config":
        from hubgrpo.config import load_config

        return load_config
    if name in _PYTHON_API:
        from hubgrpo import python_api

        return getattr(python_api, name)
    raise AttributeError(f"module 'hubgrpo' has no attribute {name!r}")
