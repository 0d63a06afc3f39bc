"""Admission checks for submitted adapter folders (untrusted input; docs/architecture.md).

``check_submission(sub_dir, global_, max_bytes=…)`` returns the loaded ``Adapter`` or raises
``InvalidSubmission(code, sentence, hint=…)``. Nothing is ever unpickled: weights are read only as safetensors,
whose header is bounds-checked by hand (``hubgrpo.merge.untrusted_files``). Checks run cheapest first; the stable
codes are:

=====================  ================================================================================
``missing_file``       the folder, adapter_model.safetensors or adapter_config.json is missing
``symlink``            the folder or a file in it is a symbolic link
``nested_dir``         the folder contains a directory
``not_safetensors``    a pickle-based weight file (.bin, .pt, .pth, .pkl, .ckpt, …) is present
``unexpected_file``    any other file than adapter_model.safetensors, adapter_config.json, submission.json,
                       rollouts.json.gz (checked by the coordinator), README.md
``empty_file``         a zero-byte file
``too_large``          the files together exceed ``max_bytes``
``unknown_base``       the claimed base version is not one of ``known_versions``
``stale``              the base version is more than ``max_staleness`` versions behind ``current_version``
``bad_config``         adapter_config.json is not a JSON object
``nested_json``        adapter_config.json or the safetensors header is nested too deeply to parse
``config_mismatch``    a field that matters differs from the global adapter_config.json (``CONFIG_FIELDS``)
``corrupt``            adapter_model.safetensors is truncated, has an absurd header, or does not parse
``missing_keys``       tensors of the global adapter are missing
``extra_keys``         tensors the global adapter does not have
``shape`` / ``dtype``  a tensor's shape or dtype differs from the global adapter's
``nonfinite``          a tensor holds NaN or ±Inf
``modified_base_weight``  a frozen base weight saved with the adapter differs from the global's
``norm_outlier``       ‖ΔW_sub − ΔW_base‖ exceeds ``norm_limit``
``out_of_bounds``      a LoRA factor entry moved farther from the base than training can move it
                       (``check_step_bound``, called by the coordinator with a bound derived from the lease)
=====================  ================================================================================
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from hubgrpo.merge.frozen_a import complete_a
from hubgrpo.merge.untrusted_files import WEIGHTS_NAME, read_plain, read_safetensors, refuse

CONFIG_NAME = "adapter_config.json"
ALLOWED_FILES = {WEIGHTS_NAME, CONFIG_NAME, "submission.json", "rollouts.json.gz", "README.md"}
PICKLE_SUFFIXES = {".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".joblib", ".npy", ".npz", ".h5", ".msgpack"}
MAX_CONFIG_BYTES = 1 << 20
# adapter_config.json fields that change what the weights mean; compared with the global adapter's
CONFIG_FIELDS = (
    "peft_type",
    "r",
    "lora_alpha",
    "target_modules",
    "exclude_modules",
    "use_rslora",
    "use_dora",
    "rank_pattern",
    "alpha_pattern",
    "modules_to_save",
    "base_model_name_or_path",
    "revision",
    "task_type",
    "bias",
    "lora_bias",
    "fan_in_fan_out",
    "layers_to_transform",
    "layers_pattern",
    "layer_replication",
    "target_parameters",
    "trainable_token_indices",
    "use_qalora",
    "qalora_group_size",
    "use_bdlora",
    "alora_invocation_tokens",
    "kasa_config",
    "velora_config",
    "monteclora_config",
    "arrow_config",
)


def check_submission(
    sub_dir: str | os.PathLike,
    global_,
    *,
    max_bytes: int,
    known_versions=None,
    base_version=None,
    norm_limit: float | None = None,
    base=None,
    current_version: int | None = None,
    max_staleness: int | None = None,
    frozen_a: bool = False,
):
    """Run every admission check on the local folder ``sub_dir`` against the global ``Adapter``; return the
    submission as an ``Adapter``. ``base`` (default ``global_``) is the adapter the submission was trained from,
    used by the norm check; ``known_versions`` / ``base_version`` / ``current_version`` / ``max_staleness`` are
    plain caller-supplied facts (the caller owns submission.json). ``frozen_a`` (ffa runs): the A factors the
    file leaves out are the global's (``hubgrpo.merge.frozen_a``); those it holds are checked like any tensor."""
    folder = Path(sub_dir)
    sizes = _check_folder(folder, max_bytes)
    _check_base(known_versions, base_version, current_version, max_staleness)
    config = _read_config(folder / CONFIG_NAME, sizes[CONFIG_NAME])
    compare_configs(config, global_.config)
    weights = read_safetensors(folder / WEIGHTS_NAME, sizes[WEIGHTS_NAME])
    if frozen_a:
        weights = complete_a(weights, global_.weights)
    check_tensors(weights, global_.weights)
    from hubgrpo.merge import Adapter

    adapter = Adapter(weights=weights, config=config)
    if norm_limit is not None:
        _check_norm(adapter, base if base is not None else global_, norm_limit)
    return adapter


