"""The watch's JSON, named by LOG_SCHEMA: one snapshot as an object (`--once --json`), and the
JSON-lines log of `--log` (WatchLog writes it; read_log turns it back into run-record series)."""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import sys
import time
from dataclasses import asdict
from typing import Any

from .. import __version__
from ..facts import Gpu, Host
from ..judge.diagnose import Diagnosis
from ..record.watch import WATCH_SCHEMA, parse_log, read_log  # noqa: F401 (the log's reader lives with its types)
from ..samples import COLUMNS, to_series
from ..untrusted_text import one_line
from .snapshot import GpuView, Snapshot

LOG_SCHEMA = WATCH_SCHEMA
HOST_COLUMNS = ("t", "cpu_pct", "steal_pct", "iowait_pct", "mem_used_bytes", "disk_read_bps", "disk_write_bps",
                "net_rx_bps", "net_tx_bps", "workers", "workers_cpu_pct")
JOB_COLUMNS = ("t", "alive", "processes", "cpu_pct", "read_bps", "write_bps", "gpus")  # gpus: "0,1"


def host_facts(host: Host | None) -> dict[str, Any]:
    h = host or Host()
    return {"cpu_model": h.cpu_model, "cpu_logical_cores": h.cpu_logical_cores, "cpu_usable_cores": h.cpu_usable_cores,
            "memory_total_bytes": h.memory_total_bytes, "hypervisor": h.hypervisor, "container": h.container, "cloud": h.cloud}


def gpu_facts(gpu: Gpu) -> dict[str, Any]:
    """What a report of the log needs to know of a GPU besides its readings: the reference lines
    of its plots (max SM clock, slowdown temperature, power limits) and its name."""
    return {"name": gpu.name, "uuid": gpu.uuid, "bus_id": gpu.pcie.bus_id, "memory_total_mib": gpu.memory_total_mib,
            "max_sm_mhz": gpu.clocks.max_sm_mhz, "slowdown_c": gpu.thermal.slowdown_c,
            "power_limit_w": gpu.power.enforced_limit_w, "default_power_limit_w": gpu.power.default_limit_w,
            "min_power_limit_w": gpu.power.min_limit_w, "max_power_limit_w": gpu.power.max_limit_w}


# -- JSON ------------------------------------------------------------------------------------------

def _round(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 3) if math.isfinite(value) else None
    return value


def gpu_to_dict(view: GpuView) -> dict[str, Any]:
    s, f, e = view.sample, view.facts, view.extras
    return {
        "index": view.index,
        "name": view.name,
        "uuid": view.uuid,
        "bus_id": view.bus_id,
        "sample": {c: _round(getattr(s, c)) for c in COLUMNS} if s else None,
        "max_sm_mhz": f.clocks.max_sm_mhz,
        "sm_pct_of_max": _round(None if view.sm_ratio is None else 100 * view.sm_ratio),
        "power_pct_of_limit": _round(None if view.power_ratio is None else 100 * view.power_ratio),
        "default_power_limit_w": f.power.default_limit_w,
        "memory_total_mib": f.memory_total_mib,
        "mig_instances": view.mig_instances,
        "slowdown_margin_c": _round(view.slowdown_margin_c),
        "reasons": view.reasons,
        "pcie": {"tx_kbs": e.pcie_tx_kbs, "rx_kbs": e.pcie_rx_kbs},
        "nvlink": {"tx_bps": _round(e.nvlink_tx_bps), "rx_bps": _round(e.nvlink_rx_bps)},
        "processes": [asdict(p) for p in e.processes] if e.processes is not None else None,
        "unavailable": e.unavailable,
        "diagnosis": view.diagnosis.to_dict(),
    }


def snapshot_to_dict(snap: Snapshot) -> dict[str, Any]:
    host = None
    if snap.host is not None:
        host = {k: _round(v) for k, v in asdict(snap.host).items() if k != "worker_list"}
        host["worker_list"] = [asdict(w) for w in snap.host.worker_list]
    return {
        "schema": LOG_SCHEMA,
        "gpuvet": __version__,
        "t": _round(snap.t),
        "hostname": snap.hostname,
        "driver_version": snap.driver_version,
        "source": snap.source,
        "gpu_error": snap.gpu_error,
        "gpus": [gpu_to_dict(g) for g in snap.gpus],
        "host": host,
        "job": asdict(snap.job) if snap.job else None,
        "job_diagnosis": snap.job_diagnosis.to_dict() if snap.job_diagnosis else None,
    }


# -- the log (JSON lines) --------------------------------------------------------------------------

