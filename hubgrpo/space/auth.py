"""Who may call the coordinator: Hugging Face tokens resolved with ``whoami``, an allow-list, a per-user rate limit.

``make_auth(coord)`` returns the ``auth(token, request) -> user`` hook that ``hubgrpo.space.api.build_app`` calls on
every mutating endpoint (``lease``, ``heartbeat``, ``release``, ``submit`` and the Space's ``upload``):

1. The token is the ``token`` argument the worker sends with each call; else the ``Authorization: Bearer`` header;
   else, on a Space with ``hf_oauth: true``, the access token of the browser's OAuth session.
2. ``HfApi(endpoint=...).whoami(token)`` names the user and their orgs. Answers are cached per SHA-256 of the token
   (5 minutes; unknown tokens 30 s), so the strictly rate-limited ``whoami-v2`` is called rarely. Tokens are never
   logged, shown or kept in clear (only their hash is a cache key).
3. The user is admitted when their name or one of their orgs (``orgs[].name``) is in ``coordinator.allowed_users``.
   An empty list means the owner of the run repo only (the namespace of its repo id). Held-out scores
   (``record_eval``) are admitted from ``coordinator.evaluators`` only (``HubAuth.evaluator``; empty: the owner):
   with ``merge.eval_gate`` a score decides where merges start, so training rounds alone give no say in it. For a **local** run repo with
   an empty list there is no owner to check against: ``make_auth`` returns None and the API is open (no auth, no
   rate limit) — fine on 127.0.0.1, never on a public Space.
4. A token bucket per user (``coordinator.rate_limit_per_minute`` calls, refilled continuously, clock injected)
   refuses bursts with ``Refused("rate", ...)`` carrying ``wait_s``.

Refusals are ``Refused("auth", ...)`` with a hint; a Hub that cannot be reached is a ``CoordinatorError`` with code
``auth_unavailable`` (the worker retries it, unlike a refusal). No gradio import here.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from hubgrpo.errors import CoordinatorError, Refused

log = logging.getLogger("hubgrpo.space.auth")

WhoAmI = Callable[[str], dict]
"""``whoami(token) -> {"name": ..., "orgs": [{"name": ...}, ...]}``; raises ``PermissionError`` for a bad token."""


def token_key(token: str) -> str:
    """The cache key of a token: its SHA-256 (the token itself is never stored)."""
    return hashlib.sha256(token.encode()).hexdigest()


def hub_whoami(endpoint: str | None = None) -> WhoAmI:
    """``whoami`` through ``HfApi(endpoint)``: 401 → ``PermissionError``; other failures → ``CoordinatorError``."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    api = HfApi(endpoint=endpoint, library_name="hubgrpo")

    def whoami(token: str) -> dict:
        try:
            return api.whoami(token=token)
        except HfHubHTTPError as e:
            status = getattr(e.response, "status_code", None)
            if status in (401, 403):
                raise PermissionError(f"the Hub refused the token ({status})") from None
            raise CoordinatorError(f"could not check the token with the Hub ({status})", code="auth_unavailable",
                                   hint="the Hub's whoami endpoint failed; retry in a minute") from None
        except Exception as e:  # deliberate: network failures of any transport library
            raise CoordinatorError(f"could not reach the Hub to check the token ({type(e).__name__})",
                                   code="auth_unavailable", hint="retry in a minute") from None

    return whoami


# ------------------------------------------------------------------------------------------------ rate limit


