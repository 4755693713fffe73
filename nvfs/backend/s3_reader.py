"""GETs of whole S3 objects into one buffer, without the boto3 client's per-call machinery.

A restore GETs thousands of multi-MiB chunk objects from threads of one Python process, so
what bounds it is how long each GET holds the GIL; boto3's ``get_object`` holds it for its
event and retry machinery and copies the body through a BytesIO
(docs/decisions/signed-gets.md).

Here a request is signed with botocore's own SigV4 signer and the credentials of the
boto3 session (so the standard chain, refreshes and session tokens work as in boto3), and
sent by an :class:`~nvfs.backend.http_get.ObjectGetter`, here or in a fetch process. The
sender signs (:class:`SigV4Get`), so signing is not done on the daemon's FUSE thread.
"""

from __future__ import annotations

import math
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass

from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import ReadOnlyCredentials

from nvfs.backend.deadlines import Deadlines
from nvfs.backend.http_get import ObjectGetter
from nvfs.backend.object_get import GetterSettings, ObjectGet

# Seconds the credentials looked up last are used for requests made without waiting. botocore
# refreshes temporary credentials 10-15 minutes before they expire, so they stay valid longer.
CREDENTIALS_REUSE = 60.0


@dataclass(frozen=True)
class SigV4Get(ObjectGet):
    """A GET that its sender signs with ``credentials``, valid for minutes from then."""

    region: str
    credentials: ReadOnlyCredentials

    def headers(self) -> dict[str, str]:
        request = AWSRequest(method="GET", url=self.settings.origin + self.path)
        S3SigV4Auth(self.credentials, "s3", self.region).add_auth(request)
        return dict(request.headers.items())


class ObjectReader:
    """Whole-object GETs from one bucket; thread-safe."""

    PROBE_KEY = "nvfs-url-probe"  # a key nvfs never writes

    def __init__(self, base_url: str, region: str, credentials: Callable[[], ReadOnlyCredentials], *,
                 deadlines: Deadlines, ca_bundle: str | None = None) -> None:
        parts = urllib.parse.urlsplit(base_url)
        self._base_path = parts.path
        self._region = region
        self._credentials = credentials
        self._recent: tuple[ReadOnlyCredentials | None, float] = (None, -math.inf)  # and when
        self._getter = ObjectGetter(GetterSettings(f"{parts.scheme}://{parts.netloc}", deadlines.connect,
                                                   deadlines.read, deadlines.attempts, ca_bundle,
                                                   deadlines.request))

    @classmethod
    def base_url_of(cls, presign: Callable[[str], str]) -> str | None:
        """The URL that object keys are appended to, from a presigned URL of a probe key.

        The client's endpoint rules (path or virtual-host addressing, regional endpoints,
        a custom ``endpoint_url``) decide it; ``None`` if the URL is not of that shape.
        """
        url = presign(cls.PROBE_KEY).partition("?")[0]
        return url[: -len(cls.PROBE_KEY)] if url.endswith("/" + cls.PROBE_KEY) else None

    def get(self, key: str) -> memoryview:
        """The whole object ``key`` (its full name in the bucket)."""
        request = self.request(key)
        assert request is not None
        return self._getter.get(key, request.path, request.headers())

    def request(self, key: str, *, wait: bool = True) -> SigV4Get | None:
        """A GET of ``key``, to be signed and sent here or by another process.

        ``wait=False``, for a caller on an event loop: ``None`` where the credentials must be
        looked up first, which can mean network round trips to refresh them.
        """
        credentials, looked_up = self._recent
        if credentials is None or time.monotonic() - looked_up > CREDENTIALS_REUSE:
            if not wait:
                return None
            credentials = self._credentials()
            self._recent = (credentials, time.monotonic())
        path = self._base_path + urllib.parse.quote(key, safe="/~")
        return SigV4Get(self._getter.settings, key, path, self._region, credentials)

    def close(self) -> None:
        self._getter.close()
