"""A local S3-compatible server for tests: moto's server mode (``moto[server]``) in a process of
its own, reached through a proxy that can answer 500s, stall, or go down and come back on the
same port, so that retries, timeouts and recovery are exercised against real HTTP."""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

START_TIMEOUT = 30.0
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
"""What the clients of the test server use (moto accepts any); set in the mount's environment."""
HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "upgrade", "te", "trailer"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Faults:
    """What the proxy does to the next requests (shared with its handler threads)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.fail = 0  # answer this many more GETs with ``status``
        self.status = 500
        self.stall = 0.0  # seconds every request waits before it is forwarded
        self.gets = 0  # GET requests of objects seen (ranged reads and whole objects)
        self.bytes = 0  # body bytes of those GETs sent back

    def take_failure(self) -> int | None:
        with self.lock:
            if self.fail > 0:
                self.fail -= 1
                return self.status
        return None

    def count(self, nbytes: int) -> None:
        with self.lock:
            self.gets += 1
            self.bytes += nbytes


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "_ProxyServer"

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def _forward(self) -> None:
        faults = self.server.faults
        self.server.track(self.connection)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        is_get = self.command == "GET" and "?" not in self.path and self.path.count("/") >= 2
        if faults.stall:
            time.sleep(faults.stall)
        status = faults.take_failure() if is_get else None
        if status is not None:
            payload = b"<Error><Code>InternalError</Code><Message>injected</Message></Error>"
            self.send_response(status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        conn = http.client.HTTPConnection("127.0.0.1", self.server.upstream, timeout=60)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_HEADERS}
            conn.request(self.command, self.path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        if is_get:
            faults.count(len(data))
        self.send_response(resp.status)
        head = self.command == "HEAD"  # its Content-Length is the object's, with no body
        for k, v in resp.getheaders():
            if k.lower() not in HOP_HEADERS and (head or k.lower() != "content-length"):
                self.send_header(k, v)
        if not head:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward


class _ProxyServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, port: int, upstream: int, faults: Faults) -> None:
        self.upstream, self.faults = upstream, faults
        self.conns: set[socket.socket] = set()
        self.conns_lock = threading.Lock()
        super().__init__(("127.0.0.1", port), _Handler)

    def track(self, conn: socket.socket) -> None:
        with self.conns_lock:
            self.conns.add(conn)

    def drop_connections(self) -> None:
        with self.conns_lock:
            for c in self.conns:
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self.conns.clear()


class S3Server:
    """moto's S3 server on a free port behind a fault proxy; `endpoint` is the proxy's URL."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.faults = Faults()
        self.upstream = free_port()
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.proxy: _ProxyServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "S3Server":
        log = open(self.workdir / "moto.log", "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.upstream)],
                                     stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=dict(os.environ, **CREDENTIALS))
        log.close()
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.upstream), timeout=1).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("moto server did not start: " + (self.workdir / "moto.log").read_text())
                time.sleep(0.05)
        self.up()
        return self

    def up(self) -> None:
        """(Re)open the proxy on its port."""
        self.proxy = _ProxyServer(self.port, self.upstream, self.faults)
        self._thread = threading.Thread(target=self.proxy.serve_forever, daemon=True)
        self._thread.start()

    def down(self) -> None:
        """Close the proxy: new connections are refused, open ones are cut."""
        if self.proxy is not None:
            self.proxy.shutdown()
            self.proxy.server_close()
            self.proxy.drop_connections()
            self.proxy = None

    def client(self):  # noqa: ANN201 -- a boto3 S3 client
        import boto3

        return boto3.client("s3", endpoint_url=f"http://127.0.0.1:{self.upstream}", region_name="us-east-1",
                            aws_access_key_id="testing", aws_secret_access_key="testing")

    def stop(self) -> None:
        self.down()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
