"""One tree of errors for hubgrpo.

Every error says what happened, why, and how to fix it (``hint``). The CLI turns any ``HubGrpoError`` into a
message, the hint and ``exit_code``; nothing else in the code base catches broadly. Hub HTTP status codes are
mapped onto this tree only in ``hubgrpo.store.hub``.
"""

from __future__ import annotations

import math
import re

MAX_WAIT_S = 3600.0  # the longest a worker sleeps on a coordinator's word (a refusal's wait_s or hint, a 429)
MAX_ERROR_TEXT = 2000  # characters kept of a message or hint that came over the wire
MAX_CODE = 64  # characters kept of an error code that came over the wire
_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")  # all but newline: no terminal escapes from a server


class HubGrpoError(Exception):
    """Base class. ``hint`` tells the user what to do; ``code`` is a stable machine-readable reason."""

    exit_code = 1
    code = "error"

    def __init__(self, message: str, *, hint: str | None = None, code: str | None = None, wait_s: float | None = None):
        """``wait_s``: seconds to wait before asking again, when the error says (a refusal with a wait, a 429);
        None when it does not. Carried over the wire beside ``to_dict`` (``hubgrpo.space.wire.error_dict``)."""
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.wait_s: float | None = None if wait_s is None else float(wait_s)
        if code is not None:
            self.code = code

    def __str__(self) -> str:  # message, then the hint on its own line
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"

    def to_dict(self) -> dict:
        """JSON form used when an error crosses the coordinator API."""
        return {"error": type(self).__name__, "code": self.code, "message": self.message, "hint": self.hint}


class ConfigError(HubGrpoError):
    """A config file or override is invalid (names the key path, the value, what is allowed, the YAML line)."""

    exit_code = 2
    code = "config"


class StoreError(HubGrpoError):
    """Reading or writing the run repo (local directory or Hub) failed."""

    code = "store"


class NotFound(StoreError):
    """A repo, revision or file does not exist."""

    code = "not_found"


class InvalidPath(StoreError):
    """A path in the repo is absolute, contains '..' or backslashes, or is otherwise unsafe."""

    exit_code = 2
    code = "invalid_path"


class CommitConflict(StoreError):
    """Compare-and-swap failed: the branch head moved since ``parent`` was read (Hub 412)."""

    code = "commit_conflict"


class RepoBusy(StoreError):
    """Another commit is in progress on the repo (Hub 409); the head has not moved, retry."""

    code = "repo_busy"


class RateLimited(StoreError):
    """The Hub answered 429 (API rate limit or the hourly commit quota). ``wait_s`` is how long to wait."""

    code = "rate_limited"
    wait_s: float  # always set

    def __init__(self, message: str, *, wait_s: float = 60.0, hint: str | None = None):
        super().__init__(message, hint=hint, wait_s=wait_s)


class StoreUnavailable(StoreError):
    """The store did not answer (5xx, timeouts) after bounded retries."""

    code = "unavailable"


class AuthError(StoreError):
    """Missing or invalid token, or no write access (Hub 401/403)."""

    code = "auth"


class LeaseError(HubGrpoError):
    """A lease is unknown, forged, expired or already used."""

    code = "lease"


class InvalidSubmission(HubGrpoError):
    """A submission was refused. ``code`` is a machine-readable reason (e.g. ``nan``, ``shape``, ``stale``)."""

    code = "invalid_submission"

    def __init__(self, code: str, message: str, *, hint: str | None = None, wait_s: float | None = None):
        super().__init__(message, hint=hint, code=code, wait_s=wait_s)


class ModelError(HubGrpoError):
    """A base model could not be loaded, or an adapter does not fit it."""

    code = "model"


class DataError(HubGrpoError):
    """Prompts could not be loaded or do not have the expected columns."""

    code = "data"


class RewardError(HubGrpoError):
    """A reward function could not be loaded, raised, or returned something that is not one float per completion."""

    code = "reward"


class MergeError(HubGrpoError):
    """Adapters cannot be merged (incompatible configs, unsupported adapter kinds such as DoRA)."""

    code = "merge"


class CoordinatorError(HubGrpoError):
    """The coordinator refused a request or could not be reached."""

    code = "coordinator"


class Refused(CoordinatorError):
    """The coordinator refused a request on purpose (auth, rate limit, unknown worker, run finished); ``wait_s``:
    when to ask again (a rate limit, the commit budget, a merge), None for a refusal that waiting does not lift."""

    code = "refused"

    def __init__(self, code: str, message: str, *, hint: str | None = None, wait_s: float | None = None):
        super().__init__(message, hint=hint, code=code, wait_s=wait_s)


_BY_NAME = {
    cls.__name__: cls
    for cls in [
        HubGrpoError,
        ConfigError,
        StoreError,
        NotFound,
        InvalidPath,
        CommitConflict,
        RepoBusy,
        RateLimited,
        StoreUnavailable,
        AuthError,
        LeaseError,
        InvalidSubmission,
        ModelError,
        DataError,
        RewardError,
        MergeError,
        CoordinatorError,
        Refused,
    ]
}


def wait_seconds(value: object, default: float) -> float:
    """A wait someone else suggested, as seconds in [0, MAX_WAIT_S]; ``default`` for anything that is not a
    finite number (a string, NaN, a list...). Every sleep fed by a coordinator's number goes through here."""
    try:
        wait = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return min(max(float(default), 0.0), MAX_WAIT_S)
    if math.isnan(wait):
        return min(max(float(default), 0.0), MAX_WAIT_S)
    return min(max(wait, 0.0), MAX_WAIT_S)


def wire_text(value: object, limit: int = MAX_ERROR_TEXT) -> str:
    """A string that came over the wire, made safe to show: a string (else ''), control characters but newlines
    replaced, at most ``limit`` characters."""
    if not isinstance(value, str):
        return ""
    text = _CONTROL.sub("?", value[: limit + 1])
    return text if len(text) <= limit else text[: limit - 1] + "…"


def from_dict(d: object) -> HubGrpoError:
    """Rebuild an error sent over the coordinator API by ``HubGrpoError.to_dict``. The sender is not trusted:
    whatever ``d`` is, this returns an error (unknown classes become ``HubGrpoError``), with its message and hint
    cut to ``MAX_ERROR_TEXT``, its code to ``MAX_CODE`` and a ``wait_s`` within [0, MAX_WAIT_S] (one that is not
    a number: 60 s for a ``RateLimited``, 30 s for any other error)."""
    if not isinstance(d, dict):
        d = {"message": f"a malformed error from the coordinator: {str(d)[:200]}"}
    name = d.get("error")
    cls = _BY_NAME.get(name, HubGrpoError) if isinstance(name, str) else HubGrpoError
    msg = wire_text(d.get("message")) or "unknown error"
    hint = wire_text(d.get("hint")) or None
    code = wire_text(d.get("code"), MAX_CODE) or None
    if cls is RateLimited:
        return RateLimited(msg, wait_s=wait_seconds(d.get("wait_s"), 60.0), hint=hint)
    wait = wait_seconds(d["wait_s"], 30.0) if "wait_s" in d else None  # never sleep for ever on a server's word
    if cls in (InvalidSubmission, Refused):
        return cls(code or "refused", msg, hint=hint, wait_s=wait)
    return cls(msg, hint=hint, code=code, wait_s=wait)
