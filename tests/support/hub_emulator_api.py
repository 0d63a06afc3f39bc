"""Endpoint handlers of the local Hub emulator (the Hub API huggingface_hub uses), apart from the HTTP server.

``HubApi.route(req)`` names the endpoint (the fault-injection key: ``commit``, ``preupload``, ``tree``, …) and returns
a thunk that computes the ``Resp``. Handlers raise ``HubError`` for error answers; the server turns those into a
status, ``X-Error-Code``/``X-Error-Message`` headers and a JSON body (no body on HEAD).
"""

from __future__ import annotations

import collections
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping
from urllib.parse import parse_qs, quote, unquote, urlencode

import yaml

from tests.support import hub_emulator_storage as storage
from tests.support.hub_emulator_jobs import JobsEmulator
from tests.support.hub_emulator_spaces import SpaceSettings
from tests.support.hub_emulator_state import HubError, HubState, Repo, iso, tree_items

# the Hub's answer past its hourly commit quota per repo (../shared/HUB_PROTOCOL.md); ~128 an hour, unpublished
QUOTA_MESSAGE = "You have exceeded our hourly quotas for action: commit. We invite you to retry later."
BUSY_MESSAGE = "Another commit operation is in progress for this repository. Please try again later."
TYPES = {"models": "model", "datasets": "dataset", "spaces": "space"}
URL_PREFIX = {"model": "", "dataset": "datasets/", "space": "spaces/"}


@dataclass
class Request:
    """One parsed HTTP request. ``path`` is raw (still %-quoted); ``user`` is set from the bearer token."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: Mapping[str, str]
    body: bytes
    base_url: str
    user: str | None = None

    def json(self) -> dict:
        return json.loads(self.body or b"{}")

    def arg(self, name: str, default: str = "") -> str:
        return self.query.get(name, [default])[0]

    def flag(self, name: str) -> bool:
        return self.arg(name).lower() in ("1", "true")


@dataclass
class Resp:
    """An answer: status, body bytes and headers (Content-Length is added by the server)."""

    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


def json_resp(obj, status: int = 200, headers: dict | None = None) -> Resp:
    return Resp(status, json.dumps(obj).encode(), {"Content-Type": "application/json", **(headers or {})})


def error_resp(err: HubError) -> Resp:
    """The Hub's error shape: ``X-Error-Code``/``X-Error-Message`` headers and ``{"error": message}``."""
    headers = dict(err.headers)
    if err.code:
        headers["X-Error-Code"] = err.code
        headers["X-Error-Message"] = err.message.encode("latin-1", "replace").decode("latin-1")
    return json_resp({"error": err.message, **err.body}, err.status, headers)


