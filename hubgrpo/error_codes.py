"""Every code an error on the wire can carry, in one registry: what it means and what a worker does about it.

An error crosses the wire as ``{"error": <class>, "code": <code>, "message", "hint"}`` (``errors.HubGrpoError``).
``CODES`` lists each (class, code) pair the code base raises; ``tests/unit/test_error_codes.py`` scans ``hubgrpo/`` and
fails on a code raised but not listed here, or listed but never raised. The worker's reactions come from here
(``stop_codes``), and ``docs/architecture.md``'s error table is generated from it (``markdown``;
``python -m hubgrpo.error_codes`` prints it; the test checks the document holds it).
"""

from __future__ import annotations

from dataclasses import dataclass

ACTIONS = {  # what the worker (or the evaluator, or the command) does; the order is the table's
    "finished": "stops: the run is done",
    "wait": "waits `wait_s` (capped at an hour), asks again",
    "stop": "stops with the message and its hint",
    "resume": "stops; starting the run again resumes it",
    "guard": "stops before writing anything",
    "lease": "drops the round, leases again",
    "refused": "the round is refused (recorded with its reason on the leaderboard); leases again",
    "evaluator": "the evaluator stops with the message",
    "retry": "retries with backoff",
    "command": "the command stops (no worker sees it)",
}


@dataclass(frozen=True)
class Code:
    error: str  # the class name on the wire
    code: str
    action: str  # a key of ACTIONS
    meaning: str = ""


def _codes(error: str, action: str, *pairs: str | tuple[str, str]) -> list[Code]:
    return [Code(error, p, action) if isinstance(p, str) else Code(error, p[0], action, p[1]) for p in pairs]


