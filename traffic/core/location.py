"""Where a warehouse or an inbox lives on object storage: ``s3://bucket/prefix`` and how to reach it.

An S3-compatible store is named by a URL; the endpoint, region and credentials come from the
standard AWS variables (``AWS_ENDPOINT_URL``, ``AWS_REGION``, ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_ALLOW_HTTP``), as every S3 client reads
them. One ``ObjectLocation`` hands each client what it needs: an ``obstore`` store (conditional
puts, the lease), delta-rs's storage options, an Arrow filesystem, and Spark's ``s3a`` settings.
Credentials are never part of its text: ``str`` and ``repr`` show the URL and endpoint only.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Mapping
from urllib.parse import urlsplit

#: The URL schemes taken as S3 (``s3a`` is Hadoop's name for the same store).
SCHEMES = ("s3", "s3a")


class LocationError(ValueError):
    """An object-storage location that cannot be used; the message says which part and why."""


class StoreUnreachable(RuntimeError):
    """The store did not let a command start: it does not answer, the bucket is missing, or it refused the
    credentials. The message says which, in one line, and never shows a credential."""


#: What an S3 error's code means to the person who set the location up.
_REFUSALS = {
    "NoSuchBucket": "bucket {bucket!r} does not exist there: create it, or fix the warehouse's URL",
    "InvalidAccessKeyId": "it does not know this access key: check AWS_ACCESS_KEY_ID",
    "SignatureDoesNotMatch": "it refused the secret key: check AWS_SECRET_ACCESS_KEY",
    "AccessDenied": "these credentials may not use {bucket!r}: check the key's permissions",
    "ExpiredToken": "the session token has expired: renew AWS_SESSION_TOKEN",
    "InvalidToken": "it refused the session token: check AWS_SESSION_TOKEN",
}


def is_object_url(value) -> bool:
    """Whether a setting's value names object storage (``s3://…``) rather than a folder."""
    return isinstance(value, str) and value.split("://", 1)[0].lower() in SCHEMES and "://" in value


