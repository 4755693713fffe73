"""Part 2 of the S3 read scenario: how much of a safetensors file ``safe_open`` of one tensor fetches.

The bytes are counted outside nvfs, by a TCP relay between the daemon and SeaweedFS
(:class:`CountingProxy`), which sees every request and every byte whatever the daemon logs.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import multiprocessing
import os
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from benchmarks.harness.files import drop_caches
from benchmarks.harness.mounts import XATTR
from benchmarks.harness.report import Check
from benchmarks.harness.units import MIB, human
from benchmarks.s3_read.cold_reads import BUCKET_NVFS, plain_client, s3_mount
from benchmarks.s3_read.table import Results, Row
from nvfs.testing.seaweed import SeaweedServer

SAFETENSORS_TENSORS = 64
FETCH_TARGET = 0.05  # safe_open of one tensor may fetch less than this share of the stored bytes


def ranges(indices: Any) -> str:
    """``0-1,32-53``: sorted distinct integers as ranges."""
    spans: list[list[int]] = []
    for i in sorted(set(indices)):
        if spans and spans[-1][1] == i - 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in spans) or "none"


def safetensors_state(total_bytes: int, seed: int) -> dict[str, torch.Tensor]:
    """``SAFETENSORS_TENSORS`` weight matrices of equal byte size, alternately bf16 and fp32."""
    gen = torch.Generator().manual_seed(seed)
    per = total_bytes // SAFETENSORS_TENSORS
    state: dict[str, torch.Tensor] = {}
    for i in range(SAFETENSORS_TENSORS):
        dtype = torch.bfloat16 if i % 2 == 0 else torch.float32
        elements = per // (2 if dtype == torch.bfloat16 else 4)
        cols = 2048 if elements % 2048 == 0 else 1
        value = torch.randn(elements // cols, cols, generator=gen) * 0.02
        state[f"layers.{i // 2}.{'attn' if i % 2 == 0 else 'mlp'}.weight"] = value.to(dtype)
    return state


def header_span(path: Path) -> tuple[int, dict[str, Any]]:
    """(bytes before the data section, the parsed safetensors header)."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        return 8 + length, json.loads(f.read(length))


def manifest_chunks(server: SeaweedServer, key: str) -> tuple[int, list[list[Any]]]:
    """(chunk size, chunk entries [id, length, stored, codec]) of a file's manifest, read from S3."""
    doc = json.loads(plain_client(server).get_object(Bucket=BUCKET_NVFS, Key=key)["Body"].read())
    return int(doc["chunk_size"]), doc["chunks"]


