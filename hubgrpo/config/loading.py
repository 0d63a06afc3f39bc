"""Loading a hubgrpo config: YAML, ``${VAR}`` expansion, ``--set`` overrides, errors that name the YAML line."""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from hubgrpo.config.legacy import MovedKeyConflict, migrate, new_key
from hubgrpo.config.sections import Config
from hubgrpo.errors import ConfigError

log = logging.getLogger("hubgrpo.config")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-(.*?))?\}")


def expand_env(
    value: Any, path: str = "", env: dict[str, str] | None = None, found: dict[tuple, str] | None = None
) -> Any:
    """Expand ``${VAR}`` / ``${VAR:-default}`` in every string of a parsed YAML tree (the user's own config file
    only: a config read from a run repo is never expanded). ``found`` collects, by key path, the text as written of
    every string that took a value from the environment (not only its written default): those values are shown
    and stored as that text, never as the value (``to_yaml``)."""
    return _expand(value, (), path, os.environ if env is None else env, {} if found is None else found)


def _expand(value: Any, keys: tuple, path: str, env, found: dict) -> Any:
    if isinstance(value, dict):
        return {k: _expand(v, keys + (k,), f"{path}.{k}" if path else str(k), env, found) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v, keys + (i,), f"{path}[{i}]", env, found) for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match) -> str:
        name, default = m.group(1), m.group(2)
        if name in env and env[name] != "":
            found[keys] = value
            return env[name]
        if default is not None:
            return default
        raise ConfigError(
            f"{path}: environment variable {name} is not set (value {value!r})",
            hint=f"export {name}=... or write ${{{name}:-default}}",
        )

    return _VAR.sub(sub, value)


def placeholders(value: Any) -> list[str]:
    """The names of the ``${NAME}`` placeholders in every string of ``value`` (a tree), in order."""
    if isinstance(value, dict):
        return [n for v in value.values() for n in placeholders(v)]
    if isinstance(value, list):
        return [n for v in value for n in placeholders(v)]
    return [m.group(1) for m in _VAR.finditer(value)] if isinstance(value, str) else []


def from_env(cfg: Config) -> dict[tuple, str]:
    """Key path → the text as written, for every value of ``cfg`` that came from the environment."""
    return dict(cfg._from_env)


def deprecations(cfg: Config) -> list[str]:
    """One note per key ``cfg`` was given at a place it moved from (``legacy``), e.g. "params.versions is now
    rounds.versions; write it there"."""
    return list(cfg._deprecations)


def shown(cfg: Config, path: str, value: Any) -> Any:
    """``value`` (the field at dotted ``path``) as it may be shown: its placeholder if it came from the
    environment."""
    return from_env(cfg).get(tuple(int(k) if k.isdigit() else k for k in path.split(".")), value)


# Where a stored run repo config may hold a placeholder for a value from the user's environment: the readers
# supply these themselves (a reward's runner from its own environment, a worker its --coordinator and --repo).
STORABLE_FROM_ENV = (
    ("rewards",),
    ("coordinator", "url"),
    ("coordinator", "secret"),
    ("hub", "repo_id"),
    ("hub", "token"),
)


def check_storable(cfg: Config) -> None:
    """Refuse (``ConfigError``) a config whose copy in a run repo would need a value from the user's environment:
    the repo stores placeholders, never such values (they may be secrets), and its readers never expand them."""
    bad = {
        p: text
        for p, text in from_env(cfg).items()
        if not any(
            p[: len(allowed)] == allowed and (allowed != ("rewards",) or "kwargs" in p[2:3])
            for allowed in STORABLE_FROM_ENV
        )
    }
    if bad:
        keys = ", ".join(f"{_dotted(p)} ({text!r})" for p, text in bad.items())
        sets = " ".join(f"--set {_dotted(p)}=VALUE" for p in bad)
        raise ConfigError(
            f"{keys}: from your environment; a run repo stores no value from anyone's environment "
            "(it may be a secret) and its readers never expand a placeholder",
            hint=f"write the value into the config, or pass {sets} (placeholders may stay only in "
            "a reward's kwargs, coordinator.url, hub.repo_id, hub.token, coordinator.secret)",
        )