class HubApi:
    """The endpoints. ``latency_s`` is slept inside the commit critical section so that 409s are observable."""

    def __init__(self, state: HubState, users: Mapping[str, str], *, initial_commit: bool = True,
                 tree_page_size: int = 1000, commits_page_size: int = 50):
        self.state, self.users = state, dict(users)
        self.initial_commit = initial_commit
        self.tree_page_size, self.commits_page_size = tree_page_size, commits_page_size
        self.latency_s = 0.0
        self.orgs: dict[str, list[str]] = {}  # user -> org names, reported by whoami-v2
        self.spaces = SpaceSettings()  # Space variables and secrets (hub_emulator_spaces)
        self.jobs = JobsEmulator()  # HF Jobs run as local processes (hub_emulator_jobs)
        self.space_sdks: dict[str, str | None] = {}  # Space id -> the sdk it was created with
        self.counts = {"commits_applied": 0, "busy_409": 0, "quota_429": 0}
        self._count_lock = threading.Lock()
        # the Hub's hourly commit quota per repo (None: none); ``quota_clock`` may be a test's clock
        self.commit_quota: int | None = None
        self.quota_clock: Callable[[], float] = time.time
        self._commit_times: dict[str, collections.deque] = {}

    def _count(self, key: str) -> None:
        with self._count_lock:
            self.counts[key] += 1

    # -- routing -------------------------------------------------------------------------------------------
    def route(self, req: Request) -> tuple[str, Callable[[], Resp]]:
        """(endpoint name, thunk). Unknown tokens get 401 on every endpoint, like the Hub."""
        auth = req.headers.get("authorization") or ""
        token = auth[7:].strip() if auth.lower().startswith("bearer ") else None
        req.user = self.users.get(token) if token else None
        kind, thunk = self._dispatch(req, [unquote(s) for s in req.path.strip("/").split("/")])
        if token and req.user is None:
            return kind, lambda: _raise(HubError(401, "Invalid credentials in Authorization header",
                                                 code="Unauthorized"))
        return kind, thunk

    def _dispatch(self, req: Request, seg: list[str]) -> tuple[str, Callable[[], Resp]]:
        """Account, repo-management and ``/resolve/`` routes; repo API routes go to ``_dispatch_repo``."""
        m = req.method
        if seg[:2] == ["api", "whoami-v2"]:
            return "whoami", lambda: self.whoami(req)
        if seg[:2] == ["api", "validate-yaml"] and m == "POST":
            return "validate-yaml", lambda: self.validate_yaml(req)
        if seg[:3] == ["api", "repos", "create"] and m == "POST":
            return "create", lambda: self.create_repo(req)
        if seg[:3] == ["api", "repos", "delete"] and m == "DELETE":
            return "delete", lambda: self.delete_repo(req)
        if seg[:2] == ["api", "jobs"]:
            found = self.jobs.route(self, req, seg)
            if found:
                return found
        if len(seg) >= 4 and seg[0] == "api" and seg[1] in TYPES:
            return self._dispatch_repo(req, TYPES[seg[1]], f"{seg[2]}/{seg[3]}", seg[4:])
        t = TYPES.get(seg[0], "model") if seg and seg[0] in ("datasets", "spaces") else "model"
        rest = seg[1:] if t != "model" else seg
        if len(rest) >= 5 and rest[2] == "resolve" and m in ("GET", "HEAD"):
            return "resolve", lambda: self.resolve(req, t, f"{rest[0]}/{rest[1]}", rest[3], "/".join(rest[4:]))
        return "unknown", lambda: _raise(HubError(404, f"Sorry, we can't find the page {req.path}"))

    def _dispatch_repo(self, req: Request, t: str, rid: str, rest: list[str]) -> tuple[str, Callable[[], Resp]]:
        """Routes under ``/api/{type}s/{ns}/{name}/…``."""
        m, op = req.method, rest[0] if rest else ""
        arg = rest[1] if len(rest) > 1 else ""
        table: dict[tuple[str, str], tuple[str, Callable[[], Resp]]] = {
            ("GET", ""): ("info", lambda: self.repo_info(req, t, rid, None)),
            ("GET", "revision"): ("revision", lambda: self.repo_info(req, t, rid, arg)),
            ("POST", "preupload"): ("preupload", lambda: self.preupload(req, t, rid, arg)),
            ("POST", "commit"): ("commit", lambda: self.commit(req, t, rid, arg)),
            ("GET", "tree"): ("tree", lambda: self.tree(req, t, rid, arg, "/".join(rest[2:]))),
            ("POST", "paths-info"): ("paths-info", lambda: self.paths_info(req, t, rid, arg)),
            ("GET", "refs"): ("refs", lambda: self.refs(req, t, rid)),
            ("GET", "commits"): ("commits", lambda: self.commits(req, t, rid, arg)),
            ("POST", "branch"): ("branch", lambda: self.create_branch(req, t, rid, arg)),
            ("DELETE", "branch"): ("branch", lambda: self.delete_ref(req, t, rid, arg, "branches")),
            ("POST", "tag"): ("tag", lambda: self.create_tag(req, t, rid, arg)),
            ("DELETE", "tag"): ("tag", lambda: self.delete_ref(req, t, rid, arg, "tags")),
        }
        found = table.get((m, op)) or (self.spaces.route(self, req, rid, rest) if t == "space" else None) \
            or storage.route(self, req, t, rid, rest)
        return found or ("unknown", lambda: _raise(HubError(404, f"Unknown endpoint {req.path}")))

    # -- auth ----------------------------------------------------------------------------------------------
    def _repo(self, req: Request, t: str, rid: str, *, write: bool = False) -> Repo:
        """The repo if the caller may read it (and write it when ``write``); Hub-style 401/403/404 otherwise."""
        repo = self.state.repos.get((t, rid))
        if repo is None or (repo.private and req.user != repo.namespace):
            raise HubError(401 if req.user is None else 404, "Repository not found", code="RepoNotFound")
        if write and req.user != repo.namespace:
            raise HubError(403 if req.user else 401, f"You don't have the rights to write to {rid}: "
                           f"it belongs to '{repo.namespace}' and you are '{req.user}'")
        return repo

    def _commit_at(self, repo: Repo, rev: str):
        c = repo.resolve(rev)
        if c is None:
            raise HubError(404, f"Invalid rev id: {rev}", code="RevisionNotFound")
        return c

    # -- account and repos ---------------------------------------------------------------------------------
    def whoami(self, req: Request) -> Resp:
        if req.user is None:
            raise HubError(401, "Invalid credentials in Authorization header")
        orgs = [{"type": "org", "name": o, "fullname": o, "roleInOrg": "contributor"}
                for o in self.orgs.get(req.user, [])]
        return json_resp({"type": "user", "id": req.user, "name": req.user, "fullname": req.user, "orgs": orgs,
                          "auth": {"type": "access_token", "accessToken": {"displayName": "emulator",
                                                                           "role": "write"}}})

    def validate_yaml(self, req: Request) -> Resp:
        """README front matter must be a YAML mapping; a 400 with ``errors`` otherwise."""
        content = req.json().get("content", "")
        if content.startswith("---"):
            block = content.split("---", 2)[1] if content.count("---") >= 2 else ""
            try:
                meta = yaml.safe_load(block)
            except yaml.YAMLError as e:
                return json_resp({"errors": [{"message": f"Invalid YAML: {e}"}], "warnings": []}, 400)
            if meta is not None and not isinstance(meta, dict):
                return json_resp({"errors": [{"message": "Metadata must be a mapping"}], "warnings": []}, 400)
        return json_resp({"errors": [], "warnings": []})

    def repo_url(self, req: Request, t: str, rid: str) -> str:
        return f"{req.base_url}/{URL_PREFIX[t]}{rid}"

    def create_repo(self, req: Request) -> Resp:
        """Create in the caller's own namespace; 409 with ``url`` when it exists (``exist_ok`` reads it)."""
        if req.user is None:
            raise HubError(401, "You must be authenticated to create a repo")
        body = req.json()
        t, ns, name = body.get("type") or "model", body.get("organization") or req.user, body.get("name", "")
        rid = f"{ns}/{name}"
        if ns != req.user:
            raise HubError(403, f"You don't have the rights to create a repo under the namespace '{ns}'")
        with self.state.lock:
            if (t, rid) in self.state.repos:
                raise HubError(409, f"You already created this {t} repo", url=self.repo_url(req, t, rid))
            private = body.get("visibility") == "private" or bool(body.get("private"))
            self.state.create_repo(t, rid, private=private, author=req.user, initial_commit=self.initial_commit)
            if t == "space":
                self.space_sdks[rid] = body.get("sdk")
        return json_resp({"url": self.repo_url(req, t, rid), "name": rid, "id": rid})

    def delete_repo(self, req: Request) -> Resp:
        """``DELETE /api/repos/delete`` with a JSON body; owner only."""
        body = req.json()
        t = body.get("type") or "model"
        rid = f"{body.get('organization') or req.user}/{body.get('name', '')}"
        with self.state.lock:
            self._repo(req, t, rid, write=True)
            self.state.delete_repo(t, rid)
        return json_resp({})

    def repo_info(self, req: Request, t: str, rid: str, rev: str | None) -> Resp:
        """Repo info at ``main`` or at ``rev`` (``/revision/{rev}``): id, sha, siblings, dates."""
        with self.state.lock:
            repo = self._repo(req, t, rid)
            c = self._commit_at(repo, rev) if rev is not None else repo.resolve("main")
            return json_resp({
                "id": rid, "_id": rid, "author": repo.namespace, "sha": c.sha if c else None,
                "private": repo.private, "disabled": False, "gated": False, "tags": [], "downloads": 0,
                "likes": 0, "createdAt": iso(repo.created_at), "lastModified": iso(c.date if c else repo.created_at),
                "siblings": [{"rfilename": p} for p in sorted(c.tree)] if c else [],
            })

    # -- commits -------------------------------------------------------------------------------------------
    def preupload(self, req: Request, t: str, rid: str, rev: str) -> Resp:
        """Every file is 'regular' (content travels base64 in the commit); ``oid`` = the current blob id."""
        with self.state.lock:
            repo = self._repo(req, t, rid, write=True)
            c = repo.resolve(rev)
            tree = c.tree if c else {}
            files = [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": tree.get(f["path"])}
                     for f in req.json().get("files", [])]
        return json_resp({"files": files, "commitOid": c.sha if c else None})

    def commit(self, req: Request, t: str, rid: str, rev: str) -> Resp:
        """The NDJSON commit: one at a time per repo (409 while busy), 412 on a stale ``parentCommit``."""
        with self.state.lock:
            repo = self._repo(req, t, rid, write=True)
            if req.flag("create_pr"):
                raise HubError(400, "create_pr is not supported by the emulator")
            if rev not in repo.branches and (repo.branches or rev != "main"):
                if repo.resolve(rev) is not None:
                    raise HubError(400, f"Invalid rev id: {rev} is not a branch")
                raise HubError(404, f"Invalid rev id: {rev}", code="RevisionNotFound")
        try:
            lines = [json.loads(line) for line in req.body.splitlines() if line.strip()]
        except ValueError as e:
            raise HubError(400, f"Invalid NDJSON payload: {e}") from e
        if not lines or lines[0].get("key") != "header":
            raise HubError(400, "The first NDJSON line must be the header")
        if not repo.commit_lock.acquire(blocking=False):
            self._count("busy_409")
            raise HubError(409, BUSY_MESSAGE)
        try:
            if self.latency_s:
                time.sleep(self.latency_s)
            self._spend_quota(f"{t}/{rid}")
            with self.state.lock:
                c = self.state.apply_commit(repo, rev, lines[0].get("value") or {}, lines[1:], req.user)
                self._count("commits_applied")
        finally:
            repo.commit_lock.release()
        return json_resp({"success": True, "commitOid": c.sha, "pullRequestUrl": None,
                          "commitUrl": f"{self.repo_url(req, t, rid)}/commit/{c.sha}"})

    def _spend_quota(self, key: str) -> None:
        """One commit of ``key``'s rolling-hour quota, or the Hub's 429 (no wait header: the Hub names none)."""
        if self.commit_quota is None:
            return
        now = self.quota_clock()
        with self._count_lock:
            times = self._commit_times.setdefault(key, collections.deque())
            while times and times[0] <= now - 3600:
                times.popleft()
            if len(times) >= self.commit_quota:
                self.counts["quota_429"] += 1
                raise HubError(429, QUOTA_MESSAGE)
            times.append(now)

    # -- listing -------------------------------------------------------------------------------------------
    def tree(self, req: Request, t: str, rid: str, rev: str, path: str) -> Resp:
        """Tree entries, paginated with ``Link: <…&cursor=N>; rel="next"`` (50 per page with expand)."""
        with self.state.lock:
            repo = self._repo(req, t, rid)
            c = self._commit_at(repo, rev) if repo.branches or rev != "main" else None
            items = tree_items(c, path, req.flag("recursive"), self.state.sizes(), storage.lfs_info(self.state))
        size = min(50, self.tree_page_size) if req.flag("expand") else self.tree_page_size
        return self._page(req, items, int(req.arg("cursor", "0") or 0), size, "cursor")

    def _page(self, req: Request, items: list, start: int, size: int, param: str, step: int | None = None) -> Resp:
        """One page of ``items`` with a GitHub-style ``Link`` header to the next page when there is one."""
        page, headers = items[start:start + size], {}
        if start + size < len(items):
            query = {k: v[0] for k, v in req.query.items() if k != param}
            query[param] = str(start + size if step is None else step)
            headers["Link"] = f'<{req.base_url}{req.path}?{urlencode(query)}>; rel="next"'
        return json_resp(page, headers=headers)

    def paths_info(self, req: Request, t: str, rid: str, rev: str) -> Resp:
        form = parse_qs(req.body.decode(), keep_blank_values=True)
        with self.state.lock:
            repo = self._repo(req, t, rid)
            c = self._commit_at(repo, rev)
            items = tree_items(c, "", True, self.state.sizes(), storage.lfs_info(self.state))
            everything = {i["path"]: i for i in items}
        return json_resp([everything[p] for p in form.get("paths", []) if p in everything])

    def refs(self, req: Request, t: str, rid: str) -> Resp:
        """Branches and tags with their target commits (plus ``pullRequests`` when asked)."""
        with self.state.lock:
            repo = self._repo(req, t, rid)
            out = {"branches": [{"name": n, "ref": f"refs/heads/{n}", "targetCommit": s}
                                for n, s in sorted(repo.branches.items())],
                   "converts": [],
                   "tags": [{"name": n, "ref": f"refs/tags/{n}", "targetCommit": s}
                            for n, s in sorted(repo.tags.items())]}
        if req.flag("include_prs"):
            out["pullRequests"] = []
        return json_resp(out)

    def commits(self, req: Request, t: str, rid: str, rev: str) -> Resp:
        """History from ``rev``, newest first, ``commits_page_size`` per page (``?p=N``)."""
        with self.state.lock:
            repo = self._repo(req, t, rid)
            if not repo.branches and rev == "main":
                return json_resp([])
            history = list(repo.history(self._commit_at(repo, rev)))
        formatted = "formatted" in req.query.get("expand[]", [])
        items = []
        for c in history:
            item = {"id": c.sha, "title": c.title, "message": c.message, "date": iso(c.date),
                    "authors": [{"user": c.author, "avatar": ""}]}
            if formatted:
                item["formatted"] = {"title": c.title, "message": c.message}
            items.append(item)
        p, size = int(req.arg("p", "0") or 0), self.commits_page_size
        return self._page(req, items, p * size, size, "p", step=p + 1)

    # -- refs ----------------------------------------------------------------------------------------------
    def create_branch(self, req: Request, t: str, rid: str, branch: str) -> Resp:
        """A branch at ``startingPoint`` (default main); 409 if the name is taken."""
        start = req.json().get("startingPoint")
        with self.state.lock:
            repo = self._repo(req, t, rid, write=True)
            if branch in repo.branches or branch in repo.tags:
                raise HubError(409, f"Reference refs/heads/{branch} already exists")
            repo.branches[branch] = self._commit_at(repo, start or "main").sha
            self.state.save_refs(repo)
        return json_resp({})

    def create_tag(self, req: Request, t: str, rid: str, rev: str) -> Resp:
        """A tag on ``rev``; 409 if the name is taken, 404 RevisionNotFound for an unknown ``rev``."""
        tag = req.json().get("tag") or ""
        with self.state.lock:
            repo = self._repo(req, t, rid, write=True)
            if not tag or tag.startswith("refs/") or any(ch in tag for ch in " ~^:?*[\\"):
                raise HubError(400, f"Invalid tag name {tag!r}")
            if tag in repo.tags or tag in repo.branches:
                raise HubError(409, f"Tag '{tag}' already exists")
            repo.tags[tag] = self._commit_at(repo, rev).sha
            self.state.save_refs(repo)
        return json_resp({})

    def delete_ref(self, req: Request, t: str, rid: str, name: str, kind: str) -> Resp:
        """Delete a branch or a tag; main cannot be deleted."""
        with self.state.lock:
            repo = self._repo(req, t, rid, write=True)
            refs = getattr(repo, kind)
            if name not in refs:
                raise HubError(404, f"Invalid rev id: {name}", code="RevisionNotFound")
            if kind == "branches" and name == "main":
                raise HubError(403, "You cannot delete the default branch")
            del refs[name]
            self.state.save_refs(repo)
            storage.collect_garbage(self.state)  # what only that ref reached is reclaimed
        return json_resp({})

    # -- download ------------------------------------------------------------------------------------------
    def resolve(self, req: Request, t: str, rid: str, rev: str, path: str) -> Resp:
        """File bytes with ``X-Repo-Commit``, ``ETag`` (git blob id), ``Content-Length`` and Range support."""
        with self.state.lock:
            repo = self._repo(req, t, rid)
            c = self._commit_at(repo, rev)
            oid = c.tree.get(path)
            if oid is None:
                raise HubError(404, "Entry not found", code="EntryNotFound", headers={"X-Repo-Commit": c.sha})
            data = self.state.blobs[oid]
        headers = {"X-Repo-Commit": c.sha, "ETag": f'"{oid}"', "Accept-Ranges": "bytes",
                   "Content-Type": "application/octet-stream",
                   "Content-Disposition": f"inline; filename*=UTF-8''{quote(path.rsplit('/', 1)[-1])}"}
        rng = req.headers.get("range")
        if not rng:
            return Resp(200, data, headers)
        return _ranged(data, rng, headers)


def _ranged(data: bytes, rng: str, headers: dict) -> Resp:
    """A 206 for ``bytes=a-b`` / ``bytes=a-`` / ``bytes=-n``; 416 when unsatisfiable."""
    try:
        unit, spec = rng.split("=", 1)
        a, b = spec.split(",")[0].strip().split("-", 1)
        if a == "":
            start, end = max(0, len(data) - int(b)), len(data) - 1
        else:
            start, end = int(a), min(int(b) if b else len(data) - 1, len(data) - 1)
        if unit.strip() != "bytes" or start > end or start >= len(data):
            raise ValueError(rng)
    except ValueError:
        return Resp(416, b"", {**headers, "Content-Range": f"bytes */{len(data)}"})
    return Resp(206, data[start:end + 1], {**headers, "Content-Range": f"bytes {start}-{end}/{len(data)}"})


def _raise(err: Exception):
    raise err
