"""Requests to an S3-compatible object store: ranged GETs pinned to one version of an object,
many in flight, retried, counted.

The client is `obstore` (``pip install shufflefs[s3]``): its requests run in Rust without the
GIL, it retries 5xx answers, timeouts and dropped connections with exponential backoff, and
every GET carries ``If-Match`` with the ETag the index was built from, so a changed object
answers 412 and is never served as a mix of versions.  Measured against boto3 on the same moto
server (``tools/s3_clients.py``, retired, in git at 983bbbd; docs/guide/object-storage.md has the table), obstore
read more per second at every depth and spent less client CPU per GB.  Credentials come from the
standard AWS environment variables; otherwise, when boto3 is installed, from the shared config and
credentials files (profiles, SSO, instance roles) through obstore's boto3 credential provider.

Pure planning (`plan_requests`) is separate from the I/O so that it is tested alone.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, NamedTuple

import numpy as np

from ..errors import ShuffleError, StaleSourceError
from .base import count_requests, gather
from .link import LinkMeter

log = logging.getLogger("shufflefs")

PART = 8 << 20
"""Ranged GETs are about this long at most: a longer run is split into equal parts, fetched
concurrently, unless it is at most `PART_SLACK` longer (an 8 MiB block cut at record ends)."""
PART_SLACK = PART // 8
"""How much longer than `PART` one GET may be: a block of 8 MiB ends at the first record end past
it, and was fetched as 8 MiB and a GET of the record's tail (1.5 GETs a block on average)."""
LIST_PAGE = 1000
"""Keys per page of a streamed listing (what S3 returns per LIST request)."""
COALESCE_GAP = 16 << 10
"""Two runs closer than this are fetched by one request (the gap's bytes are read and dropped):
a request costs about as much as this many bytes on a fast link, and a record-level window of
scattered records must not turn into a read of the whole object."""


class ObjectError(ShuffleError):
    """A request for an object's bytes failed after its retries (EIO; the mount stays up and the
    next read tries again)."""


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """What a listing says of one object."""

    key: str
    size: int
    etag: str
    mtime_ns: int

    @property
    def ino(self) -> int:
        """A stable 63-bit number for this version (the ETag's hash), as a file's inode is part
        of its `SourceStamp`: a new ETag is a new version even if size and time are kept."""
        return int.from_bytes(hashlib.blake2b(self.etag.encode(), digest_size=8).digest(), "little") >> 1


@dataclass(frozen=True)
class ClientOptions:
    endpoint_url: str | None = None
    region: str | None = None
    in_flight: int = 16
    timeout_s: float = 30.0
    retries: int = 4


class Requests(NamedTuple):
    """Ranged GETs covering some runs: request q reads ``[start[q], end[q])``; run r's bytes are
    at ``run_at[r]`` inside the body of request ``run_req[r]``."""

    start: np.ndarray
    end: np.ndarray
    run_req: np.ndarray
    run_at: np.ndarray