def _check_folder(folder: Path, max_bytes: int) -> dict[str, int]:
    """File-level checks with ``lstat`` only (nothing is opened); returns {file name: size}."""
    try:
        st = os.lstat(folder)
    except FileNotFoundError:
        refuse("missing_file", f"the submission folder {folder} does not exist")
    if stat.S_ISLNK(st.st_mode):
        refuse("symlink", f"the submission folder {folder.name} is a symbolic link", hint="upload plain files")
    if not stat.S_ISDIR(st.st_mode):
        refuse("missing_file", f"the submission {folder.name} is not a folder")
    sizes, total = {}, 0
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        est = entry.stat(follow_symlinks=False)
        if stat.S_ISLNK(est.st_mode):
            refuse(
                "symlink",
                f"{entry.name} is a symbolic link; submissions must hold plain files",
                hint="upload the files themselves, not links",
            )
        if stat.S_ISDIR(est.st_mode):
            refuse(
                "nested_dir",
                f"{entry.name}/ is a folder; a submission holds only {sorted(ALLOWED_FILES)}",
                hint="save with save_pretrained(dir, selected_adapters=['default']) and upload only its files",
            )
        if Path(entry.name).suffix.lower() in PICKLE_SUFFIXES:
            refuse(
                "not_safetensors",
                f"{entry.name} is a pickle-based weight file, which is never loaded",
                hint="save the adapter as adapter_model.safetensors (save_pretrained's default)",
            )
        if entry.name not in ALLOWED_FILES or not stat.S_ISREG(est.st_mode):
            refuse(
                "unexpected_file",
                f"{entry.name} is not allowed in a submission (allowed: {', '.join(sorted(ALLOWED_FILES))})",
                hint="upload only the adapter files and submission.json",
            )
        if est.st_size == 0:
            refuse("empty_file", f"{entry.name} is empty (0 bytes)", hint="the upload was probably interrupted")
        sizes[entry.name] = est.st_size
        total += est.st_size
    if total > max_bytes:
        refuse(
            "too_large",
            f"the submission holds {total:,} bytes, more than the limit of {max_bytes:,}",
            hint="submit only the LoRA adapter at the run's rank",
        )
    for name in (WEIGHTS_NAME, CONFIG_NAME):
        if name not in sizes:
            refuse("missing_file", f"the submission has no {name}")
    return sizes


def _check_base(known_versions, base_version, current_version, max_staleness) -> None:
    if known_versions is not None and (base_version is None or base_version not in known_versions):
        refuse(
            "unknown_base",
            f"base version {base_version!r} is not a version of this run",
            hint="train from a version you leased",
        )
    if None not in (current_version, max_staleness, base_version):
        tau = int(current_version) - int(base_version)
        if tau > max_staleness:
            refuse(
                "stale",
                f"the submission is {tau} versions behind the current version {current_version}; at "
                f"most {max_staleness} are accepted",
                hint="lease a new round to train from the current version",
            )


