"""`watch()`, the entry point of `gpuvet watch`: options checked, the tick loop, and where each
snapshot goes (live view, log, Prometheus exporter, change lines when headless, --once)."""

from __future__ import annotations

import contextlib
import json
import math
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import psutil
from rich.console import Console
from rich.live import Live

from ..facts import Machine
from ..samples import next_tick
from ..untrusted_text import one_line
from .keys import Keys, NoStream
from .log import WatchLog, snapshot_to_dict
from .monitor import SLOW_EVERY_S, Monitor
from .snapshot import Snapshot
from .view import render

EXIT_OK, EXIT_USAGE = 0, 2
ONCE_GAP_S = 0.5  # --once: CPU shares and rates need two readings this far apart


class _Stop(Exception):
    """SIGTERM: leave like on q (containers and service managers stop us this way)."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise _Stop()


@dataclass
class _Outputs:
    log: WatchLog | None = None
    exporter: Any = None  # exporter.Exporter
    print_changes: Callable[[str], None] | None = None  # headless: one line per diagnosis change
    _states: dict[str, str] = field(default_factory=dict)

    def publish(self, snap: Snapshot) -> None:
        if self.log is not None:
            self.log.write(snap)
        if self.exporter is not None:
            self.exporter.update(snap)
        if self.print_changes is not None:
            self._changes(snap, self.print_changes)

    def _changes(self, snap: Snapshot, print_changes: Callable[[str], None]) -> None:
        clock = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(snap.t))
        subjects = [(f"gpu{g.index}", g.diagnosis) for g in snap.gpus]
        if snap.job is not None and snap.job_diagnosis is not None:
            subjects.append((f"job {snap.job.pid}", snap.job_diagnosis))
        for subject, d in subjects:
            if d.state != "no_data" and self._states.get(subject) != d.state:
                self._states[subject] = d.state
                print_changes(f"{clock} {subject} {d.text}")

    def close(self) -> None:
        if self.log is not None:
            self.log.close()
        if self.exporter is not None:
            self.exporter.close()


def run_loop(monitor: Monitor, outputs: _Outputs, console: Console | None, keys: Keys,
             max_ticks: int | None = None) -> None:
    """Tick, publish, show, wait for the next tick or a key, until q (or max_ticks, for tests)."""
    live = Live(console=console, screen=True, auto_refresh=False, redirect_stdout=False,
                redirect_stderr=False) if console is not None else None
    due = time.monotonic()
    with live if live is not None else contextlib.nullcontext():
        while True:
            snap = monitor.tick()
            outputs.publish(snap)
            if live is not None:
                live.update(render(snap, interactive=keys.fd is not None, screen=True), refresh=True)
            if max_ticks is not None and snap.tick >= max_ticks:
                return
            due = next_tick(due, time.monotonic(), monitor.interval_s)
            while True:
                pressed = keys.wait(due - time.monotonic())
                if "q" in pressed.lower():
                    return
                if time.monotonic() >= due - 1e-3:
                    break


def _print_flushed(line: str) -> None:
    print(line, flush=True)  # a headless watch under systemd or a pipe: each change line at once


def _once(monitor: Monitor, as_json: bool, console: Console, outputs: _Outputs) -> None:
    """Two readings ONCE_GAP_S apart (CPU shares and rates need a before and an after), shown once."""
    monitor.tick()
    time.sleep(ONCE_GAP_S)
    snap = monitor.tick()
    outputs.publish(snap)
    if as_json:
        data = {**snapshot_to_dict(snap), "snapshot_s": ONCE_GAP_S}
        console.file.write(json.dumps(data, indent=2, allow_nan=False) + "\n")
        console.file.flush()
    else:
        frame = render(snap, interactive=False)
        width = console.width
        if not console.is_terminal:  # a pipe or a file: no screen edge to cut lines at ("NVLin…")
            console.width = max(width, frame.widest())
        try:
            console.print(frame)
            console.print(f"A {ONCE_GAP_S:g} s snapshot: two readings, so the diagnoses above are a first look; "
                          "`gpuvet watch` diagnoses over a sliding minute.", style="dim")
        finally:
            console.width = width


def _error(message: str) -> int:
    print(one_line(f"gpuvet watch: {message}"), file=sys.stderr)  # it may quote a path: cleaned, cut
    return EXIT_USAGE


def _check_options(interval_s: float, pid: int | None, once: bool, as_json: bool, log_path: str | None,
                   prometheus: str | None) -> str | None:
    if not interval_s or interval_s <= 0 or not math.isfinite(interval_s):
        return f"--interval {interval_s}: give a positive number of seconds"
    if interval_s < 0.05:
        return f"--interval {interval_s}: NVML readings take milliseconds; use 0.05 s or more"
    if as_json and not once:
        return "--json prints one snapshot: use it with --once (--log FILE records JSON lines over time)"
    if pid is not None and not psutil.pid_exists(pid):
        return f"--pid {pid}: no such process"
    if log_path:
        why = WatchLog.check_path(log_path)
        if why:
            return f"--log {log_path}: {why}"
    if prometheus:
        from .exporter import parse_listen

        try:
            parse_listen(prometheus)
        except ValueError as err:
            return f"--prometheus {prometheus}: {err}"
    return None


def watch(interval_s: float = 1.0, pid: int | None = None, once: bool = False, as_json: bool = False,
          log_path: str | None = None, prometheus: str | None = None, ui: bool = True,
          console: Console | None = None, machine: Machine | None = None) -> int:
    """`gpuvet watch`: returns the exit code (0, or 2 for bad options / a port that cannot be bound).

    `machine` (facts read once) is for tests; by default the live probe reads them at start."""
    problem = _check_options(interval_s, pid, once, as_json, log_path, prometheus)
    if problem:
        return _error(problem)
    console = console or Console(highlight=False)
    monitor = Monitor(interval_s, pid, machine=machine, threaded=not once, slow_every_s=0.0 if once else SLOW_EVERY_S)
    outputs = _Outputs()
    old_sigterm = None
    try:
        monitor.start()
        if log_path:
            outputs.log = WatchLog(log_path, interval_s, sorted(monitor._facts.items()), monitor.hostname,
                                   job_pid=pid, driver_version=monitor.machine.driver.version,
                                   gpu_error=monitor.gpu_error, host=monitor.machine.host,
                                   source=monitor.machine.source)
        if prometheus:
            from .exporter import Exporter, parse_listen

            outputs.exporter = Exporter()
            host, port = parse_listen(prometheus)
            try:
                bound = outputs.exporter.serve(host, port)
            except OSError as err:
                return _error(f"--prometheus {prometheus}: cannot listen there ({err.strerror or err})")
            print(f"gpuvet watch: serving http://{host if ':' not in host else f'[{host}]'}:{bound}/metrics", file=sys.stderr)
        if once:
            _once(monitor, as_json, console, outputs)
            return EXIT_OK
        if threading.current_thread() is threading.main_thread():
            old_sigterm = signal.signal(signal.SIGTERM, _on_sigterm)
        interactive = ui and console.is_terminal
        if not interactive:
            outputs.print_changes = _print_flushed
            logging_to = log_path if outputs.log is not None and not outputs.log.failed else None
            print(_headless_banner(monitor, logging_to), file=sys.stderr, flush=True)
        with Keys(sys.stdin if interactive else NoStream()) as keys:
            try:
                run_loop(monitor, outputs, console if interactive else None, keys)
            except (KeyboardInterrupt, _Stop):
                pass  # Ctrl-C or SIGTERM: the normal way to stop a monitor
        return EXIT_OK
    finally:
        if old_sigterm is not None:
            signal.signal(signal.SIGTERM, old_sigterm)
        outputs.close()
        monitor.close()
        if outputs.log is not None and outputs.log.failed and ui and console.is_terminal:
            print(one_line(f"gpuvet watch: {outputs.log.failed}"), file=sys.stderr)  # said under the live screen: again


def _headless_banner(monitor: Monitor, log_path: str | None) -> str:
    gpus = f"{len(monitor._facts)} GPU(s)" if monitor._facts else f"the host only (no GPU data: {monitor.gpu_error})"
    logging = f", logging to {log_path}" if log_path else ""
    return (f"gpuvet watch: watching {gpus} every {monitor.interval_s:g} s{logging}; a line is printed when a "
            "diagnosis changes; Ctrl-C or SIGTERM stops")
