"""The parent side of the benchmark worker: start it, send jobs, enforce each job's deadline.

A job that overruns its deadline (a hung GPU, a stuck NCCL init) kills the worker; the job ends
as a failure with that reason and the next job gets a fresh worker. Jobs that run side by side
(one per GPU) report their results one by one, so a hang names the jobs that did not finish and
the others keep their figures. Ctrl-C kills the worker at once, so nothing is left running on
the GPUs.
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
from typing import IO, Any, Callable

from .leftovers import signals_deferred

START_TIMEOUT_S = 120  # importing a CUDA build of torch on a slow disk can take a minute
CLOSE_WAIT_S = 2.0  # an idle worker exits as soon as its input closes; a busy one is not waited for
TERM_GRACE_S = 1.0  # after SIGTERM, this long before SIGKILL
KILL_WAIT_S = 5.0  # a process stuck in the driver (a hung GPU) may not die: gpuvet goes on without it


class WorkerError(Exception):
    """The worker could not start, died, or overran a deadline; the message says which.

    `results`: for a job group, each job's result where it finished before the worker was lost,
    else None. `hung`: the deadline passed (rather than the worker dying)."""

    def __init__(self, message: str, results: list[dict | None] | None = None, hung: bool = False):
        super().__init__(message)
        self.results = results or []
        self.hung = hung


class Worker:
    def __init__(self, env: dict[str, str | None] | None = None, start_timeout_s: float = START_TIMEOUT_S):
        """`env`: variables set for the worker on top of gpuvet's environment; None removes one."""
        environ = dict(os.environ)
        for name, value in (env or {}).items():
            if value is None:
                environ.pop(name, None)
            else:
                environ[name] = value
        self.stderr = tempfile.TemporaryFile(mode="w+")
        started = False
        try:
            # Held back while it forks: a Ctrl-C landing inside Popen would otherwise leave a
            # worker that this object never learnt of, running on after gpuvet (seen: 3 in 8).
            with signals_deferred():
                self._start(environ)
                started = True
            hello = self._next_message(start_timeout_s, "starting the benchmark worker")
        except BaseException as err:  # Ctrl-C while torch imports: the worker must not outlive us
            if started:
                self.close(interrupted=not isinstance(err, WorkerError))
            else:
                self.stderr.close()
            raise
        if not hello.get("ready"):
            self.close()
            raise WorkerError(hello.get("error") or "the benchmark worker did not start")
        self.info = hello

    def _start(self, environ: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpuvet.bench.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            env=environ,
            start_new_session=True,  # its own process group: killing it ends its children too
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None  # both opened as PIPE
        self.to_worker: IO[str] = self.proc.stdin
        self.from_worker: IO[str] = self.proc.stdout
        self.ended = False  # the process group has been killed
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.next_id = 0

    def _read(self) -> None:
        for line in self.from_worker:
            self.lines.put(line)
        self.lines.put(None)  # the worker exited

    def _next_message(self, timeout_s: float, doing: str, waited_s: float | None = None) -> dict[str, Any]:
        """The next protocol line, waiting at most `timeout_s` (`waited_s`: the whole wait so far
        and now, for the message)."""
        try:
            line = self.lines.get(timeout=max(0.1, timeout_s))
        except queue.Empty:
            self.kill()
            waited = timeout_s if waited_s is None else waited_s
            raise WorkerError(f"no answer after {waited:.0f} s while {doing}: the GPU or driver may be hung",
                              hung=True) from None
        if line is None:
            code = self.proc.wait()
            raise WorkerError(f"the benchmark worker died while {doing} (exit {code}): {self.last_error()}")
        try:
            return json.loads(line)
        except ValueError:  # a line cut off: the worker died while writing it (killed, segfault after an Xid)
            ended: int | str
            try:
                ended = self.proc.wait(timeout=KILL_WAIT_S)
            except subprocess.TimeoutExpired:  # alive but talking nonsense: it cannot be trusted with a GPU
                self.kill()
                ended = "killed: its reply was unreadable"
            raise WorkerError(f"the benchmark worker died while {doing} (exit {ended}): {self.last_error()}") from None

    def run(self, job: dict[str, Any], timeout_s: float, on_progress: Callable[[dict], None] | None = None) -> list[dict]:
        """Send one job (or a {"parallel": [...]} group); its results, or WorkerError naming the
        jobs that did not finish (with the results of those that did)."""
        self.next_id += 1
        job = {**job, "id": self.next_id}
        parts = job.get("parallel") or [job]
        results: list[dict | None] = [None] * len(parts)
        try:
            self.to_worker.write(json.dumps(job) + "\n")
            self.to_worker.flush()
        except (BrokenPipeError, OSError):
            raise WorkerError(f"the benchmark worker is gone: {self.last_error()}", results) from None
        deadline = time.monotonic() + timeout_s
        last: dict[int, str] = {}  # each job's latest progress line: where a hung one stopped
        while True:
            unfinished = [_describe([p]) + (f" (last progress: {last[i]})" if i in last else "")
                          for i, (p, r) in enumerate(zip(parts, results)) if r is None]
            try:
                message = self._next_message(deadline - time.monotonic(), f"running {' + '.join(unfinished)}", timeout_s)
            except WorkerError as err:
                raise WorkerError(str(err), results, err.hung) from None
            if message.get("id") != job["id"]:
                continue
            if "progress" in message:
                last[message.get("part", 0)] = message["progress"]
                if on_progress:
                    on_progress(message)
            elif "result" in message:
                part = message.get("part", 0)
                if 0 <= part < len(results):
                    results[part] = message["result"]
            elif message.get("done"):
                return [r if r is not None else {"ok": False, "error": "the worker sent no result"} for r in results]

    def last_error(self) -> str:
        """The last line the worker wrote to stderr (its traceback's last line)."""
        try:
            self.stderr.seek(0)
            lines = [line.strip() for line in self.stderr.read().splitlines() if line.strip()]
        except (OSError, ValueError):
            return "no error output"
        return lines[-1] if lines else "no error output"

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        """SIGKILL to the worker's whole process group (its own children too: NCCL ranks, the
        workload's fresh process), even when the worker itself has already exited."""
        if self.ended:
            return  # signalled once already: its group id may belong to someone else by now
        self._signal(signal.SIGKILL)
        try:
            self.proc.wait(timeout=KILL_WAIT_S)
        except subprocess.TimeoutExpired:
            pass
        self.ended = True

    def stop(self) -> None:
        """SIGTERM to the worker's process group, SIGKILL once it has had TERM_GRACE_S."""
        if self.proc.poll() is None and not self.ended:
            self._signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=TERM_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
        self.kill()

    def close(self, interrupted: bool = False) -> None:
        """End the worker. Normally it gets CLOSE_WAIT_S to exit on its own (it does at once when
        idle); `interrupted` (Ctrl-C, SIGTERM) stops it at once. Closing twice does nothing."""
        if not self.ended:
            if self.proc.poll() is None and not interrupted:
                try:
                    self.to_worker.close()
                    self.proc.wait(timeout=CLOSE_WAIT_S)
                except (OSError, subprocess.TimeoutExpired):
                    pass
            self.stop()
        for stream in (self.to_worker, self.stderr):
            try:
                stream.close()
            except OSError:
                pass


def _describe(jobs: list[dict[str, Any]]) -> str:
    described = []
    for job in jobs:
        if "parallel" in job:
            described.append(_describe(job["parallel"]))
        else:
            described.append(f"{job.get('module')} on {job.get('subject')}")
    return " + ".join(described)