def _read_config(path: Path, size: int) -> dict:
    if size > MAX_CONFIG_BYTES:
        refuse("bad_config", f"{CONFIG_NAME} is {size:,} bytes; more than {MAX_CONFIG_BYTES:,} is not a config")
    try:
        config = json.loads(read_plain(path, size, MAX_CONFIG_BYTES).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        refuse("bad_config", f"{CONFIG_NAME} is not valid JSON ({str(exc)[:200]})")
    except RecursionError:
        refuse("nested_json", f"{CONFIG_NAME} is nested too deeply to be an adapter config")
    if not isinstance(config, dict):
        refuse("bad_config", f"{CONFIG_NAME} is a JSON {type(config).__name__}, not an object")
    return config


def _norm_field(name: str, value):
    """Compare-equal form: PEFT writes unordered target lists, and None / False / {} / [] all mean "unset"."""
    if name == "bias":
        return value or "none"
    if name == "base_model_name_or_path" and isinstance(value, str):
        from hubgrpo.card import BUILTIN_MODELS

        return BUILTIN_MODELS.get(value) or value  # runs begun before built-ins were saved under their Hub name
    if value in (None, False, "", [], {}):
        return None
    if isinstance(value, list):
        return sorted(map(str, value)) if name in ("target_modules", "exclude_modules") else value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return value


def compare_configs(config: dict, reference: dict) -> None:
    """Refuse when any of ``CONFIG_FIELDS`` differs between ``config`` and the global ``reference``."""
    for name in CONFIG_FIELDS:
        got, want = _norm_field(name, config.get(name)), _norm_field(name, reference.get(name))
        if got != want:
            refuse(
                "config_mismatch",
                f"{CONFIG_NAME} has {name}={_short(config.get(name))} but the run's adapter "
                f"has {name}={_short(reference.get(name))}",
                hint="keep the LoRA config of the global adapter unchanged",
            )


def _short(value, limit: int = 80) -> str:
    """``repr`` of an untrusted value, cut to ``limit`` characters (a refusal never quotes a whole upload)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"… ({len(text):,} characters)"


def max_submission_bytes(global_) -> int:
    """The size of a valid submission, derived from the global adapter: its tensors' bytes, a safetensors header
    (≤ 256 bytes per tensor + 64 KiB), adapter_config.json (≤ 64 KiB) and submission.json (≤ 4 MiB)."""
    data = sum(t.numel() * t.element_size() for t in global_.weights.values())
    return data + 256 * len(global_.weights) + (64 << 10) + (64 << 10) + (4 << 20)


def check_tensors(weights: dict, reference: dict) -> None:
    """Exact key set, shapes, dtypes; all values finite; frozen base weights equal to the global's."""
    import torch

    missing, extra = sorted(reference.keys() - weights.keys()), sorted(weights.keys() - reference.keys())
    if missing:
        refuse("missing_keys", f"{len(missing)} tensor(s) of the run's adapter are missing, e.g. {missing[0]}")
    if extra:
        refuse("extra_keys", f"{len(extra)} tensor(s) are not in the run's adapter, e.g. {extra[0]}")
    for key, want in reference.items():
        got = weights[key]
        if got is want:  # the run's own tensor, put in by ``complete_a``: nothing of the submission's
            continue
        if tuple(got.shape) != tuple(want.shape):
            refuse("shape", f"{key} has shape {tuple(got.shape)}, expected {tuple(want.shape)}")
        if got.dtype != want.dtype:
            refuse("dtype", f"{key} is {got.dtype}, expected {want.dtype}")
        if got.is_floating_point() and not bool(torch.isfinite(got).all()):
            refuse("nonfinite", f"{key} contains NaN or infinite values", hint="the training run diverged")
        if key.endswith(".base_layer.weight") and not torch.equal(got, want):
            refuse("modified_base_weight", f"{key} is a frozen base weight but differs from the run's")


def _check_norm(adapter, base, norm_limit: float) -> None:
    from hubgrpo.errors import MergeError
    from hubgrpo.merge import parse_modules, update_norm

    try:
        norm = update_norm(adapter, parse_modules(adapter)[0], base, parse_modules(base)[0])
    except MergeError as exc:
        refuse("config_mismatch", f"the adapter cannot be merged: {exc.message}")
    if not norm <= norm_limit:
        refuse(
            "norm_outlier",
            f"the update norm ‖ΔW − ΔW_base‖ = {norm:.4g} exceeds the limit {norm_limit:.4g}",
            hint="lower the learning rate or the number of steps per round",
        )


def norm_floor(typical: float | None, factor: float | None, lr_ratio: float = 1.0) -> float:
    """The update norm per step below which a round moved the model too little to earn merge weight or credit:
    ``factor`` × ``typical`` (the per-step norm of recent credited rounds, ``coordinator.norms``) × ``lr_ratio``
    (the round's learning rate ÷ the run's peak, so a run-wide schedule does not put late honest rounds below it);
    0.0 — only an exactly-zero update falls below — while there is no typical norm yet or no factor. An AdamW
    step moves every entry with a non-zero gradient by about the learning rate, so an honest round's per-step
    norm stays near typical; a round that trained nothing (the leased adapter sent back) has norm 0."""
    if not factor or typical is None:
        return 0.0
    return factor * typical * max(0.0, lr_ratio)


def below_floor(norm: float | None, steps: int, floor: float) -> bool:
    """Whether a round's update (``norm`` over ``steps`` steps) is below ``floor`` per step, or zero."""
    return norm is None or not norm > 0 or norm / max(1, steps) < floor


def check_step_bound(adapter, base, bound: float, why: str = "") -> float:
    """Refuse (``out_of_bounds``) when any LoRA factor entry differs from ``base`` by more than ``bound``;
    returns the largest difference. Elementwise, so no single tensor can be scaled up, whatever the quorum."""
    worst, where = 0.0, ""
    for key, value in adapter.weights.items():
        if ".lora_" not in key or key not in base.weights or value is base.weights[key]:
            continue
        diff = float((value.float() - base.weights[key].float()).abs().max()) if value.numel() else 0.0
        if not diff <= worst:  # NaN-safe: a NaN difference is the worst
            worst, where = diff, key
    if not worst <= bound:
        limit = why or f"at most {bound:.4g} is possible"
        refuse(
            "out_of_bounds",
            f"{where} moved by {worst:.4g} from the version it was trained on; {limit}",
            hint="submit what the round's training produced",
        )
    return worst
