"""boto3, loaded lazily (``load_boto3``: only when an ``s3://`` location is opened), and S3 answers mapped onto
``hubgrpo.errors`` (``map_s3_error``):

- 404 / ``NoSuchKey`` / ``NoSuchBucket`` → ``NotFound``;
- 412 ``PreconditionFailed`` (``IfNoneMatch="*"`` on an existing key, ``IfMatch`` on a changed one) →
  ``CommitConflict``; never retried here, the caller decides what it means;
- 409 ``ConditionalRequestConflict`` (a concurrent conditional write) → ``RepoBusy``, retried;
- 503 ``SlowDown``, other 5xx, 429, ``RequestTimeout``, timeouts and dropped connections → ``StoreUnavailable``,
  retried with bounded full-jitter backoff (``hubgrpo.store.retry``);
- 403 / bad or missing credentials → ``AuthError``.
"""

from __future__ import annotations

from hubgrpo.errors import AuthError, CommitConflict, ConfigError, NotFound, RepoBusy, StoreError, StoreUnavailable

_INSTALL = "pip install 'hubgrpo[s3]'"
_CRED_HINT = (
    "set AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), AWS_DEFAULT_REGION, and "
    "AWS_ENDPOINT_URL for MinIO or R2"
)
_NOT_FOUND = {"NoSuchKey", "NotFound", "404", "NoSuchBucket"}
_RETRY_CODES = {
    "SlowDown",
    "RequestTimeout",
    "InternalError",
    "ServiceUnavailable",
    "RequestTimeTooSkewed",
    "Throttling",
    "ThrottlingException",
    "TooManyRequests",
}
_AUTH_CODES = {
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "AllAccessDisabled",
}


def load_boto3():
    """``(boto3, botocore)``, or a ConfigError that says how to install them."""
    try:
        import boto3
        import botocore
        import botocore.config  # noqa: F401  (used through the module)
        import botocore.exceptions  # noqa: F401
    except ImportError:
        raise ConfigError(
            "s3:// locations need boto3, which is not installed", hint=f"{_INSTALL} (or pip install boto3)"
        ) from None
    return boto3, botocore


def map_s3_error(exc: Exception, *, where: str) -> StoreError:
    """A botocore exception as a hubgrpo error with a hint (see the module docstring)."""
    _, botocore = load_boto3()
    exceptions = botocore.exceptions
    if isinstance(exc, (exceptions.NoCredentialsError, exceptions.PartialCredentialsError)):
        return AuthError(f"{where}: no S3 credentials found", hint=_CRED_HINT)
    if isinstance(exc, exceptions.ClientError):
        err = exc.response.get("Error", {})
        code, status = str(err.get("Code", "")), exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        said = f" ({code}: {str(err.get('Message', ''))[:200]})" if code else ""
        if code == "NoSuchBucket":
            return NotFound(
                f"{where}: the bucket does not exist{said}",
                hint="create the run with `hubgrpo init`, which creates the bucket, or check the name",
            )
        if status == 404 or code in _NOT_FOUND:
            return NotFound(f"{where}: no such object{said}")
        if status == 412 or code == "PreconditionFailed":
            return CommitConflict(
                f"{where}: the object changed since it was read (412){said}", hint="re-read it and decide again"
            )
        if status == 409:
            return RepoBusy(f"{where}: a concurrent write to the same key (409){said}", hint="retry in a moment")
        if status in (401, 403) or code in _AUTH_CODES:
            return AuthError(f"{where}: the object store refused the credentials ({status}){said}", hint=_CRED_HINT)
        if status >= 500 or status in (408, 429) or code in _RETRY_CODES:
            return StoreUnavailable(
                f"{where}: the object store answered {status}{said}",
                hint="the operation is retried; check the endpoint (AWS_ENDPOINT_URL)",
            )
        return StoreError(f"{where}: the object store answered {status}{said}", hint="see the message above")
    if isinstance(exc, exceptions.BotoCoreError):  # connection refused or dropped, timeouts, truncated bodies
        return StoreUnavailable(
            f"{where}: no answer from the object store ({type(exc).__name__}: {exc})",
            hint="check AWS_ENDPOINT_URL and the network; the operation is safe to retry",
        )
    raise TypeError(f"not a botocore error: {type(exc).__name__}")
