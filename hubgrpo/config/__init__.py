"""The hubgrpo config tree: AutoTrain-style YAML, validated on load (no torch import): the sections
(``sections``) and their loading (``loading``).

A config file looks like::

    task: llm-grpo
    base_model: builtin:tiny
    project_name: tiny-addition
    data: {path: "builtin:addition", options: {digits: 1}}
    rewards: [{function: "builtin:exact_answer"}]
    params: {learning_rate: 2.0e-2}
    rounds: {steps: 4, versions: 3}
    hub: {repo_id: "${HF_USER:-me}/tiny-run", token: "${HF_TOKEN}"}

``${VAR}`` and ``${VAR:-default}`` are expanded in string values of the user's own config file (never in a config
read from a run repo: ``loads(..., expand=False)``); a value that came from the environment is shown and stored as
its placeholder, never as the value. ``--set params.learning_rate=1e-4`` overrides any field (the value is parsed
as YAML). Unknown keys are refused; keys that moved (``legacy``) are accepted at their old place with a
deprecation warning. A bad config raises ``ConfigError`` naming the key path, the bad value, what is allowed and
the YAML line.
"""

from __future__ import annotations

from hubgrpo.config.loading import (
    apply_overrides,
    check_storable,
    deprecations,
    expand_env,
    field_docs,
    from_env,
    load_config,
    loads,
    placeholders,
    shown,
    to_yaml,
    validate,
)
from hubgrpo.config.sections import (
    BackendOptions,
    Config,
    CoordinatorSection,
    DataConfig,
    HubSection,
    LoraSection,
    MergeSection,
    ParamsConfig,
    RewardConfig,
    RoundsSection,
    WorkerSection,
)

__all__ = [
    "BackendOptions",
    "Config",
    "CoordinatorSection",
    "DataConfig",
    "HubSection",
    "LoraSection",
    "MergeSection",
    "ParamsConfig",
    "RewardConfig",
    "RoundsSection",
    "WorkerSection",
    "apply_overrides",
    "check_storable",
    "deprecations",
    "expand_env",
    "field_docs",
    "from_env",
    "load_config",
    "loads",
    "placeholders",
    "shown",
    "to_yaml",
    "validate",
]
