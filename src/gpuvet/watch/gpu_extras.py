"""The once-a-second GPU readings besides the sampler's: PCIe and NVLink throughput and each GPU's
process list from NVML, and the helper thread that reads them so the view never waits on NVML."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from ..facts import Gpu, GpuProcess
from ..probe import nvml, nvml_events
from ..samples import next_tick
from ..telemetry import gpu_gone_reason, is_permanent_error
from .host import rate_per_s
from .snapshot import GpuExtras


class GpuExtrasReader:
    """PCIe and NVLink throughput and the process list of each GPU (NVML must be started).

    A call the GPU or driver lacks is dropped for good with its reason, like telemetry._GpuReader;
    a GPU that is gone (fell off the bus...) is not asked again."""

    def __init__(self, gpus: dict[int, Gpu], clock: Callable[[], float] = time.monotonic):
        self.gpus = gpus
        self.clock = clock
        self.unavailable: dict[int, dict[str, str]] = {i: {} for i in gpus}
        self._nvlink_last: dict[int, tuple[float, int, int]] = {}
        self._handles: dict[int, Any] = {}
        self._minor: dict[int, int] = {}
        for index in gpus:
            try:
                self._handles[index] = nvml.pynvml.nvmlDeviceGetHandleByIndex(index)
            except Exception as err:
                self.unavailable[index]["gpu"] = nvml.error_reason(err)
                continue
            try:
                self._minor[index] = int(nvml.pynvml.nvmlDeviceGetMinorNumber(self._handles[index]))
            except Exception:
                pass  # the exporter names the device by its index instead
        # NVML's Xid events while the watch runs: DCGM_FI_DEV_XID_ERRORS, the last one per GPU.
        self.xids = nvml_events.XidWatch(len(gpus), during="watch") if self._handles else None

    def read_all(self) -> dict[int, tuple[GpuExtras, list[GpuProcess] | None]]:
        return {index: self._read(index, handle) for index, handle in self._handles.items()}

    def _call(self, index: int, what: str, fn: Callable[[], Any]) -> Any:
        if what in self.unavailable[index]:
            return None
        try:
            return fn()
        except Exception as err:
            gone = gpu_gone_reason(err)
            if gone is not None:
                self.unavailable[index]["gone"] = gone
            elif is_permanent_error(err):
                self.unavailable[index][what] = nvml.error_reason(err)
            return None

    def _read(self, index: int, handle: Any) -> tuple[GpuExtras, list[GpuProcess] | None]:
        gone = self.unavailable[index].get("gone")
        if gone is not None:
            return GpuExtras(unavailable={"gone": gone, "processes": gone, "pcie_tx": gone},
                             minor_number=self._minor.get(index)), None
        p = nvml.pynvml
        extras = GpuExtras()
        extras.pcie_tx_kbs = self._call(index, "pcie_tx", lambda: p.nvmlDeviceGetPcieThroughput(handle, p.NVML_PCIE_UTIL_TX_BYTES))
        extras.pcie_rx_kbs = self._call(index, "pcie_rx", lambda: p.nvmlDeviceGetPcieThroughput(handle, p.NVML_PCIE_UTIL_RX_BYTES))
        extras.nvlink_tx_bps, extras.nvlink_rx_bps = self._nvlink(index, handle)
        self._health_counters(index, handle, extras)
        extras.last_xid = self.xids.last(index) if self.xids is not None else None
        processes = None
        if "processes" not in self.unavailable[index]:
            holder = Gpu(index=index)
            processes = nvml.processes_of(handle, nvml.Query(holder))
            if processes is None and "processes" in holder.unavailable:
                self.unavailable[index]["processes"] = holder.unavailable["processes"]
        extras.unavailable = dict(self.unavailable[index])
        extras.minor_number = self._minor.get(index)
        return extras, processes

    def _health_counters(self, index: int, handle: Any, extras: GpuExtras) -> None:
        """The counters dcgm-exporter serves by default that NVML answers: PCIe replays, energy,
        memory temperature, remapped rows."""
        p = nvml.pynvml
        extras.pcie_replays = self._call(index, "pcie_replays", lambda: p.nvmlDeviceGetPcieReplayCounter(handle))
        extras.energy_mj = self._call(index, "energy", lambda: p.nvmlDeviceGetTotalEnergyConsumption(handle))
        values = self._call(index, "memory_temp", lambda: p.nvmlDeviceGetFieldValues(handle, [p.NVML_FI_DEV_MEMORY_TEMP]))
        reading = getattr(values[0].value, "uiVal", None) if values and values[0].nvmlReturn == p.NVML_SUCCESS else None
        extras.memory_temp_c = float(reading) if reading is not None else None
        rows = self._call(index, "remapped_rows", lambda: p.nvmlDeviceGetRemappedRows(handle))
        if rows is not None:  # (correctable, uncorrectable, pending, failure)
            extras.remapped_rows_correctable, extras.remapped_rows_uncorrectable = int(rows[0]), int(rows[1])
            extras.row_remap_failure = bool(rows[3])
        extras.vgpu_license_status = self._vgpu_license(index, handle)

    def _vgpu_license(self, index: int, handle: Any) -> int | None:
        """DCGM_FI_DEV_VGPU_LICENSE_STATUS, read as DCGM reads it (DcgmCacheManager.cpp): NVML's
        licensable features; 0 when the GPU supports no licence, else 1 when the vGPU feature (any
        feature, when none is coded vGPU) is licensed. Only on a vGPU guest's GPU: elsewhere (bare
        metal, passthrough) there is no vGPU licence to report, and the reason says so."""
        mode = self.gpus[index].virtualization_mode
        if mode != "vgpu":
            self.unavailable[index].setdefault("vgpu_license", f"not available: not a vGPU (virtualization mode {mode or 'not read'})")
            return None
        p = nvml.pynvml
        licence = self._call(index, "vgpu_license", lambda: p.nvmlDeviceGetGridLicensableFeatures(handle))
        if licence is None:
            return None
        if not licence.isGridLicenseSupported:
            return 0
        features = list(licence.gridLicensableFeatures)[: int(licence.licensableFeaturesCount)]
        vgpu = [f for f in features if f.featureCode == p.NVML_GRID_LICENSE_FEATURE_CODE_VGPU] or features
        if not vgpu:
            self.unavailable[index].setdefault("vgpu_license", "not available: NVML lists no licensable feature")
            return None
        return 1 if any(f.featureState for f in vgpu) else 0

    def _nvlink(self, index: int, handle: Any) -> tuple[float | None, float | None]:
        """Bytes/s over the GPU's active NVLinks, from NVML's cumulative KiB counters."""
        gpu = self.gpus[index]
        if gpu.nvlinks is None:  # the facts probe could not list them: say so once, in place of a rate
            self.unavailable[index].setdefault("nvlink", "links not listed: " + gpu.unavailable.get("nvlinks", "not read at start"))
            return None, None
        links = [link.link for link in gpu.nvlinks if link.active]
        if not links:
            return None, None
        p = nvml.pynvml
        fields = [(p.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, link) for link in links]
        fields += [(p.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, link) for link in links]
        values = self._call(index, "nvlink", lambda: p.nvmlDeviceGetFieldValues(handle, fields))
        if values is None:
            return None, None
        if any(v.nvmlReturn != p.NVML_SUCCESS for v in values):
            return None, None
        ok = [v.value.ullVal for v in values]
        tx, rx = sum(ok[: len(links)]) * 1024, sum(ok[len(links):]) * 1024
        now = self.clock()
        last = self._nvlink_last.get(index)
        self._nvlink_last[index] = (now, tx, rx)
        if last is None:
            return None, None
        return rate_per_s(last[1], tx, now - last[0]), rate_per_s(last[2], rx, now - last[0])


class Periodic:
    """Runs `fn` every `every_s` on a daemon thread and keeps its last result (NVML calls that block)."""

    def __init__(self, fn: Callable[[], Any], every_s: float):
        self._fn, self._every_s = fn, every_s
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._result: Any = None
        self._thread = threading.Thread(target=self._run, name="gpuvet-watch-extras", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        tick = time.monotonic()
        while not self._stop.is_set():
            try:
                result = self._fn()
            except Exception:  # a bug must not kill the view; the last result stays
                result = None
            if result is not None:
                with self._lock:
                    self._result = result
            tick = next_tick(tick, time.monotonic(), self._every_s)
            self._stop.wait(max(0.0, tick - time.monotonic()))

    def latest(self) -> Any:
        with self._lock:
            return self._result

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)