class CountingProxy:
    """A TCP relay in front of SeaweedFS's S3 port that counts what passes through it.

    The daemon of part 2's measuring mount talks S3 to this relay (``-o endpoint_url=``), so
    every byte S3 sends it (``received``: response headers and bodies) and every request it makes
    (``requests``: method and path, read from the request heads) is seen here, whatever the
    daemon logs. Requests are signed for the relay's host:port, which the server checks as sent.

    It runs in a process of its own (:class:`Relay`): safetensors holds the GIL while it maps and
    faults in the file, so a relay thread in this process would deadlock against that very read.
    """

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint_url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._lock = threading.Lock()
        self.received = 0
        self.requests: list[tuple[str, str]] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._listener.close()

    def snapshot(self) -> tuple[int, int]:
        with self._lock:
            return self.received, len(self.requests)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.upstream)
        except OSError:
            client.close()
            return
        down = threading.Thread(target=self._pump_responses, args=(upstream, client), daemon=True)
        down.start()
        self._pump_requests(client, upstream)
        down.join()
        client.close()
        upstream.close()

    def _pump_responses(self, src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(MIB):
                with self._lock:
                    self.received += len(data)
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def _pump_requests(self, src: socket.socket, dst: socket.socket) -> None:
        """Relay requests; note each one's method and path (skipping bodies by Content-Length)."""
        buffer, body_left, parsing = b"", 0, True
        with contextlib.suppress(OSError):
            while data := src.recv(MIB):
                dst.sendall(data)
                if not parsing:
                    continue
                buffer += data
                while True:
                    if body_left:
                        taken = min(body_left, len(buffer))
                        buffer, body_left = buffer[taken:], body_left - taken
                        if body_left:
                            break
                    end = buffer.find(b"\r\n\r\n")
                    if end < 0:
                        break
                    head, buffer = buffer[:end].decode("latin-1").split("\r\n"), buffer[end + 4:]
                    method, target = (head[0].split(" ") + ["", ""])[:2]
                    fields = (line.partition(":") for line in head[1:])
                    headers = {k.strip().lower(): v.strip() for k, _, v in fields}
                    with self._lock:
                        self.requests.append((method, target))
                    if "chunked" in headers.get("transfer-encoding", ""):
                        parsing = False  # no request of a read has a body; stop parsing rather than guess
                        break
                    body_left = int(headers.get("content-length", "0") or 0)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


class Relay:
    """A :class:`CountingProxy` in a child process, queried over a pipe."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self._conn, child = multiprocessing.Pipe()
        self._process = multiprocessing.get_context("fork").Process(
            target=_relay_main, args=(upstream, child), daemon=True)
        self._process.start()
        child.close()
        self.endpoint_url: str = self._conn.recv()

    def _ask(self, what: str) -> Any:
        self._conn.send(what)
        return self._conn.recv()

    def snapshot(self) -> tuple[int, int]:
        """(bytes S3 has sent, requests made) so far."""
        return self._ask("snapshot")

    def requests(self) -> list[tuple[str, str]]:
        return self._ask("requests")

    def wait_until_quiet(self, quiet_s: float = 1.0, limit_s: float = 60.0) -> None:
        """Wait until no S3 traffic has passed for ``quiet_s`` (mount-time GC, read-ahead done)."""
        deadline = time.monotonic() + limit_s
        last, since = self.snapshot(), time.monotonic()
        while time.monotonic() < deadline:
            time.sleep(0.1)
            now = self.snapshot()
            if now != last:
                last, since = now, time.monotonic()
            elif time.monotonic() - since >= quiet_s:
                return

    def close(self) -> None:
        if self._process.is_alive():
            with contextlib.suppress(OSError, EOFError):
                self._ask("close")
            self._process.join(5)
            if self._process.is_alive():
                self._process.kill()
                self._process.join()
        self._conn.close()


def _relay_main(upstream: tuple[str, int], conn: Any) -> None:
    proxy = CountingProxy(upstream)
    conn.send(proxy.endpoint_url)
    with contextlib.suppress(EOFError, OSError):
        while (what := conn.recv()) != "close":
            conn.send(proxy.snapshot() if what == "snapshot" else list(proxy.requests))
    proxy.close()
    with contextlib.suppress(OSError):
        conn.send(None)


def part2(args: argparse.Namespace, server: SeaweedServer, work: Path, results: Results,
          options: str) -> None:
    state = safetensors_state(args.st_mib * MIB, args.seed + 1)
    names = list(state)
    pick = names[len(names) // 2 + 1]  # an fp32 tensor in the middle of the file
    mount = s3_mount(server, "st", work, "st", options)
    path = mount.mnt / "model.safetensors"
    proxy: Relay | None = None
    try:
        mount.mount()
        start = time.perf_counter()
        save_file(state, str(path))
        save_s = time.perf_counter() - start
        logical = path.stat().st_size
        stored = int(os.getxattr(path, XATTR + "stored_size"))
        results.add(Row("2", "setup: safetensors save_file through the mount", save_s, logical,
                        detail=f"{len(names)} tensors of {human(logical / len(names))}, "
                               f"stored {human(stored)}"))
        mount.umount()

        proxy = Relay(("127.0.0.1", server.s3_port))
        mount.mount(endpoint_url=proxy.endpoint_url)
        proxy.wait_until_quiet()  # the mount-time garbage-collection pass lists the store
        drop_caches()
        received0, requests0 = proxy.snapshot()
        start = time.perf_counter()
        with safe_open(str(path), framework="pt") as f:
            # get_tensor maps the file lazily: clone() touches every page, as loading it would.
            tensor = f.get_tensor(pick).clone()
        open_s = time.perf_counter() - start
        gc.collect()  # the mapping goes with the lazy tensor; an open mapping would keep the mount busy
        proxy.wait_until_quiet()  # read-ahead the access started counts as fetched for it
        received1, _ = proxy.snapshot()
        received = received1 - received0
        requests = proxy.requests()[requests0:]
        if not torch.equal(tensor, state[pick]):
            raise AssertionError(f"safe_open returned a different {pick}")
        del tensor

        # What the access needed at least: the chunks the header and the tensor overlap.
        data_start, header = header_span(path)
        begin, end = (data_start + x for x in header[pick]["data_offsets"])
        chunk_size, chunks = manifest_chunks(server, "st/tree/model.safetensors")
        needed = set(range((data_start - 1) // chunk_size + 1))
        needed |= set(range(begin // chunk_size, (end - 1) // chunk_size + 1))
        minimum = sum(chunks[i][2] for i in needed if chunks[i] is not None)
    finally:
        mount.close()
        if proxy is not None:
            proxy.close()
    # Chunk GETs and their stored (= object) sizes, from the request paths and the manifest.
    stored_of = {entry[0]: entry[2] for entry in chunks if entry is not None}
    fetched = [t.rsplit("/", 1)[1].split("?")[0] for m, t in requests if m == "GET" and "/chunks/" in t]
    get_bytes = sum(stored_of.get(cid, 0) for cid in fetched)
    other = len(requests) - len(fetched)
    share = received / stored
    results.add(Row("2", "nvfs cold: safe_open + get_tensor().clone()", open_s, None,
                    detail=f"S3 sent {human(received)} = {share:.2%} of stored: {len(fetched)} chunk GETs "
                           f"({len(set(fetched))} distinct), {human(get_bytes)} = {get_bytes / stored:.2%}, "
                           f"+{other} other requests; least possible {len(needed)} chunks, "
                           f"{human(minimum)} = {minimum / stored:.2%}"))
    index_of = {entry[0]: i for i, entry in enumerate(chunks) if entry is not None}
    results.notes.append(f"part 2: {path.name} {logical:,} B logical, {stored:,} B stored "
                         f"(sum of user.nvfs.stored_size), {len(chunks)} chunks of {human(chunk_size)}; "
                         f"tensor {pick} is {human(end - begin)} at bytes {begin:,}..{end:,}; chunks "
                         f"needed {ranges(needed)}, fetched {ranges(index_of[c] for c in fetched)}")
    results.acceptance.append(Check(
        f"safe_open of one tensor fetched < {FETCH_TARGET:.0%} of stored bytes",
        received < FETCH_TARGET * stored,
        f"S3 sent {human(received)} = {share:.2%} of {human(stored)} stored ({len(fetched)} chunk GETs, "
        f"{human(get_bytes)}); least possible {minimum / stored:.2%}"))