class RateLimiter:
    """A token bucket per key: ``per_minute`` calls in a burst, refilled at ``per_minute / 60`` per second."""

    def __init__(self, per_minute: float, *, clock: Callable[[], float] = time.monotonic, max_keys: int = 10_000):
        if per_minute <= 0:
            raise ValueError("per_minute must be positive")
        self.capacity, self.rate = float(per_minute), float(per_minute) / 60.0
        self.clock, self.max_keys = clock, max_keys
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, time of last update)
        self._lock = threading.Lock()

    def take(self, key: str) -> float:
        """Spend one call for ``key``: 0.0 when allowed, else the seconds until one call is available again."""
        now = self.clock()
        with self._lock:
            tokens, last = self._buckets.get(key, (self.capacity, now))
            tokens = min(self.capacity, tokens + (now - last) * self.rate)
            if tokens >= 1.0:
                self._buckets[key] = (tokens - 1.0, now)
                self._trim()
                return 0.0
            self._buckets[key] = (tokens, now)
            return (1.0 - tokens) / self.rate

    def check(self, key: str) -> None:
        """Raise ``Refused("rate", ..., wait_s)`` when ``key`` has no call left."""
        wait = self.take(key)
        if wait > 0:
            err = Refused("rate", f"{key} is over the limit of {self.capacity:g} calls per minute; retry in "
                          f"{wait:.1f} s", hint=f"wait_s={wait:.1f}; call less often (heartbeat interval, retries)")
            err.wait_s = wait
            raise err

    def _trim(self) -> None:
        """Forget the fullest buckets when too many keys are tracked (a full bucket equals a forgotten one)."""
        if len(self._buckets) > self.max_keys:
            for key, _ in sorted(self._buckets.items(), key=lambda kv: -kv[1][0])[: len(self._buckets) // 2]:
                del self._buckets[key]


# ------------------------------------------------------------------------------------------------ auth


@dataclass
class _Entry:
    expires: float
    name: str | None  # None: the token was refused
    orgs: tuple[str, ...] = ()


class HubAuth:
    """The auth hook: resolves tokens (cached), checks the allow-list, then the user's rate limit."""

    def __init__(self, allowed: list[str], *, whoami: WhoAmI, rate_limit_per_minute: float | None = None,
                 clock: Callable[[], float] = time.monotonic, cache_s: float = 300.0, negative_cache_s: float = 30.0,
                 evaluators: list[str] | None = None):
        if not allowed:
            raise ValueError("HubAuth needs at least one allowed user or org")
        self.allowed = {a.lower() for a in allowed}
        self.evaluators = {a.lower() for a in evaluators} if evaluators else set(self.allowed)
        self.whoami, self.clock = whoami, clock
        self.cache_s, self.negative_cache_s = float(cache_s), float(negative_cache_s)
        self.limiter = RateLimiter(rate_limit_per_minute, clock=clock) if rate_limit_per_minute else None
        self._cache: dict[str, _Entry] = {}
        self._lock = threading.Lock()
        self.lookups = 0  # whoami calls made (cache misses), for tests and the status page

    def __call__(self, token: str | None, request: Any = None) -> str:
        """Return the caller's user name, or raise ``Refused("auth" | "rate", ...)``."""
        return self._admit(token, request, self.allowed, "work on", "coordinator.allowed_users")

    def evaluator(self, token: str | None, request: Any = None) -> str:
        """Like calling the hook, for a held-out score: the caller must be in ``coordinator.evaluators``."""
        return self._admit(token, request, self.evaluators, "record held-out scores on", "coordinator.evaluators")

    def _admit(self, token: str | None, request: Any, allowed: set[str], what: str, setting: str) -> str:
        token = token or request_token(request)
        if not token:
            raise Refused("auth", "no token was sent: this coordinator only works with authenticated workers",
                          hint="set HF_TOKEN on the worker to a Hugging Face token (read access is enough)")
        entry = self._resolve(token)
        if entry.name is None:
            raise Refused("auth", "the Hub does not recognise this token (invalid, expired or revoked)",
                          hint="create a new token at https://huggingface.co/settings/tokens and set HF_TOKEN")
        if entry.name.lower() not in allowed and not allowed.intersection(o.lower() for o in entry.orgs):
            raise Refused("auth", f"user {entry.name!r} may not {what} this run",
                          hint=f"ask the run's owner to add you (or one of your orgs) to {setting}")
        if self.limiter is not None:
            self.limiter.check(entry.name)
        return entry.name

    def _resolve(self, token: str) -> _Entry:
        key, now = token_key(token), self.clock()
        with self._lock:
            entry = self._cache.get(key)
        if entry is not None and entry.expires > now:
            return entry
        self.lookups += 1
        try:
            info = self.whoami(token)
            orgs = tuple(str(o.get("name")) for o in info.get("orgs") or [] if isinstance(o, dict) and o.get("name"))
            entry = _Entry(now + self.cache_s, str(info["name"]), orgs)
        except PermissionError:
            entry = _Entry(now + self.negative_cache_s, None)
        with self._lock:
            if len(self._cache) > 10_000:
                self._cache = {k: e for k, e in self._cache.items() if e.expires > now}
            self._cache[key] = entry
        log.debug("token %s… resolved to %s", key[:8], entry.name)
        return entry


def request_token(request: Any) -> str | None:
    """A token carried by the HTTP request: ``Authorization: Bearer``, else a Space OAuth session's access token."""
    raw = getattr(request, "request", None) or request  # gr.Request wraps the Starlette request
    headers = getattr(raw, "headers", None)
    if headers is not None:
        value = headers.get("authorization") or ""
        if value.lower().startswith("bearer ") and value[7:].strip():
            return value[7:].strip()
    try:
        info = raw.session.get("oauth_info") if raw is not None else None
    except (AssertionError, AttributeError):  # no SessionMiddleware: the app does not run with hf_oauth
        return None
    return info.get("access_token") if isinstance(info, dict) else None


def allowed_for(coord) -> list[str]:
    """``coordinator.allowed_users``, or the run repo's namespace (its owner) when the list is empty and the repo
    is on the Hub; an empty list for a local repo with no list (auth off)."""
    allowed = list(coord.cfg.coordinator.allowed_users)
    if allowed:
        return allowed
    repo_id = getattr(coord.store, "repo_id", None)
    return [repo_id.split("/")[0]] if repo_id and "/" in repo_id else []


def make_auth(coord, *, whoami: WhoAmI | None = None, endpoint: str | None = None,
              clock: Callable[[], float] = time.monotonic) -> HubAuth | None:
    """The auth hook for a Coordinator (None = auth off: a local run repo with no ``allowed_users``).

    ``endpoint`` defaults to the run repo's Hub endpoint (so a test Hub checks its own tokens), else
    ``HF_ENDPOINT`` / huggingface.co.
    """
    allowed = allowed_for(coord)
    if not allowed:
        log.warning("auth is OFF: local run repo %s and no coordinator.allowed_users", coord.store.location)
        return None
    if whoami is None:
        whoami = hub_whoami(endpoint or getattr(coord.store, "endpoint", None))
    repo_id = getattr(coord.store, "repo_id", None) or ""
    evaluators = list(coord.cfg.coordinator.evaluators) or ([repo_id.split("/")[0]] if "/" in repo_id else allowed)
    return HubAuth(allowed, whoami=whoami, rate_limit_per_minute=coord.cfg.coordinator.rate_limit_per_minute,
                   clock=clock, evaluators=evaluators)
