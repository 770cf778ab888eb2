"""Start `python -m memagent.server` as a real subprocess on loopback, for tests.

Why a subprocess and not an in-process app: the client's retries must be exercised against what a user
meets (a separate process that can hang, drop connections, die and come back on the same port).
Every server started through the `servers` fixture is killed at teardown, pass or fail.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, *args: str, port: int | None = None, env: dict | None = None, ready_timeout: float = 60.0):
        self.args, self.port = list(args), port or free_port()
        self.env, self.ready_timeout = env, ready_timeout
        self.proc: subprocess.Popen | None = None
        self.log = tempfile.NamedTemporaryFile(prefix="memagent-server-", suffix=".log", delete=False)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def root_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def start(self) -> "ServerProcess":
        env = {k: v for k, v in os.environ.items() if not k.startswith("MEMAGENT_SERVER_")}  # no stray faults/keys
        env.update({"PYTHONPATH": str(ROOT)}, **(self.env or {}))
        cmd = [sys.executable, "-m", "memagent.server", "--host", "127.0.0.1", "--port", str(self.port), *self.args]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.output()[-2000:]}")
            try:
                self.health(timeout=0.5)
                return self
            except OSError:
                time.sleep(0.05)
        self.stop()  # the log stays for the message; cleanup() at teardown deletes it
        raise RuntimeError(f"server not healthy within {self.ready_timeout} s:\n{self.output()[-2000:]}")

    def health(self, timeout: float = 2.0) -> dict:
        with urllib.request.urlopen(self.root_url + "/health", timeout=timeout) as r:
            return json.loads(r.read())

    def stop(self) -> None:
        """SIGKILL: tests want the abrupt death a crash gives, and it cannot hang teardown."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def terminate(self, timeout: float = 10.0) -> int:
        """SIGTERM and wait: the graceful path."""
        assert self.proc is not None
        self.proc.terminate()
        return self.proc.wait(timeout=timeout)

    def cleanup(self) -> None:
        """Kill the process and delete its log."""
        self.stop()
        self.log.close()
        Path(self.log.name).unlink(missing_ok=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.cleanup()


@pytest.fixture
def servers():
    """`servers(*args, port=None, env=None)` starts a healthy server; all are killed at teardown."""
    started: list[ServerProcess] = []

    def start(*args: str, **kw) -> ServerProcess:
        server = ServerProcess(*args, **kw)
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.cleanup()
