"""gpuvet watch: a live view of a running job that says why it is slow, and a Prometheus endpoint.

One `telemetry.Sampler` reads every GPU at the chosen interval on its own thread; each tick of the
watch takes `Sampler.latest()`, keeps a window of it, and once a second reads what is slower or
costlier to read: the host (CPU, steal, IO wait, memory, disk and network rates, DataLoader-like
worker processes), the processes on each GPU, and PCIe/NVLink throughput (nvmlDeviceGetPcieThroughput
blocks ~20 ms per call, so a helper thread reads it and the view never waits for it). The judge's
`diagnose` rules turn the window into one line per GPU.

Outputs, any together: the live view (rich Live, q or Ctrl-C quits and restores the terminal),
`--once` (one snapshot, `--json` for JSON), `--log FILE` (JSON lines, rows in the columns of
`telemetry.to_series`; `read_log()` turns them back into run-record series), `--prometheus`
(`watch/exporter.py`), and `--no-ui` for servers: it prints a line when a GPU's diagnosis changes.

Without a GPU or NVML the host part works and the GPU part says why it is empty.

The package, one concern a module: snapshot (what one tick shows), processes (the /proc process
table, the job tree), host (host samples), gpu_extras (PCIe/NVLink, GPU process lists), monitor
(the state between ticks, building each snapshot), view (rich), log (the JSON: --once --json and
--log), keys (the terminal), loop (`watch()` and the tick loop).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Each name loads its module when first used: reading a log (gpuvet report, inspect) needs
# neither psutil (host, processes) nor rich (view, loop), which a broken install may lack.
_MODULE_OF = {name: module for module, names in {
    "gpu_extras": ["GpuExtrasReader"],
    "host": ["WORKER_MIN_CPU_PCT", "HostReader", "cpu_shares"],
    "log": ["HOST_COLUMNS", "JOB_COLUMNS", "LOG_SCHEMA", "WatchLog", "gpu_facts", "gpu_to_dict", "parse_log", "read_log",
            "snapshot_to_dict"],
    "monitor": ["HOST_KEEP_S", "SLOW_EVERY_S", "Monitor"],
    "processes": ["ProcessTable", "ProcStat", "descendants", "parse_proc_stat", "same_process"],
    "snapshot": ["GpuExtras", "GpuView", "HostReading", "JobReading", "ProcessView", "Snapshot", "WorkerView"],
    "loop": ["EXIT_OK", "EXIT_USAGE", "ONCE_GAP_S", "run_loop", "watch"],
    "view": ["render"],
}.items() for name in names}


def __getattr__(name: str) -> Any:
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_MODULE_OF[name]}", __name__), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from .gpu_extras import GpuExtrasReader
    from .host import WORKER_MIN_CPU_PCT, HostReader, cpu_shares
    from .log import HOST_COLUMNS, JOB_COLUMNS, LOG_SCHEMA, WatchLog, gpu_facts, gpu_to_dict, parse_log, read_log, snapshot_to_dict
    from .loop import EXIT_OK, EXIT_USAGE, ONCE_GAP_S, run_loop, watch
    from .monitor import HOST_KEEP_S, SLOW_EVERY_S, Monitor
    from .processes import ProcessTable, ProcStat, descendants, parse_proc_stat, same_process
    from .snapshot import GpuExtras, GpuView, HostReading, JobReading, ProcessView, Snapshot, WorkerView
    from .view import render

__all__ = [
    "EXIT_OK", "EXIT_USAGE", "HOST_COLUMNS", "HOST_KEEP_S", "JOB_COLUMNS", "LOG_SCHEMA", "ONCE_GAP_S", "SLOW_EVERY_S",
    "WORKER_MIN_CPU_PCT", "GpuExtras", "GpuExtrasReader", "GpuView", "HostReader", "HostReading", "JobReading",
    "Monitor", "ProcStat", "ProcessTable", "ProcessView", "Snapshot", "WatchLog", "WorkerView", "cpu_shares",
    "descendants", "gpu_facts", "gpu_to_dict", "parse_log", "parse_proc_stat", "read_log", "render", "run_loop", "same_process",
    "snapshot_to_dict", "watch",
]
