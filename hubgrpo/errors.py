"""One tree of errors for hubgrpo.

Every error says what happened, why, and how to fix it (``hint``). The CLI turns any ``HubGrpoError`` into a
message, the hint and ``exit_code``; nothing else in the code base catches broadly. Hub HTTP status codes are
mapped onto this tree only in ``hubgrpo.store.hub``.
"""

from __future__ import annotations


class HubGrpoError(Exception):
    """Base class. ``hint`` tells the user what to do; ``code`` is a stable machine-readable reason."""

    exit_code = 1
    code = "error"

    def __init__(self, message: str, *, hint: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
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

    def __init__(self, message: str, *, wait_s: float = 60.0, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.wait_s = float(wait_s)


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

    def __init__(self, code: str, message: str, *, hint: str | None = None):
        super().__init__(message, hint=hint, code=code)


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
    """The coordinator refused a request on purpose (auth, rate limit, unknown worker, run finished)."""

    code = "refused"

    def __init__(self, code: str, message: str, *, hint: str | None = None):
        super().__init__(message, hint=hint, code=code)


_BY_NAME = {cls.__name__: cls for cls in [
    HubGrpoError, ConfigError, StoreError, NotFound, InvalidPath, CommitConflict, RepoBusy, RateLimited,
    StoreUnavailable, AuthError, LeaseError, InvalidSubmission, ModelError, DataError, RewardError, MergeError,
    CoordinatorError, Refused,
]}


def from_dict(d: dict) -> HubGrpoError:
    """Rebuild an error sent over the coordinator API by ``HubGrpoError.to_dict``."""
    cls = _BY_NAME.get(d.get("error", ""), HubGrpoError)
    msg, hint, code = d.get("message", "unknown error"), d.get("hint"), d.get("code")
    if cls in (InvalidSubmission, Refused):
        return cls(code or "refused", msg, hint=hint)
    if cls is RateLimited:
        return RateLimited(msg, wait_s=float(d.get("wait_s", 60.0)), hint=hint)
    return cls(msg, hint=hint, code=code)
