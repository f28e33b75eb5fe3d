"""The parent side of the benchmark worker: start it, send jobs, enforce each job's deadline.

A job that overruns its deadline (a hung GPU, a stuck NCCL init) kills the worker; the job ends
as a failure with that reason and the next job gets a fresh worker. Ctrl-C kills the worker
too, so nothing is left running on the GPUs.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable

START_TIMEOUT_S = 120  # importing a CUDA build of torch on a slow disk can take a minute


class WorkerError(Exception):
    """The worker could not start, died, or overran a deadline; the message says which."""


class Worker:
    def __init__(self, env: dict[str, str] | None = None, start_timeout_s: float = START_TIMEOUT_S):
        self.stderr = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpuvet.bench.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            env={**os.environ, **(env or {})},
            start_new_session=True,  # its own process group: killing it ends its children too
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.next_id = 0
        hello = self._next_message(start_timeout_s, "starting the benchmark worker")
        if not hello.get("ready"):
            self.close()
            raise WorkerError(hello.get("error") or "the benchmark worker did not start")
        self.info = hello

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)  # the worker exited

    def _next_message(self, timeout_s: float, doing: str) -> dict[str, Any]:
        try:
            line = self.lines.get(timeout=max(0.1, timeout_s))
        except queue.Empty:
            self.kill()
            raise WorkerError(f"no answer after {timeout_s:.0f} s while {doing}: the GPU or driver may be hung") from None
        if line is None:
            code = self.proc.wait()
            raise WorkerError(f"the benchmark worker died while {doing} (exit {code}): {self.last_error()}")
        return json.loads(line)

    def run(self, job: dict[str, Any], timeout_s: float, on_progress: Callable[[dict], None] | None = None) -> list[dict]:
        """Send one job (or a {"parallel": [...]} group); its results, or WorkerError."""
        self.next_id += 1
        job = {**job, "id": self.next_id}
        try:
            self.proc.stdin.write(json.dumps(job) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise WorkerError(f"the benchmark worker is gone: {self.last_error()}") from None
        deadline = time.monotonic() + timeout_s
        while True:
            message = self._next_message(deadline - time.monotonic(), f"running {_describe(job)}")
            if message.get("id") != job["id"]:
                continue
            if "progress" in message:
                if on_progress:
                    on_progress(message)
                continue
            return message["results"]

    def last_error(self) -> str:
        """The last line the worker wrote to stderr (its traceback's last line)."""
        try:
            self.stderr.seek(0)
            lines = [line.strip() for line in self.stderr.read().splitlines() if line.strip()]
        except (OSError, ValueError):
            return "no error output"
        return lines[-1] if lines else "no error output"

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()
        self.stderr.close()


def _describe(job: dict[str, Any]) -> str:
    if "parallel" in job:
        return " + ".join(_describe(j) for j in job["parallel"])
    return f"{job.get('module')} on {job.get('subject')}"
