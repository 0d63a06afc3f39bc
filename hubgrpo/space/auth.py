"""Who may call the coordinator: Hugging Face tokens resolved with ``whoami``, an allow-list, a per-user rate limit.

``make_auth(coord)`` returns the ``auth(token, request) -> user`` hook that ``hubgrpo.space.api.build_app`` calls on
every mutating endpoint (``lease``, ``heartbeat``, ``release``, ``submit``, ``verdict`` and the Space's ``upload``):

1. The token is the ``token`` argument a gradio_client user sends with each call; else the ``Authorization:
   Bearer`` header (what the hubgrpo client sends), else gradio_client's ``X-HF-Authorization``; else, on a Space
   with ``hf_oauth: true``, the access token of the browser's OAuth session.
2. A string that cannot be a Hugging Face token (``plausible_token``: ``hf_`` then 8 to 100 letters, digits or
   ``_``, or an ``hf_jwt_`` token) is refused without a lookup. Otherwise ``HfApi(endpoint=...).whoami(token)``
   names the user and their orgs. Answers are cached per SHA-256 of the token (5 minutes; unknown tokens 30 s), so
   the strictly rate-limited ``whoami-v2`` is called rarely; one lookup at a time per token (the others asking
   for it wait for its answer); and lookups (cache misses) are limited before anyone is known: per client address
   (``LOOKUPS_PER_ADDRESS``) and in all (``LOOKUPS``) per minute, refused with ``Refused("rate")`` and a
   ``wait_s``. Tokens are never logged, shown or kept in clear (only their hash is a cache key).
3. The user is admitted when their name or one of their orgs (``orgs[].name``) is in ``coordinator.allowed_users``.
   An empty list means the owner of the run repo only (the namespace of its Hub repo id). Held-out scores
   (``record_eval``) are admitted from ``coordinator.evaluators`` only (``HubAuth.evaluator``; empty: the Hub
   owner, and nobody for a repo without one, e.g. on S3): with ``merge.eval_gate`` a score decides where merges
   start, so training rounds alone give no say in it. For a repo with no Hub owner and an empty list there is no
   one to check against: ``make_auth`` returns None and the API is open (no auth, no rate limit) — allowed only
   on a loopback address (``hubgrpo.space.api.check_exposure`` refuses anything else).
4. A token bucket per user (``coordinator.rate_limit_per_minute`` calls, refilled continuously, clock injected)
   refuses bursts with ``Refused("rate", ...)`` carrying ``wait_s``.

``HubAuth.identify`` is step 1-3 without the rate limit of step 4 (member of the allowed users or the evaluators):
the check that runs on the headers, before a body is read (``hubgrpo.space.guard``, ``hubgrpo.space.routes``).
Refusals are ``Refused("auth", ...)`` with a hint; a Hub that cannot be reached is a ``CoordinatorError`` with code
``auth_unavailable`` (the worker retries it, unlike a refusal). No gradio import here.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hubgrpo.errors import CoordinatorError, Refused

if TYPE_CHECKING:
    from hubgrpo.coordinator.core import Coordinator

log = logging.getLogger("hubgrpo.space.auth")

LOOKUPS_PER_ADDRESS = 20  # whoami lookups (cache misses) per client address per minute, before anyone is known
LOOKUPS = 120  # whoami lookups per minute in all
LOOKUP_WAIT_S = 30.0  # longest a request waits for another request's lookup of the same token
_TOKEN = re.compile(r"hf_[A-Za-z0-9_]{8,100}|hf_jwt_[A-Za-z0-9_.-]{16,4096}")

WhoAmI = Callable[[str], dict]
"""``whoami(token) -> {"name": ..., "orgs": [{"name": ...}, ...]}``; raises ``PermissionError`` for a bad token."""


def token_key(token: str) -> str:
    """The cache key of a token: its SHA-256 (the token itself is never stored)."""
    return hashlib.sha256(token.encode()).hexdigest()


def plausible_token(token: str) -> bool:
    """Whether ``token`` can be a Hugging Face token: ``hf_`` and 8 to 100 letters, digits or ``_`` (user access
    tokens are ``hf_`` + 34 letters; OAuth ones ``hf_oauth_…``; the test Hub's ``hf_test_alice_token``), or an
    OIDC ``hf_jwt_…`` token. Anything else is refused without asking the Hub."""
    return isinstance(token, str) and _TOKEN.fullmatch(token) is not None


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
            raise CoordinatorError(
                f"could not check the token with the Hub ({status})",
                code="auth_unavailable",
                hint="the Hub's whoami endpoint failed; retry in a minute",
            ) from None
        except Exception as e:  # deliberate: network failures of any transport library
            raise CoordinatorError(
                f"could not reach the Hub to check the token ({type(e).__name__})",
                code="auth_unavailable",
                hint="retry in a minute",
            ) from None

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
            raise Refused(
                "rate",
                f"{key} is over the limit of {self.capacity:g} calls per minute; retry in {wait:.1f} s",
                hint=f"wait_s={wait:.1f}; call less often (heartbeat interval, retries)",
                wait_s=wait,
            )

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
    """The auth hook: resolves tokens (cached, one lookup per token at a time, lookups limited per client address
    and in all), checks the allow-list, then the user's rate limit."""

    def __init__(
        self,
        allowed: list[str],
        *,
        whoami: WhoAmI,
        rate_limit_per_minute: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        cache_s: float = 300.0,
        negative_cache_s: float = 30.0,
        evaluators: list[str] | None = None,
        lookups_per_address: float = LOOKUPS_PER_ADDRESS,
        lookups: float = LOOKUPS,
    ):
        """``evaluators``: who may record held-out scores (None or empty: nobody)."""
        if not allowed:
            raise ValueError("HubAuth needs at least one allowed user or org")
        self.allowed = {a.lower() for a in allowed}
        self.evaluators = {a.lower() for a in evaluators or ()}
        self.whoami, self.clock = whoami, clock
        self.cache_s, self.negative_cache_s = float(cache_s), float(negative_cache_s)
        self.limiter = RateLimiter(rate_limit_per_minute, clock=clock) if rate_limit_per_minute else None
        self.address_lookups = RateLimiter(lookups_per_address, clock=clock)
        self.all_lookups = RateLimiter(lookups, clock=clock)
        self._cache: dict[str, _Entry] = {}
        self._flights: dict[str, threading.Event] = {}  # token key -> set when its lookup has an answer
        self._lock = threading.Lock()
        self.lookups = 0  # whoami calls made (cache misses), for tests and the status page

    def __call__(self, token: str | None, request: Any = None) -> str:
        """Return the caller's user name, or raise ``Refused("auth" | "rate", ...)``."""
        return self._admit(token, request, self.allowed, "work on", "coordinator.allowed_users")

    def evaluator(self, token: str | None, request: Any = None) -> str:
        """Like calling the hook, for a held-out score: the caller must be in ``coordinator.evaluators``."""
        return self._admit(token, request, self.evaluators, "record held-out scores on", "coordinator.evaluators")

    def identify(self, token: str | None, request: Any = None) -> str:
        """The caller's user name when they may call this coordinator at all (an allowed user or an evaluator),
        without spending their rate limit: the check on a request's headers, before its body is read."""
        return self._admit(
            token, request, self.allowed | self.evaluators, "work on", "coordinator.allowed_users", limit=False
        )

    def _admit(
        self, token: str | None, request: Any, allowed: set[str], what: str, setting: str, limit: bool = True
    ) -> str:
        token = token or request_token(request)
        if not token:
            raise Refused(
                "auth",
                "no token was sent: this coordinator only works with authenticated workers",
                hint="set HF_TOKEN on the worker to a Hugging Face token (read access is enough)",
            )
        entry = self._resolve(token, client_address(request))
        if entry.name is None:
            raise Refused(
                "auth",
                "the Hub does not recognise this token (invalid, expired or revoked)",
                hint="create a new token at https://huggingface.co/settings/tokens and set HF_TOKEN",
            )
        if entry.name.lower() not in allowed and not allowed.intersection(o.lower() for o in entry.orgs):
            raise Refused(
                "auth",
                f"user {entry.name!r} may not {what} this run",
                hint=f"ask the run's owner to add you (or one of your orgs) to {setting}",
            )
        if limit and self.limiter is not None:
            self.limiter.check(entry.name)
        return entry.name

    def _resolve(self, token: str, address: str) -> _Entry:
        """The cached answer for ``token``, else one lookup (the only one for this token while it runs)."""
        if not plausible_token(token):
            raise Refused(
                "auth",
                "the token sent is not a Hugging Face token (hf_ followed by letters and digits)",
                hint="set HF_TOKEN to a token from https://huggingface.co/settings/tokens",
            )
        key = token_key(token)
        with self._lock:
            entry = self._cache.get(key)
            if entry is not None and entry.expires > self.clock():
                return entry
            flight = self._flights.get(key)
            if flight is None:
                self._spend_lookup(address)
                flight = self._flights[key] = threading.Event()
                leader = True
            else:
                leader = False
        if not leader:
            return self._await(key, flight)
        try:
            entry = self._lookup(token)
            with self._lock:
                if len(self._cache) > 10_000:
                    self._cache = {k: e for k, e in self._cache.items() if e.expires > self.clock()}
                self._cache[key] = entry
        finally:
            with self._lock:
                self._flights.pop(key, None)
            flight.set()
        log.debug("token %s… resolved to %s", key[:8], entry.name)
        return entry

    def _spend_lookup(self, address: str) -> None:
        """Count one lookup for ``address`` and in all (under the lock); ``Refused("rate")`` past either limit."""
        for limiter, key, who in ((self.address_lookups, address, f"from {address}"), (self.all_lookups, "*", "")):
            wait = limiter.take(key)
            if wait > 0:
                raise Refused(
                    "rate",
                    f"too many new tokens to check {who} (at most {limiter.capacity:g} a minute "
                    f"before anyone is known); retry in {wait:.1f} s".replace("  ", " "),
                    hint=f"wait_s={wait:.1f}; a worker's token is checked once, then remembered",
                    wait_s=wait,
                )

    def _await(self, key: str, flight: threading.Event) -> _Entry:
        """The answer of another request's lookup of the same token (no lock held while waiting)."""
        flight.wait(LOOKUP_WAIT_S)
        with self._lock:
            entry = self._cache.get(key)
        if entry is not None:
            return entry
        raise CoordinatorError(
            "could not check the token with the Hub",
            code="auth_unavailable",
            hint="the Hub's whoami endpoint did not answer; retry in a minute",
        )

    def _lookup(self, token: str) -> _Entry:
        """Ask the Hub (no lock held): the user and their orgs, or a refused token."""
        self.lookups += 1
        now = self.clock()
        try:
            info = self.whoami(token)
            orgs = tuple(str(o.get("name")) for o in info.get("orgs") or [] if isinstance(o, dict) and o.get("name"))
            return _Entry(now + self.cache_s, str(info["name"]), orgs)
        except PermissionError:
            return _Entry(now + self.negative_cache_s, None)


def client_address(request: Any) -> str:
    """The caller's address, the key of the pre-auth lookup limit: the TCP peer; on a Space (``SPACE_ID`` set, behind
    the Hub's proxy) the last ``X-Forwarded-For`` entry, the address the proxy itself saw."""
    raw = getattr(request, "request", None) or request
    headers = getattr(raw, "headers", None)
    if os.environ.get("SPACE_ID") and headers is not None:
        last = (headers.get("x-forwarded-for") or "").split(",")[-1].strip()
        if last:
            return last[:64]
    client = getattr(raw, "client", None)
    return str(getattr(client, "host", None) or "unknown")[:64]


def request_token(request: Any) -> str | None:
    """A token carried by the HTTP request: ``Authorization: Bearer`` (the hubgrpo client), else gradio_client's
    ``X-HF-Authorization: Bearer``, else a Space OAuth session's access token."""
    raw = getattr(request, "request", None) or request  # gr.Request wraps the Starlette request
    headers = getattr(raw, "headers", None)
    if headers is not None:
        for name in ("authorization", "x-hf-authorization"):
            value = headers.get(name) or ""
            if value[:7].lower() == "bearer " and value[7:].strip():
                return value[7:].strip()
    try:
        info = raw.session.get("oauth_info") if raw is not None else None
    except (AssertionError, AttributeError):  # no SessionMiddleware: the app does not run with hf_oauth
        return None
    return info.get("access_token") if isinstance(info, dict) else None


def repo_owner(coord: Coordinator) -> str | None:
    """The namespace of the run repo's Hub id (its owner); None for a repo with no Hub owner (a local path, S3)."""
    repo_id = getattr(coord.store, "repo_id", None)
    return repo_id.split("/")[0] if isinstance(repo_id, str) and "/" in repo_id else None


def allowed_for(coord: Coordinator) -> list[str]:
    """``coordinator.allowed_users``, or the run repo's Hub owner when the list is empty; an empty list for a repo
    with no Hub owner and no list (auth off)."""
    owner = repo_owner(coord)
    return list(coord.cfg.coordinator.allowed_users) or ([owner] if owner else [])


def evaluators_for(coord: Coordinator) -> list[str]:
    """``coordinator.evaluators``, or the run repo's Hub owner when the list is empty; nobody for a repo with no
    Hub owner (``allowed_users`` never makes a worker an evaluator)."""
    owner = repo_owner(coord)
    return list(coord.cfg.coordinator.evaluators) or ([owner] if owner else [])


def make_auth(
    coord: Coordinator,
    *,
    whoami: WhoAmI | None = None,
    endpoint: str | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> HubAuth | None:
    """The auth hook for a Coordinator (None = auth off: a repo with no Hub owner and no ``allowed_users``, which
    may be served on a loopback address only).

    ``endpoint`` defaults to the run repo's Hub endpoint (so a test Hub checks its own tokens), else
    ``HF_ENDPOINT`` / huggingface.co.
    """
    allowed = allowed_for(coord)
    if not allowed:
        log.warning(
            "auth is OFF: run repo %s has no Hub owner and no coordinator.allowed_users (serve it on a "
            "loopback address only)",
            coord.store.location,
        )
        return None
    evaluators = evaluators_for(coord)
    if not evaluators:
        log.warning(
            "nobody may record held-out scores: run repo %s has no Hub owner and no coordinator.evaluators",
            coord.store.location,
        )
    if whoami is None:
        whoami = hub_whoami(endpoint or getattr(coord.store, "endpoint", None))
    return HubAuth(
        allowed,
        whoami=whoami,
        rate_limit_per_minute=coord.cfg.coordinator.rate_limit_per_minute,
        clock=clock,
        evaluators=evaluators,
    )
