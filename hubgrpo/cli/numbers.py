"""Number options of the CLI: refused before any work when they are not finite (nan, inf, or 1e400, which parses
as inf), or not positive where only a positive number makes sense, with a message naming the option."""

from __future__ import annotations

import math


def require_finite(
    options: dict[str, float | None], positive: tuple[str, ...] = (), at_most: dict[str, float] | None = None
) -> None:
    """Raise ConfigError (exit 2) for the first option in ``options`` (name → value; None = not given) whose value
    is not a finite number, or, for a name in ``positive``, is not above 0, or is above its ``at_most`` bound."""
    from hubgrpo.errors import ConfigError

    for name, value in options.items():
        if value is None:
            continue
        if not math.isfinite(value):
            big = " (a number past ~1.8e308, such as 1e400, reads as inf)" if math.isinf(value) else ""
            raise ConfigError(f"{name} {value} is not a finite number{big}", hint=f"pass a plain number to {name}")
        if name in positive and value <= 0:
            raise ConfigError(f"{name} {value} must be above 0", hint=f"pass a positive number to {name}")
        if at_most and name in at_most and value > at_most[name]:
            raise ConfigError(
                f"{name} {value} is above its limit of {at_most[name]:g}",
                hint=f"pass at most {at_most[name]:g} to {name}",
            )