CODES: list[Code] = [
    *_codes("Refused", "finished", "finished"),
    *_codes(
        "Refused",
        "wait",
        ("budget", "the commit budget is reached, or this user's share of it"),
        ("rate", "too many calls from this user or address"),
        ("merging", "a lease asked during a merge"),
        ("lease_cap", "this user holds `coordinator.max_leases_per_user` live leases"),
        ("duplicate_worker", "another process holds a live lease under this worker name"),
    ),
    *_codes(
        "Refused",
        "stop",
        ("auth", "no token, an unknown one, or a user not in `coordinator.allowed_users`"),
        (
            "version",
            "the worker speaks another `layout.PROTOCOL_VERSION`; the hint is the install line of "
            "the coordinator's hubgrpo",
        ),
        ("excluded", "a participant a failed proof-of-rollouts verdict excluded (`coordinator.verify`)"),
    ),
    *_codes(
        "LeaseError",
        "lease",
        ("bad_signature", "the lease was not signed by this coordinator"),
        ("wrong_run", "the lease belongs to another run"),
        ("expired", "the lease's deadline passed"),
        ("lease", "a malformed lease"),
    ),
    *_codes(
        "InvalidSubmission",
        "refused",
        ("stale", "its base version is more than the staleness limit behind, or was lost by a restart"),
        ("unknown_base", "its base version is not one of the run's"),
        ("missing_file", "the folder or one of its adapter files is missing"),
        ("symlink", "the folder or a file in it is a link"),
        ("nested_dir", "the folder holds a folder"),
        ("not_safetensors", "a pickle-based weight file"),
        ("unexpected_file", "a file not allowed there"),
        ("empty_file", "a zero-byte file"),
        ("too_large", "the files exceed what one round can weigh"),
        ("bad_config", "adapter_config.json is not a JSON object"),
        ("nested_json", "JSON nested too deeply"),
        ("config_mismatch", "an adapter setting differs from the run's"),
        ("corrupt", "the safetensors file does not parse"),
        ("missing_keys", "tensors are missing"),
        ("extra_keys", "tensors the run's adapter does not have"),
        ("shape", "a tensor's shape differs"),
        ("dtype", "a tensor's dtype differs"),
        ("nonfinite", "NaN or infinity"),
        ("modified_base_weight", "a frozen base weight saved with the adapter differs"),
        ("norm_outlier", "the update is over 5x the typical recent round"),
        ("out_of_bounds", "an entry moved farther than the lease's AdamW steps can move it"),
        ("a_changed", "an ffa round changed the frozen A factors"),
        ("bad_rebase", "an ffa round's base cannot be rebased onto the current version"),
        ("no_record", "no submission.json"),
        ("bad_record", "submission.json is malformed"),
        ("lease_mismatch", "submission.json names another lease"),
        ("not_found", "the round's commit or files are not there"),
        ("bad_name", "a name that is not a name"),
        ("bad_commit", "a commit id that is not one"),
        ("bad_upload", "an upload that is not base64 files"),
        ("no_rollouts", "no rollouts.json.gz"),
        ("bad_rollouts", "rollouts.json.gz is malformed"),
        ("reward_mismatch", "the recomputed rewards differ from the round's"),
        ("reward_timeout", "a non-built-in reward ran past `coordinator.reward_timeout_s`"),
        ("excluded", "its participant was excluded by a failed proof-of-rollouts verdict"),
    ),
    *_codes(
        "InvalidSubmission",
        "evaluator",
        ("bad_eval", "a `record_eval` report that does not parse"),
        ("unknown_version", "a score for a version the run does not have"),
        ("bad_verdict", "a `record_verdict` report that does not parse, or a run with `coordinator.verify: off`"),
        ("unknown_submission", "a verdict on a round the coordinator has not admitted, or its files asked for"),
    ),
    *_codes(
        "CoordinatorError",
        "retry",
        ("unreachable", "no answer"),
        ("internal", "the coordinator failed"),
        ("protocol", "an answer that is not the API's"),
        ("auth_unavailable", "the Hub could not be asked who the token is"),
        ("unavailable", "the coordinator could not read a version's adapter yet"),
        ("closing", "it is shutting down"),
        ("upload_timeout", "an uploaded round still being committed"),
        ("bad_adapter", "a served version whose bytes do not hash to its id: nothing of it is kept"),
        ("not_found", "the version asked for is gone (the coordinator restarted, or it is too old)"),
    ),
    *_codes(
        "CoordinatorError",
        "stop",
        ("auth", "HTTP 401/403 from the coordinator"),
        ("config", "an `http://` URL with a token, or a bad URL"),
    ),
    *_codes("CoordinatorError", "resume", ("orphaned", "the `hubgrpo run` that started this worker is gone")),
    *_codes(
        "CoordinatorError",
        "guard",
        ("redirect", "a 3xx, or a request to another origin"),
        ("too_large", "an answer past the cap"),
        (
            "bad_lease",
            "a lease naming paths (not commit ids and names) or another worker, or asking more than the run's config "
            "allows; a renewal as another round (the worker keeps its lease)",
        ),
    ),
    *_codes("CoordinatorError", "command", ("live", "`hubgrpo gc` on a run that looks live")),
]

STOPPING = ("stop", "resume", "guard")  # actions after which a worker stops


def stop_codes() -> frozenset[str]:
    """Codes of coordinator answers after which a worker stops (besides ``finished``)."""
    return frozenset(c.code for c in CODES if c.action in STOPPING and c.error in ("Refused", "CoordinatorError"))


def markdown() -> str:
    """The error table of ``docs/architecture.md``: one row per class and action."""
    lines = ["| class | codes | what the worker does |", "|---|---|---|"]
    order = {a: i for i, a in enumerate(ACTIONS)}
    classes: list[str] = []
    for c in CODES:
        if c.error not in classes:
            classes.append(c.error)
    for error in classes:
        mine = [c for c in CODES if c.error == error]
        for n, action in enumerate(sorted({c.action for c in mine}, key=order.__getitem__)):
            listed = ", ".join(
                f"`{c.code}`" + (f" ({c.meaning})" if c.meaning else "") for c in mine if c.action == action
            )
            lines.append(f"| {f'`{error}`' if n == 0 else ''} | {listed} | {ACTIONS[action]} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