def _dotted(path: tuple) -> str:
    return ".".join(str(k) for k in path)


def apply_overrides(raw: dict, overrides: list[str] | None, notes: list[str] | None = None) -> dict:
    """Apply ``a.b.c=value`` overrides (value parsed as YAML) to a raw config dict; a key that moved
    (``legacy.MOVED``) is set at its new place, its deprecation note appended to ``notes``."""
    for item in overrides or []:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(
                f"override {item!r} is not of the form key.path=value", hint="e.g. --set params.learning_rate=1e-4"
            )
        node = raw
        parts = _override_key(key, notes).split(".")
        for p in parts[:-1]:
            if not isinstance(node.setdefault(p, {}), dict):
                raise ConfigError(f"override {item!r}: {p} is not a section")
            node = node[p]
        try:
            node[parts[-1]] = yaml.safe_load(text) if text.strip() else ""
        except yaml.YAMLError as e:
            raise ConfigError(f"override {item!r}: value is not valid YAML ({e})") from None
    return raw


def _override_key(key: str, notes: list[str] | None = None) -> str:
    """An override's dotted key at its current place (``legacy.new_key``)."""
    current, note = new_key(key.strip())
    if note and notes is not None and note not in notes:
        notes.append(note)
    return current


def _line_index(text: str) -> dict[tuple, int]:
    """Map key paths (tuples of keys / list indices) to 1-based YAML line numbers."""
    out: dict[tuple, int] = {}

    def walk(node: Any, path: tuple) -> None:
        out[path] = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                out[path + (k.value,)] = k.start_mark.line + 1
                walk(v, path + (k.value,))
                out[path + (k.value,)] = k.start_mark.line + 1  # the key's line, not its value's
        elif isinstance(node, yaml.SequenceNode):
            for i, v in enumerate(node.value):
                walk(v, path + (i,))

    try:
        root = yaml.compose(text)
    except yaml.YAMLError:
        return out
    if root is not None:
        walk(root, ())
    return out


def _describe(err: Mapping[str, Any], source: str | None, lines: dict[tuple, int]) -> str:
    loc = tuple(err["loc"])
    path = ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in loc).replace(".[", "[") or "(root)"
    line = None
    for n in range(len(loc), -1, -1):
        if loc[:n] in lines:
            line = lines[loc[:n]]
            break
    where = f" ({source}, line {line})" if source and line else (f" ({source})" if source else "")
    value = err.get("input")
    shown = "" if err["type"] == "missing" else f": got {value!r}"
    allowed = err["msg"]
    if err["type"] == "extra_forbidden":
        allowed = "unknown key (check the spelling; `hubgrpo config show` prints every valid key)"
    return f"{path}{where}{shown} — {allowed}"


def validate(raw: Any, *, source: str | None = None, text: str | None = None) -> Config:
    """Validate a raw dict into ``Config``; every problem named with its key path and YAML line."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source or 'config'}: the top level must be a mapping of keys, got {type(raw).__name__}")
    try:
        return Config.model_validate(raw)
    except ValidationError as e:
        lines = _line_index(text) if text else {}
        problems = [_describe(err, source, lines) for err in e.errors()]
        raise ConfigError(
            "invalid config:\n  " + "\n  ".join(problems),
            hint="fix the keys above; see configs/tiny.yaml for a complete example",
        ) from None


def _conflict(e: MovedKeyConflict, source: str | None, text: str | None) -> ConfigError:
    lines = _line_index(text) if text else {}
    at = " and ".join(f"line {lines[k]}" for k in (tuple(e.old.split(".")), tuple(e.new.split("."))) if k in lines)
    where = ", ".join(w for w in (source, at) if w)
    return ConfigError(f"{e}{f' ({where})' if where else ''}", hint=f"delete {e.old}")


def load_config(
    path: str | Path, overrides: list[str] | None = None, env: dict[str, str] | None = None, *, warn: bool = True
) -> Config:
    """Load, expand, override and validate a YAML config file."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read config {p}: {e.strerror}", hint="check the path") from None
    return loads(text, overrides=overrides, env=env, source=str(p), warn=warn)


