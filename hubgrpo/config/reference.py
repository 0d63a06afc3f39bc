"""docs/config.md: every config key with its default and meaning, generated from the field descriptions (the one
place fields are documented) by ``hubgrpo config fields --markdown``, and the keys that moved (``legacy.MOVED``);
tests/system/test_config_reference.py keeps the file current."""

from __future__ import annotations

from pydantic import BaseModel

from hubgrpo.config.legacy import MOVED
from hubgrpo.config.loading import field_docs
from hubgrpo.config.sections import Config

HEADER = (
    "# Config reference\n\nEvery key of a hubgrpo config file, its default and what it does. Generated from "
    "the code by `hubgrpo config fields --markdown > docs/config.md`; do not edit by hand. "
    "`hubgrpo config show FILE` prints a config with every default filled in.\n"
)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown() -> str:
    """The reference: one table for the top-level keys, then one per section, in the order of ``Config``."""
    rows = field_docs()
    sections = {
        name: f
        for name, f in Config.model_fields.items()
        if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel)
    }
    out = [HEADER, "## Top level\n", "| key | default | meaning |", "|---|---|---|"]
    out += [f"| `{k}` | `{_cell(d)}` | {_cell(doc)} |" for k, d, doc in rows if "." not in k]
    for name, f in sections.items():
        doc = (f.annotation.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
        out += ["", f"## `{name}`\n", doc, "", "| key | default | meaning |", "|---|---|---|"]
        out += [f"| `{k}` | `{_cell(d)}` | {_cell(text)} |" for k, d, text in rows if k.startswith(name + ".")]
    out += ["", "## Moved keys\n", "Still read at their old place (file or `--set`), with a deprecation warning.", ""]
    out += [f"- `{old}` → `{new}`" for old, new in MOVED.items()]
    return "\n".join(out) + "\n"
