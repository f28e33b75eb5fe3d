"""NVML's Xid events while gpuvet's own benchmarks or `watch` run: an Xid during load is named with
the benchmark it hit (what the kernel log cannot say). NVML must already be started; a driver or
GPU without event support leaves the watch empty with its reason."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timezone
from dataclasses import dataclass
from typing import Any

from ..facts import KernelEvent
from . import nvml

_WAIT_MS = 500  # each wait returns at least this often, so stop() is quick


@dataclass
class XidEvent:
    gpu: int
    code: int
    at: float  # time.time()
    during: str  # what gpuvet was doing: "benchmark gemm", "watch"


class XidWatch:
    """A thread waiting on NVML's critical-Xid events of every GPU; `during` names the step."""

    def __init__(self, gpu_count: int, during: str = "gpuvet"):
        self.during = during
        self.events: list[XidEvent] = []
        self.unavailable: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        p = nvml.pynvml
        try:
            self._set = p.nvmlEventSetCreate()
            for index in range(gpu_count):
                handle = p.nvmlDeviceGetHandleByIndex(index)
                p.nvmlDeviceRegisterEvents(handle, p.nvmlEventTypeXidCriticalError, self._set)
        except Exception as err:  # NotSupported on vGPU guests, old drivers, no NVML
            self.unavailable = f"NVML Xid events not available: {nvml.error_reason(err)}"
            return
        self._thread = threading.Thread(target=self._run, name="gpuvet-xid-events", daemon=True)
        self._thread.start()

    def last(self, gpu: int) -> int | None:
        """The last Xid of `gpu` seen; 0 while watching and none came (DCGM's XID_ERRORS); None: not watched."""
        if self._thread is None:
            return None
        codes = [e.code for e in self.events if e.gpu == gpu]
        return codes[-1] if codes else 0

    def _run(self) -> None:
        p = nvml.pynvml
        while not self._stop.is_set():
            try:
                data = p.nvmlEventSetWait_v2(self._set, _WAIT_MS)
            except Exception as err:
                if isinstance(err, p.NVMLError) and err.value == p.NVML_ERROR_TIMEOUT:
                    continue
                self.unavailable = f"NVML Xid events stopped: {nvml.error_reason(err)}"
                return
            self.events.append(XidEvent(_index(data.device), int(data.eventData), time.time(), self.during))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * _WAIT_MS / 1000)
            try:
                nvml.pynvml.nvmlEventSetFree(self._set)
            except Exception:
                pass  # NVML shut down first: the set went with it

    def as_kernel_events(self, bus_ids: dict[int, str | None]) -> list[KernelEvent]:
        """The events in the form gpu.xid judges, their line saying what they hit."""
        return [KernelEvent("xid", bus_ids.get(e.gpu), e.code, None, None,
                            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.at)), None,
                            f"NVML Xid event {e.code} on GPU {e.gpu} during {e.during}",
                            datetime.fromtimestamp(e.at, timezone.utc).isoformat(timespec="seconds")) for e in self.events]


def _index(handle: Any) -> int:
    try:
        return int(nvml.pynvml.nvmlDeviceGetIndex(handle))
    except Exception:
        return -1
