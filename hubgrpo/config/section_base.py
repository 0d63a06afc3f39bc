"""The base of every config section: unknown keys refused, assignments validated, ``''`` read as unset."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @field_validator("*", mode="before")
    @classmethod
    def _blank_is_none(cls, v: Any, info) -> Any:
        """``${VAR:-}`` expands to ''; for optional fields that means "not set"."""
        f = cls.model_fields.get(info.field_name)
        if v == "" and f is not None and not f.is_required() and f.get_default() is None:
            return None
        return v