def loads(
    text: str,
    *,
    overrides: list[str] | None = None,
    env: dict[str, str] | None = None,
    source: str | None = None,
    expand: bool = True,
    warn: bool = True,
) -> Config:
    """Parse a YAML config from a string (see ``load_config``). ``expand=False`` for a config read from a run repo:
    a ``${...}`` there stays that text (someone else wrote it; expanding it would read the reader's environment).
    Each key given at a place it moved from is logged as a warning (``warn``; ``deprecations`` lists them)."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f", line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{source or 'config'}{where}: not valid YAML: {getattr(e, 'problem', e)}") from None
    raw = {} if raw is None else raw
    found: dict[tuple, str] = {}
    notes: list[str] = []
    if isinstance(raw, dict):
        try:  # the file's keys that moved first: an override then wins over the file wherever either wrote it
            raw, notes = migrate(raw)
        except MovedKeyConflict as e:
            raise _conflict(e, source, text) from None
        raw = apply_overrides(expand_env(raw, env=env, found=found) if expand else raw, overrides, notes)
        for item in overrides or []:  # a value set on the command line is the user's own text
            key = tuple(_override_key(item.partition("=")[0]).split("."))
            found = {p: t for p, t in found.items() if tuple(map(str, p[: len(key)])) != key}
    cfg = validate(raw, source=source, text=text)
    cfg._from_env = found
    cfg._deprecations = notes + [n for n in cfg._deprecations if n not in notes]
    for note in cfg._deprecations if warn else ():  # once per load
        log.warning("%sdeprecated: %s", f"{source}: " if source else "", note)
    return cfg


def to_yaml(cfg: Config, *, redact: bool = True, drop_secrets: bool = False) -> str:
    """The resolved config as YAML; secrets are shown as '***' and every value that came from the environment as
    its placeholder (the text as written, e.g. ``${JUDGE_API_KEY}``) unless ``redact=False``; with
    ``drop_secrets=True`` (the copy stored in a run repo) secrets are left out (null) and values from the
    environment are placeholders too (``check_storable`` says where a stored copy may hold them)."""
    data = cfg.model_dump(mode="python")
    if redact or drop_secrets:
        for path, text in from_env(cfg).items():
            node = data
            for k in path[:-1]:
                node = node[k]
            node[path[-1]] = text
    for section, key in (("hub", "token"), ("coordinator", "secret")):
        secret = getattr(getattr(cfg, section), key)
        if secret is None or drop_secrets:
            data[section][key] = None
        else:
            data[section][key] = "***" if redact else secret.get_secret_value()
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


def _default_text(value) -> str:
    """A default as a config file would write it: models and lists of them as JSON, the rest as ``repr``."""
    if isinstance(value, BaseModel) or (isinstance(value, list) and value and isinstance(value[0], BaseModel)):
        data = (
            value.model_dump(mode="json")
            if isinstance(value, BaseModel)
            else [v.model_dump(mode="json") for v in value]
        )
        return json.dumps(data)
    return repr(value)


def field_docs(model: type[BaseModel] = Config, prefix: str = "") -> list[tuple[str, str, str]]:
    """(key path, default, description) for every field: the one place fields are documented."""
    rows = []
    for name, f in model.model_fields.items():
        ann = f.annotation
        key = f"{prefix}{name}"
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            rows += field_docs(ann, key + ".")
            continue
        default = "required" if f.is_required() else _default_text(f.get_default(call_default_factory=True))
        rows.append((key, default, f.description or ""))
    return rows
