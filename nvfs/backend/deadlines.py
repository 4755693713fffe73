"""How long one backend request may take: to connect, to hear the server, and in all.

Why: a server stopped by SIGSTOP still accepts connections (the kernel completes the
handshake into its listen queue) but never answers, so nothing but a timeout ends a request
to it, and retries multiply that timeout into a wait with no end in sight. Here every
request has three bounds (mount options ``connect_timeout``, ``read_timeout`` and
``request_timeout``) and its retries share the last one.

Retries follow boto3's standard mode (throttling, 5xx and dropped connections, with jittered
exponential backoff); a retry starts only while the attempt it would make still fits before
the deadline, so a request that fails, fails by its deadline.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from nvfs.backend.errors import BackendError

# TCP resends a SYN that got no answer after 1 s and again 2 s later: 5 s lets two be lost.
DEFAULT_CONNECT_TIMEOUT = 5.0
# A healthy S3 answers a GET's first byte in well under a second, and a PUT once it has stored
# the body (a 64 MiB chunk: about a second on a loaded server); 20 s of silence is a server in
# trouble, not a slow one.
DEFAULT_READ_TIMEOUT = 20.0
# Two whole attempts (connect and read timeouts) and the backoff between them, or a 64 MiB chunk
# moved at 1.1 MB/s: beyond that a reader is better served by EIO than by waiting.
DEFAULT_REQUEST_TIMEOUT = 60.0
DEFAULT_MAX_ATTEMPTS = 5
_BACKOFF_BASE = 0.1  # seconds before the first retry; doubled each time, jittered
BACKOFF_CAP = 5.0  # seconds between attempts, at most

_TRANSIENT_STATUS = {429, 500, 502, 503, 504}
_TRANSIENT_CODES = {"SlowDown", "RequestTimeout", "RequestTimeoutException", "PriorRequestNotComplete",
                    "InternalError", "ServiceUnavailable"}

T = TypeVar("T")


def is_transient(status: int, code: str) -> bool:
    """Whether an S3 error answer (HTTP status, error code) is worth another attempt."""
    return status in _TRANSIENT_STATUS or "Throttl" in code or code in _TRANSIENT_CODES


class Retry(Exception):
    """A failure worth another attempt (its message says what happened)."""


class RequestFailed(BackendError):
    """Every attempt a request had time or leave for failed in a way worth another (no answer, 5xx)."""


@dataclass(frozen=True)
class Deadlines:
    """The bounds on one request (see the module's docstring); seconds, and attempts at most."""

    connect: float = DEFAULT_CONNECT_TIMEOUT
    read: float = DEFAULT_READ_TIMEOUT  # before the first byte of an answer, or between two
    request: float = DEFAULT_REQUEST_TIMEOUT  # the whole request, every retry and backoff included
    attempts: int = DEFAULT_MAX_ATTEMPTS

    def check(self) -> None:
        """Refuse bounds under which even one attempt could outlast the request's deadline."""
        if self.request < self.connect + self.read:
            raise ValueError(f"request_timeout ({self.request:g} s) must be at least connect_timeout + "
                             f"read_timeout ({self.connect + self.read:g} s)")


def with_retries(what: str, deadlines: Deadlines, attempt: Callable[[float], T], *,
                 clipped: bool) -> T:
    """``attempt(deadline)`` until it succeeds or fails for good; raises :class:`BackendError`.

    ``attempt`` raises :class:`Retry` for a failure worth another try; ``deadline`` is the
    :func:`time.monotonic` time by which the whole request must be over. ``clipped``: the
    attempt cuts its own timeouts to the deadline; otherwise a retry starts only while a whole
    attempt (connect and read timeouts) still fits before it.
    """
    started = time.monotonic()
    deadline = started + deadlines.request
    needed = 0.0 if clipped else deadlines.connect + deadlines.read
    for number in range(1, deadlines.attempts + 1):
        try:
            return attempt(deadline)
        except Retry as failure:
            reason = failure
        delay = random.uniform(0, min(BACKOFF_CAP, _BACKOFF_BASE * 2 ** (number - 1)))
        if number == deadlines.attempts or time.monotonic() + delay + needed >= deadline:
            spent = time.monotonic() - started
            raise RequestFailed(f"{what}: {reason} (after {number} attempts in {spent:.1f} s; "
                                f"request_timeout {deadlines.request:g} s)")
        time.sleep(delay)
    raise AssertionError("unreachable")


def time_left(deadline: float, limit: float) -> float:
    """Seconds a wait may take, at most ``limit``, before ``deadline``; :class:`Retry` if none are left."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise Retry("no answer before the deadline")
    return min(limit, left)