def plan_requests(starts: np.ndarray, ends: np.ndarray, gap: int = COALESCE_GAP, part: int = PART,
                  slack: int | None = None) -> Requests:
    """Ascending byte runs as ranged GETs: runs less than ``gap`` apart share one request, and a
    request longer than ``part + slack`` (``slack`` default ``part // 8``) is cut into the fewest
    equal parts of at most ``part + slack`` bytes (a run then spans several; see `fetch_runs`)."""
    starts, ends = np.asarray(starts, np.int64), np.asarray(ends, np.int64)
    if len(starts) == 0:
        z = np.zeros(0, np.int64)
        return Requests(z, z, z, z)
    new = np.concatenate(([True], starts[1:] - ends[:-1] >= gap))
    group = np.cumsum(new) - 1
    g_start = starts[new]
    g_end = np.maximum.reduceat(ends, np.flatnonzero(new))
    # the fewest equal parts of at most ``most`` bytes per group
    most = part + (part // 8 if slack is None else slack)
    length = g_end - g_start
    n_parts = np.maximum((length + most - 1) // most, 1)
    piece = np.maximum((length + n_parts - 1) // n_parts, 1)
    first_part = np.cumsum(n_parts) - n_parts
    idx = np.repeat(np.arange(len(g_start)), n_parts)
    k = np.arange(int(n_parts.sum())) - first_part[idx]
    p_start = g_start[idx] + k * piece[idx]
    p_end = np.minimum(p_start + piece[idx], g_end[idx])
    # each run: the part it starts in, and its offset inside that part
    within = starts - g_start[group]
    run_req = first_part[group] + within // piece[group]
    return Requests(p_start, p_end, run_req, within % piece[group])


def _as_error(e: BaseException, url: str, start: int | None, what: str) -> ShuffleError:
    import obstore.exceptions as ox

    if isinstance(e, ox.PreconditionError):
        return StaleSourceError(url, start, "object changed while mounted (its ETag no longer matches)")
    if isinstance(e, ox.NotFoundError):
        return StaleSourceError(url, start, "object was removed while mounted")
    said = server_said(str(e))
    if said is not None:
        return ObjectError(url, start, f"{what} refused: {said}")
    return ObjectError(url, start, f"{what} failed after retries: {type(e).__name__}: {str(e).splitlines()[0][:300]}")


HINTS = {
    "NoSuchBucket": "no such bucket: check its name, --endpoint-url and --region",
    "AccessDenied": "check the credentials and the bucket's policy",
    "InvalidAccessKeyId": "check the credentials",
    "SignatureDoesNotMatch": "check the credentials",
    "PermanentRedirect": "the bucket is in another region: give --region",
    "AuthorizationHeaderMalformed": "the bucket is in another region: give --region",
}
"""What to check for the error codes a mount's first request most often gets."""


def server_said(text: str) -> str | None:
    """The server's answer in a client error, in a line: HTTP status, the S3 error code and its
    message (``404 Not Found, NoSuchBucket: The specified bucket does not exist``) and what to
    check; None if the text holds no such answer (a timeout, a refused connection)."""
    code = re.search(r"<Code>([^<]{1,100})</Code>", text)
    if code is None:
        return None
    status = re.search(r"status code: (\d{3}[^:<]{0,40})", text)
    message = re.search(r"<Message>([^<]{1,300})</Message>", text)
    said = ", ".join(x for x in (status and status.group(1).strip(), code.group(1)) if x)
    said += f": {message.group(1)}" if message else ""
    hint = HINTS.get(code.group(1))
    return f"{said} ({hint})" if hint else said


class ObjectClient:
    """One bucket: listings and ranged GETs, at most ``in_flight`` GETs at once for the
    whole mount; counts requests and bytes."""

    def __init__(self, bucket: str, opts: ClientOptions) -> None:
        from obstore.store import S3Store

        self.bucket = bucket
        config: dict[str, Any] = {}
        if opts.endpoint_url:
            config["endpoint"] = opts.endpoint_url
        region = opts.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        provider = None
        self.credentials = "the AWS_ACCESS_KEY_ID environment variables"
        if not os.environ.get("AWS_ACCESS_KEY_ID"):
            provider, region = _shared_credentials(region)
            self.credentials = ("the shared AWS config files (through boto3)" if provider is not None else
                                "none found in the environment or the shared config files (so the instance's role, "
                                "if any: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE)")
        if region:
            config["region"] = region
        timeout = timedelta(seconds=opts.timeout_s)
        self.store = S3Store(
            bucket, config=config or None, credential_provider=provider,
            client_options={"allow_http": True, "timeout": timeout, "connect_timeout": timedelta(seconds=min(10.0, opts.timeout_s)),
                            "pool_max_idle_per_host": str(max(opts.in_flight, 4))},
            retry_config={"max_retries": opts.retries, "retry_timeout": timeout * (opts.retries + 1),
                          "backoff": {"init_backoff": timedelta(milliseconds=100), "max_backoff": timedelta(seconds=5), "base": 2}},
        )
        self.pool = ThreadPoolExecutor(max(opts.in_flight, 1), thread_name_prefix="s3-get")
        self.meter = LinkMeter(PART, max(opts.in_flight, 1))
        """What the GETs so far say the link needs in flight (the window cache's readahead)."""
        self._lock = threading.Lock()
        self.requests = 0
        self.bytes = 0
        self.failures = 0

    def url(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    def _count(self, requests: int, nbytes: int) -> None:
        with self._lock:
            self.requests += requests
            self.bytes += nbytes

    def list_dir(self, prefix: str) -> tuple[list[str], list[ObjectInfo]]:
        """Sub-prefixes (full keys, no trailing ``/``) and objects directly under ``prefix`` (a
        key prefix without the trailing ``/``; "" is the bucket).

        Streamed while the prefix looks flat: pages of `LIST_PAGE` keys are turned into
        `ObjectInfo` as they arrive, so a prefix of 100,000 objects grew the daemon by 35 MB
        instead of the 97 MB that a delimited listing (every page held until the last) took,
        in the same 4.6 s.  A page with a deeper key means subdirectories, whose contents a
        recursive listing would walk too: the prefix is then listed with a delimiter."""
        import obstore

        cut = len(prefix) + 1 if prefix else 0
        pages = 0
        try:
            objects: list[ObjectInfo] = []
            for page in obstore.list(self.store, f"{prefix}/" if prefix else None, chunk_size=LIST_PAGE):
                pages += 1
                if any("/" in m["path"][cut:] for m in page):
                    break
                objects.extend(_info(m) for m in page)
            else:
                return [], objects
            del objects
            result = obstore.list_with_delimiter(self.store, prefix or None)
            pages += 1
        except Exception as e:  # noqa: BLE001
            raise _as_error(e, self.url(prefix), None, "LIST") from None
        finally:
            self._count(max(pages, 1), 0)
        return [p.rstrip("/") for p in result["common_prefixes"]], [_info(m) for m in result["objects"]]

    def first_page(self, prefix: str) -> bool:
        """One LIST request under ``prefix`` (a key prefix without the trailing ``/``): whether
        any object is there; raises, with the reason, if the bucket cannot be listed.  A mount
        checks this much before it starts; the full listing waits for the first lookup."""
        import obstore

        try:
            stream = obstore.list(self.store, f"{prefix}/" if prefix else None, chunk_size=1)
            return bool(next(iter(stream), None))
        except Exception as e:  # noqa: BLE001
            raise _as_error(e, self.url(prefix), None, "LIST") from None
        finally:
            self._count(1, 0)

    def names_near(self, prefix: str, most: int = 8) -> list[str]:
        """Up to ``most`` names (``dir/`` or ``file``) beside ``prefix``, from one LIST page of its
        parent: what a mistyped prefix may have meant."""
        import obstore

        parent = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        cut = len(parent) + 1 if parent else 0
        try:
            page = next(iter(obstore.list(self.store, f"{parent}/" if parent else None, chunk_size=LIST_PAGE)), [])
        except Exception:  # noqa: BLE001 -- only a hint
            return []
        finally:
            self._count(1, 0)
        names: list[str] = []
        for m in page:
            rest = m["path"][cut:]
            name = rest.split("/", 1)[0] + ("/" if "/" in rest else "")
            if name and name not in names:
                names.append(name)
        return names[:most]

    def get(self, key: str, etag: str, start: int, end: int, into: np.ndarray | None = None) -> np.ndarray:
        """Bytes ``[start, end)`` of the object's version ``etag``, exactly that many (copied into
        ``into`` when given)."""
        import obstore

        try:
            began = time.monotonic()
            got = obstore.get(self.store, key, options={"range": (start, end), "if_match": etag})
            meta, data = got.meta, np.frombuffer(got.bytes(), np.uint8)
            self.meter.record(began, time.monotonic(), len(data))
        except Exception as e:  # noqa: BLE001 -- any client failure is an I/O error of this range
            with self._lock:
                self.failures += 1
            log.warning("GET %s bytes=%d-%d: %s", self.url(key), start, end - 1, e)
            raise _as_error(e, self.url(key), start, f"GET bytes={start}-{end - 1}") from None
        finally:
            self._count(1, 0)
        if meta.get("e_tag") not in (None, etag):  # a server that ignores If-Match
            raise StaleSourceError(self.url(key), start, "object changed while mounted (ETag differs)")
        if len(data) != end - start:
            raise ObjectError(self.url(key), start, f"GET bytes={start}-{end - 1} returned {len(data)} bytes")
        self._count(0, len(data))
        if into is None:
            return data
        into[:] = data
        return into

    def get_object(self, key: str) -> bytes | None:
        """A whole object, any version (a published index, whose name carries the version it
        indexes); None if there is no such object."""
        import obstore

        try:
            data = obstore.get(self.store, key).bytes()
        except Exception as e:  # noqa: BLE001
            if isinstance(e, FileNotFoundError) or type(e).__name__ == "NotFoundError":
                return None
            with self._lock:
                self.failures += 1
            raise _as_error(e, self.url(key), None, "GET") from None
        finally:
            self._count(1, 0)
        self._count(0, len(data))
        return bytes(data)

    def put(self, key: str, data: bytes) -> None:
        """Write an object (``shufflefs index --publish``)."""
        import obstore

        try:
            obstore.put(self.store, key, data)
        except Exception as e:  # noqa: BLE001
            with self._lock:
                self.failures += 1
            raise _as_error(e, self.url(key), None, "PUT") from None
        finally:
            self._count(1, 0)

    def fetch_runs(self, key: str, etag: str, starts: np.ndarray, ends: np.ndarray, out: np.ndarray) -> int:
        """The runs' bytes back to back into ``out`` (ranged GETs in flight at once); returns the
        number of requests made.  Any failure raises once no request is still writing."""
        return self.begin_runs(key, etag, starts, ends, out)()

    def begin_runs(self, key: str, etag: str, starts: np.ndarray, ends: np.ndarray,
                   out: np.ndarray) -> Callable[[], int]:
        """`fetch_runs` started: its requests are queued, the returned call waits for them (so
        that runs of several objects, a pool's members, are in flight together)."""
        plan = plan_requests(starts, ends)
        lengths = np.asarray(ends, np.int64) - np.asarray(starts, np.int64)
        req_len = plan.end - plan.start
        req_at = np.cumsum(req_len) - req_len
        # no gaps were read: the bodies back to back are the runs back to back
        direct = int(req_len.sum()) == int(lengths.sum())
        bodies = out if direct else np.empty(int(req_len.sum()), np.uint8)
        futures = [self.pool.submit(self.get, key, etag, s, e, bodies[a: a + e - s])
                   for s, e, a in zip(plan.start.tolist(), plan.end.tolist(), req_at.tolist())]

        def finish() -> int:
            count_requests(len(futures), int(req_len.sum()))
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            failed = [f for f in done if f.exception() is not None]
            if failed:
                for f in futures:
                    f.cancel()
                wait(futures)  # none may write into ``out`` after this returns
                raise failed[0].exception()
            if not direct:
                dest = np.cumsum(lengths) - lengths
                gather(bodies, req_at[plan.run_req] + plan.run_at, lengths, out, dest)
            return len(futures)
        return finish

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def _info(meta: Any) -> ObjectInfo:
    mtime = meta["last_modified"]
    return ObjectInfo(meta["path"], int(meta["size"]), str(meta.get("e_tag") or ""), int(mtime.timestamp() * 1e9))


def _shared_credentials(region: str | None) -> tuple[Any, str | None]:
    """Credentials (and region) from the AWS shared config and credentials files, as the AWS CLI
    finds them, when boto3 is installed and finds any; else (None, region): obstore's own lookup
    (instance metadata, web identity) or unsigned requests."""
    try:
        import boto3
        from obstore.auth.boto3 import Boto3CredentialProvider
    except ImportError:
        return None, region
    session = boto3.Session()
    if session.get_credentials() is None:
        return None, region
    return Boto3CredentialProvider(session), region or session.region_name