class WatchLog:
    """JSON lines: a header naming the series and their columns, then one line per row.

    GPU rows use telemetry.COLUMNS exactly as telemetry.to_series writes them (t in seconds since
    the header's t0), so the report plots a watch log like a benchmark's telemetry. A file that
    already holds a watch log gets a new session appended; any other existing file is refused."""

    def __init__(self, path: str, interval_s: float, gpus: list[tuple[int, Gpu]], hostname: str,
                 job_pid: int | None = None, driver_version: str | None = None, gpu_error: str | None = None,
                 host: Host | None = None, source: str = "live"):
        self.path = path
        self.t0 = time.time()
        self.failed: str | None = None  # why the log stopped (a full disk): watching goes on without it
        self._lines_kept = 0
        cut_off = _ends_mid_line(path)  # a watch killed mid-write: the new session's header starts a line of its own
        # Unbuffered: each line reaches the file when written, so a full disk keeps every line
        # before it (a buffered file lost them all, 0 bytes) and close() has nothing left to fail on.
        self._file: Any = None
        try:
            self._file = open(path, "ab", buffering=0)
        except OSError as err:
            self._fail(err)
        if cut_off:
            self._put(b"\n")
        self._last_t: dict[int, float] = {}
        self._states: dict[str, str] = {}
        series: dict[str, Any] = {
            f"gpu{i}": {"name": "watch.telemetry", "columns": list(COLUMNS), "gpu": g.name, "uuid": g.uuid, "facts": gpu_facts(g)}
            for i, g in gpus}
        series["host"] = {"name": "watch.host", "columns": list(HOST_COLUMNS), "facts": host_facts(host)}
        if job_pid is not None:
            series["job"] = {"name": "watch.job", "columns": list(JOB_COLUMNS), "pid": job_pid}
        header = {
            "schema": LOG_SCHEMA,
            "kind": "header",
            "gpuvet": __version__,
            "hostname": hostname,
            "driver_version": driver_version,
            "gpu_error": gpu_error,  # why GPUs are missing (no driver, NVML failed)
            "source": source,  # "live", or "replay: FILE" under GPUVET_NVML_REPLAY: not this machine's readings
            "t0": self.t0,
            "interval_s": interval_s,
            "series": series,
            "note": "rows of each subject use the columns named here, as telemetry.to_series writes them: "
                    "t is seconds since t0; {\"subject\", \"diagnosis\"} lines record diagnosis changes; "
                    "a GPU's \"facts\" are read once at start; gpuvet.watch.read_log() turns this file into "
                    "run-record series",
        }
        self._write(header)

    @staticmethod
    def check_path(path: str) -> str | None:
        """Why `path` cannot take a watch log (None: it can)."""
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            return f"the folder {folder} does not exist"
        if os.path.isdir(path):
            return "is a folder; give a file name"
        if os.path.exists(path) and os.path.getsize(path) > 0:
            with open(path, "rb") as f:
                head = f.read(200)
            if LOG_SCHEMA.encode() not in head:
                return "the file exists and is not a gpuvet watch log; choose another name"
        return None

    def _write(self, obj: dict) -> None:
        if self._put((json.dumps(obj, separators=(",", ":"), allow_nan=False) + "\n").encode("utf-8")):
            self._lines_kept += 1

    def _put(self, data: bytes) -> bool:
        """Write all of `data`; on an error (ENOSPC, EIO, EFBIG) stop logging, say why in one line."""
        if self._file is None:
            return False
        try:
            view = memoryview(data)
            while view:  # a short write on a filling disk: the rest, until the error comes
                written = self._file.write(view)
                if not written:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                view = view[written:]
            return True
        except OSError as err:
            self._fail(err)
            return False

    def _fail(self, err: OSError) -> None:
        self.failed = (f"--log {self.path}: cannot write to it ({err.strerror or err}); {self._lines_kept} "
                       "line(s) of this session kept, watching goes on without the log")
        print(one_line(f"gpuvet watch: {self.failed}"), file=sys.stderr, flush=True)
        self.close()

    def write(self, snap: Snapshot) -> None:
        for view in snap.gpus:
            s = view.sample
            if s is not None and self._last_t.get(view.index) != s.t:
                self._last_t[view.index] = s.t
                row = to_series([s], "watch.telemetry", f"gpu{view.index}", snap.interval_s)["rows"][0]
                row[0] = round(s.t - self.t0, 3)
                self._write({"subject": f"gpu{view.index}", "row": row})
            self._diagnosis(f"gpu{view.index}", view.diagnosis, snap.t)
        if snap.host is not None and self._last_t.get(-1) != snap.host.t:
            self._last_t[-1] = snap.host.t
            row = [round(snap.host.t - self.t0, 3)] + [_round(getattr(snap.host, c)) for c in HOST_COLUMNS[1:]]
            self._write({"subject": "host", "row": row})
            if snap.job is not None:  # read with the host, once a second
                job = snap.job
                self._write({"subject": "job", "row": [row[0], job.alive, job.processes, _round(job.cpu_pct),
                                                        _round(job.read_bps), _round(job.write_bps),
                                                        ",".join(map(str, job.gpus))]})
        if snap.job_diagnosis is not None:
            self._diagnosis("job", snap.job_diagnosis, snap.t)

    def _diagnosis(self, subject: str, d: Diagnosis, t: float) -> None:
        if self._states.get(subject) == d.state:
            return
        self._states[subject] = d.state
        self._write({"subject": subject, "t": round(t - self.t0, 3), "diagnosis": {"state": d.state, "text": d.text}})

    def close(self) -> None:
        if self._file is not None:
            file, self._file = self._file, None
            with contextlib.suppress(OSError):
                file.close()


def _ends_mid_line(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            if f.tell() == 0:
                return False
            f.seek(-1, os.SEEK_END)
            return f.read(1) != b"\n"
    except OSError:
        return False
