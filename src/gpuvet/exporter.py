"""`gpuvet watch --prometheus [HOST:]PORT`: the watch's readings and diagnoses on /metrics.

GPU gauges carry the names and labels of NVIDIA's dcgm-exporter (its classic default-counters.csv:
DCGM_FI_DEV_GPU_UTIL, DCGM_FI_DEV_SM_CLOCK, ... with labels gpu, UUID, pci_bus_id, modelName,
Hostname, DCGM_FI_DRIVER_VERSION) so existing Grafana dashboards and alerts work unchanged; what
DCGM has no field for is named gpuvet_*: the host (CPU, steal, IO wait, workers), the followed job,
and the diagnosis as a state set: gpuvet_diagnosis{gpu="0",state="power_capped"} 1, the other states 0.

The metrics are built from the watch's latest snapshot when Prometheus scrapes, so a GPU or a
state that goes away leaves no stale series behind. Default bind: 127.0.0.1 (the numbers say
what runs on the machine; exposing them is the user's choice: 0.0.0.0:9400).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from .facts import CLOCK_EVENT_REASONS
from .judge.diagnose import GPU_STATES, STATES

if TYPE_CHECKING:
    from .watch import GpuView, Snapshot

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 9400  # dcgm-exporter's port: run one or the other on a node
GPU_LABELS = ("gpu", "UUID", "pci_bus_id", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION")


def parse_listen(spec: str) -> tuple[str, int]:
    """"9400" -> ("127.0.0.1", 9400); "0.0.0.0:9400"; "[::1]:9400". ValueError says what is wrong."""
    spec = (spec or "").strip()
    host, _, port_text = spec.rpartition(":") if ":" in spec else ("", "", spec)
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError("write an IPv6 address in brackets, e.g. [::1]:9400")
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError("expected [HOST:]PORT with PORT a number from 0 to 65535, e.g. 9400 or 0.0.0.0:9400")
    return host or DEFAULT_HOST, int(port_text)


# -- building the families ---------------------------------------------------------------------------

# (metric name, help, value of a GpuView): dcgm-exporter's names and units where DCGM has the field.
def _sample(field: str) -> Callable[["GpuView"], Any]:
    return lambda view: getattr(view.sample, field) if view.sample is not None else None


def _fb_free(view: "GpuView") -> float | None:
    total, used = view.facts.memory_total_mib, view.sample.mem_used_mib if view.sample else None
    return total - used if total is not None and used is not None else None


_DCGM_GAUGES: tuple[tuple[str, str, Callable[["GpuView"], Any]], ...] = (
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", _sample("util_pct")),
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", _sample("sm_mhz")),
    ("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", _sample("mem_mhz")),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", _sample("power_w")),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", _sample("temp_c")),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", _sample("mem_used_mib")),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", _fb_free),
    # NVML's PCIe throughput is a rate (KB/s over 20 ms); dcgm-exporter declares these counters, the
    # values it serves are the same rate, so dashboards read them as gauges either way.
    ("DCGM_FI_DEV_PCIE_TX_THROUGHPUT", "PCIe TX throughput (in KB/s) via NVML.", lambda v: v.extras.pcie_tx_kbs),
    ("DCGM_FI_DEV_PCIE_RX_THROUGHPUT", "PCIe RX throughput (in KB/s) via NVML.", lambda v: v.extras.pcie_rx_kbs),
    ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "Clock-event (throttle) reasons, NVML bitmask.", _sample("reasons")),
)

_GPUVET_GAUGES: tuple[tuple[str, str, Callable[["GpuView"], Any]], ...] = (
    ("gpuvet_sm_clock_max_mhz", "Maximum SM clock of the GPU (MHz).", lambda v: v.facts.clocks.max_sm_mhz),
    ("gpuvet_sm_clock_ratio", "SM clock as a share of its maximum (0..1).", lambda v: v.sm_ratio),
    ("gpuvet_power_limit_watts", "Enforced power limit (W).", _sample("power_limit_w")),
    ("gpuvet_power_default_limit_watts", "The GPU's default power limit (W).", lambda v: v.facts.power.default_limit_w),
    ("gpuvet_temp_slowdown_margin_celsius", "Degrees left before the GPU slows itself down.", lambda v: v.slowdown_margin_c),
    ("gpuvet_pcie_link_gen", "Current PCIe link generation.", _sample("pcie_gen")),
    ("gpuvet_pcie_link_width", "Current PCIe link width (lanes).", _sample("pcie_width")),
    ("gpuvet_nvlink_tx_bytes_per_second", "NVLink data sent, all active links (bytes/s).", lambda v: v.extras.nvlink_tx_bps),
    ("gpuvet_nvlink_rx_bytes_per_second", "NVLink data received, all active links (bytes/s).", lambda v: v.extras.nvlink_rx_bps),
)

_HOST_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("gpuvet_host_cpu_percent", "Host CPU busy, all CPUs (%).", "cpu_pct"),
    ("gpuvet_host_cpu_steal_percent", "CPU time the hypervisor gave to others (%).", "steal_pct"),
    ("gpuvet_host_cpu_iowait_percent", "CPU time waiting on storage (%).", "iowait_pct"),
    ("gpuvet_host_memory_used_bytes", "Host memory in use (total - available).", "mem_used_bytes"),
    ("gpuvet_host_memory_total_bytes", "Host memory.", "mem_total_bytes"),
    ("gpuvet_host_disk_read_bytes_per_second", "Disk reads, all disks.", "disk_read_bps"),
    ("gpuvet_host_disk_write_bytes_per_second", "Disk writes, all disks.", "disk_write_bps"),
    ("gpuvet_host_network_receive_bytes_per_second", "Network received, all interfaces but lo.", "net_rx_bps"),
    ("gpuvet_host_network_transmit_bytes_per_second", "Network sent, all interfaces but lo.", "net_tx_bps"),
    ("gpuvet_host_workers", "DataLoader-like worker processes busy on CPU.", "workers"),
    ("gpuvet_host_worker_cpu_percent", "Mean CPU of those workers (% of one core each).", "workers_cpu_pct"),
)

_JOB_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("gpuvet_job_processes", "Processes in the followed job's tree.", "processes"),
    ("gpuvet_job_cpu_percent", "CPU of the followed job's tree (% of one core).", "cpu_pct"),
    ("gpuvet_job_read_bytes_per_second", "Storage reads of the followed job.", "read_bps"),
    ("gpuvet_job_write_bytes_per_second", "Storage writes of the followed job.", "write_bps"),
)


def _gpu_labels(view: "GpuView", snap: "Snapshot") -> list[str]:
    return [str(view.index), view.uuid or "", view.bus_id or "", view.name or "", snap.hostname, snap.driver_version or ""]


def _gpu_families(snap: "Snapshot") -> Iterator[Metric]:
    for name, help_text, value_of in _DCGM_GAUGES + _GPUVET_GAUGES:
        family = GaugeMetricFamily(name, help_text, labels=GPU_LABELS)
        for view in snap.gpus:
            value = value_of(view)
            if value is not None:
                family.add_metric(_gpu_labels(view, snap), float(value))
        yield family
    reasons = GaugeMetricFamily("gpuvet_clock_event_reason", "Clock-event reason active now (1) or not (0).",
                                labels=GPU_LABELS + ("reason",))
    violations = CounterMetricFamily("gpuvet_clock_violation_seconds", "Time clocks were held by a policy since driver load.",
                                     labels=GPU_LABELS + ("policy",))
    diagnosis = GaugeMetricFamily("gpuvet_diagnosis", "The watch's diagnosis of the GPU: 1 for the current state.",
                                  labels=GPU_LABELS + ("state",))
    for view in snap.gpus:
        labels, s = _gpu_labels(view, snap), view.sample
        if s is not None and s.reasons is not None:
            for bit, reason in CLOCK_EVENT_REASONS.items():
                reasons.add_metric(labels + [reason], 1.0 if s.reasons & bit else 0.0)
        for policy, ns in (("power", s and s.violation_power_ns), ("thermal", s and s.violation_thermal_ns)):
            if ns is not None:
                violations.add_metric(labels + [policy], ns / 1e9)
        for state in GPU_STATES:
            diagnosis.add_metric(labels + [state], 1.0 if view.diagnosis.state == state else 0.0)
    yield from (reasons, violations, diagnosis)


def _host_families(snap: "Snapshot") -> Iterator[Metric]:
    up = GaugeMetricFamily("gpuvet_gpu_telemetry_up", "1 when GPUs are sampled; 0 with the reason when not.",
                           labels=("Hostname", "reason"))
    up.add_metric([snap.hostname, snap.gpu_error or ""], 1.0 if snap.gpus else 0.0)
    yield up
    ticks = CounterMetricFamily("gpuvet_watch_ticks", "Ticks of the watch loop.", labels=("Hostname",))
    ticks.add_metric([snap.hostname], snap.tick)
    yield ticks
    host = snap.host
    for name, help_text, attr in _HOST_GAUGES:
        family = GaugeMetricFamily(name, help_text, labels=("Hostname",))
        value = getattr(host, attr) if host is not None else None
        if value is not None:
            family.add_metric([snap.hostname], float(value))
        yield family


def _job_families(snap: "Snapshot") -> Iterator[Metric]:
    job = snap.job
    if job is None:
        return
    labels = [snap.hostname, str(job.pid)]
    for name, help_text, attr in _JOB_GAUGES:
        family = GaugeMetricFamily(name, help_text, labels=("Hostname", "pid"))
        value = getattr(job, attr)
        if value is not None:
            family.add_metric(labels, float(value))
        yield family
    if snap.job_diagnosis is not None:
        family = GaugeMetricFamily("gpuvet_job_diagnosis", "The followed job's diagnosis: 1 for the current state.",
                                   labels=("Hostname", "pid", "state"))
        for state in STATES:
            family.add_metric(labels + [state], 1.0 if snap.job_diagnosis.state == state else 0.0)
        yield family


def families(snap: "Snapshot") -> Iterator[Metric]:
    yield from _gpu_families(snap)
    yield from _host_families(snap)
    yield from _job_families(snap)


class _SnapshotCollector:
    """prometheus_client calls collect() on each scrape: build the families from the latest snapshot."""

    def __init__(self, exporter: "Exporter"):
        self.exporter = exporter

    def collect(self) -> Iterator[Metric]:
        snap = self.exporter.latest()
        if snap is not None:
            yield from families(snap)


class Exporter:
    """Holds the latest snapshot and serves it; `update()` is cheap (the work happens per scrape)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_SnapshotCollector(self))
        self._lock = threading.Lock()
        self._snapshot: Snapshot | None = None
        self._server: Any = None
        self.port: int | None = None

    def update(self, snap: "Snapshot") -> None:
        with self._lock:
            self._snapshot = snap

    def latest(self) -> "Snapshot | None":
        with self._lock:
            return self._snapshot

    def serve(self, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> int:
        """Listen on a daemon thread; returns the port (the one chosen when `port` is 0). OSError when
        the address cannot be bound (in use, not an address of this machine)."""
        self._server, _ = start_http_server(port, addr=host, registry=self.registry)
        self.port = self._server.server_port
        return self.port

    def text(self) -> bytes:
        """What /metrics would answer now."""
        return generate_latest(self.registry)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