@dataclass(frozen=True)
class ObjectLocation:
    """A bucket and a key prefix on an S3-compatible store, with the settings to reach it."""

    bucket: str
    prefix: str  # no leading or trailing "/"; "" for the bucket's root
    endpoint: str | None = None
    region: str = "us-east-1"
    allow_http: bool = False
    _secrets: tuple[tuple[str, str], ...] = field(default=(), repr=False, compare=False)

    @classmethod
    def parse(cls, url: str, environ: Mapping[str, str] | None = None) -> "ObjectLocation":
        """``s3://bucket/prefix`` with the endpoint, region and credentials of ``environ`` (default: the
        process's environment)."""
        env = os.environ if environ is None else environ
        parts = urlsplit(url)
        shown = url if "@" not in parts.netloc else url.replace(parts.netloc, "***@" + parts.netloc.rsplit("@", 1)[1])
        if parts.scheme.lower() not in SCHEMES:
            raise LocationError(f"{shown!r} is not an object-storage URL (expected s3://bucket/prefix)")
        if not parts.netloc:
            raise LocationError(f"{shown!r} names no bucket (expected s3://bucket/prefix)")
        if parts.query or parts.fragment or "@" in parts.netloc:
            raise LocationError(f"{shown!r}: give the endpoint and credentials in AWS_* variables, not in the URL")
        prefix = parts.path.strip("/")
        if any(segment in ("", ".", "..") for segment in prefix.split("/")) and prefix:
            raise LocationError(f"{shown!r} has an empty, '.' or '..' segment in its prefix")
        endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None
        if endpoint and urlsplit(endpoint).scheme not in ("http", "https"):
            raise LocationError(f"AWS_ENDPOINT_URL {endpoint!r} is not an http(s) URL")
        allow = env.get("AWS_ALLOW_HTTP", "").lower() in ("1", "true", "yes") or bool(
            endpoint and endpoint.startswith("http://"))
        secrets = tuple((name, env[name]) for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                                       "AWS_SESSION_TOKEN") if env.get(name))
        return cls(parts.netloc, prefix, endpoint.rstrip("/") if endpoint else None,
                   env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1", allow, secrets)

    # -- text: never the credentials ----------------------------------------------------
    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/")

    def __str__(self) -> str:
        return self.url if not self.endpoint else f"{self.url} (at {self.endpoint})"

    def child(self, *names: str) -> "ObjectLocation":
        """The location ``names`` below this one (same store, same credentials)."""
        prefix = "/".join(p.strip("/") for p in (self.prefix, *names) if p.strip("/"))
        return ObjectLocation(self.bucket, prefix, self.endpoint, self.region, self.allow_http, self._secrets)

    def key(self, name: str = "") -> str:
        """The object key of ``name`` under the prefix."""
        return "/".join(p for p in (self.prefix, name.strip("/")) if p)

    @property
    def _secret(self) -> dict[str, str]:
        return dict(self._secrets)

    def _credentials(self, key_id: str, secret_key: str, token: str) -> dict[str, str]:
        """The access key, secret and session token under one client's names (none without an access key)."""
        secret = self._secret
        if "AWS_ACCESS_KEY_ID" not in secret:
            return {}
        named = {key_id: secret["AWS_ACCESS_KEY_ID"], secret_key: secret.get("AWS_SECRET_ACCESS_KEY", "")}
        if "AWS_SESSION_TOKEN" in secret:
            named[token] = secret["AWS_SESSION_TOKEN"]
        return named

    # -- clients ------------------------------------------------------------------------
    def store(self, timeout: float | None = None):
        """An ``obstore`` store rooted at the prefix: conditional puts by ETag (If-Match, If-None-Match). With
        ``timeout``, an impatient one: each request and all its retries (two) within that many seconds."""
        from obstore.store import S3Store  # deferred: only object-storage locations need it

        options, retry = {"allow_http": self.allow_http}, None
        if timeout is not None:
            options.update(connect_timeout=timedelta(seconds=5), timeout=timedelta(seconds=timeout))
            retry = {"max_retries": 2, "retry_timeout": timedelta(seconds=timeout)}
        return S3Store(self.bucket, prefix=self.prefix or None, config=self._store_config(), client_options=options,
                       retry_config=retry)

    def _store_config(self) -> dict:
        config = {"region": self.region, "conditional_put": "etag"}
        if self.endpoint:
            config["endpoint"] = self.endpoint
        credentials = self._credentials("access_key_id", "secret_access_key", "token")
        config.update(credentials or {"skip_signature": True})
        return config

    def check_reachable(self, timeout: float = 10.0) -> None:
        """One listing of the prefix, with few retries: raises ``StoreUnreachable`` saying in one line why a
        command cannot use this store (no answer, no such bucket, credentials refused). A command checks
        this first, so a mistyped endpoint fails in seconds instead of after every request's retries."""
        import obstore  # deferred: only object-storage locations need it

        try:
            obstore.list_with_delimiter(self.store(timeout), None)
        except Exception as error:  # noqa: BLE001 - obstore's errors are classified by what they say
            raise StoreUnreachable(f"{self}: {self._why(str(error))}") from None

    def _why(self, message: str) -> str:
        code = re.search(r"<Code>([A-Za-z]+)</Code>", message)
        if code:
            meaning = _REFUSALS.get(code.group(1), "it answered {code}")
            return meaning.format(bucket=self.bucket, code=code.group(1))
        status = re.search(r"status code: (\d{3})", message)
        if status:
            return f"it answered HTTP {status.group(1)}"
        if not self.endpoint:
            return f"AWS S3 (region {self.region}, no AWS_ENDPOINT_URL set) does not answer from here"
        return "it does not answer: check AWS_ENDPOINT_URL and that the store is running and reachable from here"

    def delta_options(self) -> dict[str, str]:
        """delta-rs's ``storage_options``: safe concurrent commits by conditional put, never an unsafe rename."""
        options = {"AWS_REGION": self.region, "conditional_put": "etag",
                   "AWS_ALLOW_HTTP": "true" if self.allow_http else "false"}
        if self.endpoint:
            options["AWS_ENDPOINT_URL"] = self.endpoint
        options.update(self._secret)
        return options

    def arrow_filesystem(self):
        """A ``pyarrow.fs.S3FileSystem`` for this store; paths on it are ``bucket/key``."""
        from pyarrow import fs  # deferred: only object-storage locations need it

        kwargs = {"region": self.region, "allow_bucket_creation": False, "allow_bucket_deletion": False}
        if self.endpoint:
            split = urlsplit(self.endpoint)
            kwargs["endpoint_override"] = split.netloc + split.path
            kwargs["scheme"] = split.scheme
        kwargs.update(self._credentials("access_key", "secret_key", "session_token") or {"anonymous": True})
        return fs.S3FileSystem(**kwargs)

    def arrow_path(self, name: str = "") -> str:
        """``bucket/key`` of ``name``: a path on ``arrow_filesystem``."""
        return "/".join(p for p in (self.bucket, self.key(name)) if p)

    def s3a_uri(self, name: str = "") -> str:
        """The URL Spark's Hadoop S3A connector reads and writes."""
        return f"s3a://{self.arrow_path(name)}"

    def s3a_conf(self) -> dict[str, str]:
        """Hadoop's settings for its S3A connector on this store (a session sets them as its own, so every
        read and Delta commit of the session uses them): the region, path-style access and plain HTTP for an
        endpoint of one's own, and the credentials. Delta picks its S3 log store for ``s3a://`` by itself
        (``S3SingleDriverLogStore``: one writing driver at a time, which the lease ensures)."""
        conf = {"fs.s3a.endpoint.region": self.region}
        if self.endpoint:
            conf["fs.s3a.endpoint"] = self.endpoint
            conf["fs.s3a.path.style.access"] = "true"
            conf["fs.s3a.connection.ssl.enabled"] = "false" if self.allow_http else "true"
        conf.update(self._credentials("fs.s3a.access.key", "fs.s3a.secret.key", "fs.s3a.session.token"))
        if "fs.s3a.session.token" in conf:
            conf["fs.s3a.aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
        return conf


#: Clients kept for the process, per kind, location and credentials.
_SHARED: dict = {}


def _shared(kind: str, location: ObjectLocation, build):
    key = (kind, location, location._secrets)
    if key not in _SHARED:
        _SHARED[key] = build()
    return _SHARED[key]


def object_store(location: ObjectLocation):
    """One obstore store per location and credentials in a process (the lease's conditional puts, deletes,
    listings without folder markers, an inbox's reads: a task reads many pieces)."""
    return _shared("obstore", location, location.store)


def shared_arrow_filesystem(location: ObjectLocation):
    """One Arrow S3 filesystem per store and credentials in a process (each holds a connection pool)."""
    return _shared("arrow", location, location.arrow_filesystem)
