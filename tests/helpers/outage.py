"""Outages on purpose, for the fault tests: a private Redis the test can stop and start again on the
same port, and a TCP proxy the test can cut and restore. The shared PostgreSQL and Redis of the
other tests are never touched: a test points its worker (and itself) at these instead."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Iterator, Protocol, TypeVar


class _Service(Protocol):
    def start(self) -> None: ...
    def stop(self) -> None: ...


_S = TypeVar("_S", bound=_Service)


def free_port() -> int:
    """A TCP port nothing listens on now (the kernel's pick, released at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, *, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing answers on 127.0.0.1:{port} after {timeout} s") from None
            time.sleep(0.1)


class PrivateRedis:
    """A redis-server of the test's own, without persistence: stop() is Redis gone (connections
    refused), start() brings it back on the same port, empty, as a restarted broker would be."""

    def __init__(self, *, port: int | None = None, log_path: Path | None = None):
        self.port = port or free_port()
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed")
        log = open(self.log_path, "a") if self.log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--daemonize", "no"],
            stdout=log, stderr=subprocess.STDOUT)
        self._wait_ping()

    def _wait_ping(self, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on port {self.port} did not start")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None


@contextmanager
def running(service: _S) -> Iterator[_S]:
    """Start `service` (a PrivateRedis, a TcpProxy) for the block; stop it after, however it ends."""
    service.start()
    try:
        yield service
    finally:
        service.stop()


def private_redis(*, log_path: Path | None = None) -> AbstractContextManager[PrivateRedis]:
    return running(PrivateRedis(log_path=log_path))


class TcpProxy:
    """Forwards 127.0.0.1:port to an upstream address. cut() closes every open connection and stops
    listening (new connections are refused), as a network partition or a restarting server looks
    to a client; restore() listens again on the same port."""

    def __init__(self, *, upstream: tuple[str, int], port: int | None = None):
        self.upstream = upstream
        self.port = port or free_port()
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self.cuts = 0

    def start(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True, name=f"proxy-{self.port}").start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut: the listener was closed
            try:
                server = socket.create_connection(self.upstream, timeout=5)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:  # cut while connecting
                    client.close(), server.close()
                    continue
                self._conns |= {client, server}
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                self._close(s)

    def _close(self, s: socket.socket) -> None:
        with self._lock:
            self._conns.discard(s)
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()

    def cut(self) -> None:
        self._drop()
        self.cuts += 1

    def _drop(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            conns, self._conns = list(self._conns), set()
        if listener is not None:
            listener.close()
        for s in conns:
            self._close(s)

    def restore(self) -> None:
        self.start()

    def stop(self) -> None:
        self._drop()


def tcp_proxy(*, upstream: tuple[str, int]) -> AbstractContextManager[TcpProxy]:
    return running(TcpProxy(upstream=upstream))


@contextmanager
def celery_broker(url: str) -> Iterator[None]:
    """Point this process's Celery app (the web side: launches, the outbox) and the workers that
    tests.helpers.worker starts from here at `url`, then back."""
    from django.conf import settings

    from eagle3web.celery import celery_app

    before = (settings.CELERY_BROKER_URL, os.environ.get("CELERY_BROKER_URL"))

    def point(broker_url: str, env_url: str | None) -> None:
        settings.CELERY_BROKER_URL = broker_url
        # Celery reads CELERY_BROKER_URL from the environment before its configuration.
        if env_url is None:
            os.environ.pop("CELERY_BROKER_URL", None)
        else:
            os.environ["CELERY_BROKER_URL"] = env_url
        celery_app.conf.broker_url = broker_url
        # The pools face the old broker: forget them, as Celery does after a fork. (Closing them
        # would leave a closed pool in kombu's registry for the next test on that broker.)
        celery_app._pool = None
        celery_app.amqp._producer_pool = None

    point(url, url)
    try:
        yield
    finally:
        point(*before)
