"""`gpuvet watch --prometheus [HOST:]PORT`: the watch's readings and diagnoses on /metrics.

GPU gauges carry the names and labels of NVIDIA's dcgm-exporter (its default-counters.csv and the
DCGM field names of dcgm_fields.h: DCGM_FI_DEV_GPU_UTIL, DCGM_FI_DEV_SM_CLOCK, DCGM_FI_DEV_POWER_MGMT_LIMIT,
DCGM_FI_DEV_PCIE_LINK_GEN, DCGM_FI_DEV_CLOCKS_EVENT_REASONS, ... with labels gpu, UUID, pci_bus_id,
device ("nvidia" + the minor number), modelName, Hostname, DCGM_FI_DRIVER_VERSION) so existing Grafana
dashboards and alerts work unchanged; what DCGM has no field for is named gpuvet_*: the SM clock as a
share of its maximum, the margin to the slowdown temperature, each clock-event reason on its own,
the host (CPU, steal, IO wait, workers), the followed job, and the diagnosis as a state set:
gpuvet_diagnosis{gpu="0",state="power_capped"} 1, the other states 0.

DCGM declares a few fields counters (PCIe throughput, NVLink bandwidth, violation times); they are
served here as gauges under the same names: prometheus_client appends "_total" to a counter's name,
which would break the dashboards the names are for, and PromQL's rate() reads a gauge the same way.

The metrics are built from the watch's latest snapshot when Prometheus scrapes, so a GPU or a
state that goes away leaves no stale series behind. Default bind: 127.0.0.1 (the numbers say
what runs on the machine; exposing them is the user's choice: 0.0.0.0:9400, or 0.0.0.0 alone).
"""

from __future__ import annotations

import socket
import threading
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any, Callable, Iterator
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import CollectorRegistry, generate_latest, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..facts import CLOCK_EVENT_REASONS
from ..judge.diagnose import GPU_STATES, STATES

if TYPE_CHECKING:
    from .snapshot import GpuView, Snapshot

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 9400  # dcgm-exporter's port: run one or the other on a node
GPU_LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION")


def parse_listen(spec: str) -> tuple[str, int]:
    """"9400" -> ("127.0.0.1", 9400); "0.0.0.0:9400"; "[::1]:9400"; a host alone ("0.0.0.0",
    "localhost", "[::]") listens on DEFAULT_PORT. ValueError says what is wrong."""
    spec = (spec or "").strip()
    if spec.startswith("[") and spec.endswith("]"):
        return spec[1:-1], DEFAULT_PORT
    host, _, port_text = spec.rpartition(":") if ":" in spec else ("", "", spec)
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError("write an IPv6 address in brackets, e.g. [::1]:9400")
    if not host and not port_text.isdigit() and _looks_like_host(port_text):
        return port_text, DEFAULT_PORT
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError("expected [HOST:]PORT with PORT a number from 0 to 65535, e.g. 9400 or 0.0.0.0:9400")
    return host or DEFAULT_HOST, int(port_text)


def _looks_like_host(text: str) -> bool:
    """An IPv4 address or a host name (with a dot or "localhost"): not a mistyped port like "http"."""
    return text == "localhost" or ("." in text and all(part and (part.isalnum() or "-" in part) for part in text.split(".")))


# -- building the families ---------------------------------------------------------------------------

# (metric name, help, value of a GpuView): dcgm-exporter's names and units where DCGM has the field.
def _sample(field: str) -> Callable[["GpuView"], Any]:
    return lambda view: getattr(view.sample, field) if view.sample is not None else None


def _fb_free(view: "GpuView") -> float | None:
    total, used = view.facts.memory_total_mib, view.sample.mem_used_mib if view.sample else None
    return total - used if total is not None and used is not None else None


def _facts_power(field: str) -> Callable[["GpuView"], Any]:
    return lambda view: getattr(view.facts.power, field)


def _nvlink_total(view: "GpuView") -> float | None:
    """As DCGM computes DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL from NVML's KiB counters: TX + RX, KiB/s / 1000."""
    tx, rx = view.extras.nvlink_tx_bps, view.extras.nvlink_rx_bps
    return (tx + rx) / 1024 / 1000 if tx is not None and rx is not None else None


def _extra(field: str) -> Callable[["GpuView"], Any]:
    return lambda view: getattr(view.extras, field)


# Names and units as DCGM's fields (dcgm_fields.h; help texts as dcgm-exporter's default-counters.csv).
_DCGM_GAUGES: tuple[tuple[str, str, Callable[["GpuView"], Any]], ...] = (
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", _sample("util_pct")),
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", _sample("sm_mhz")),
    ("DCGM_FI_DEV_MAX_SM_CLOCK", "Maximum supported SM clock (in MHz).", lambda v: v.facts.clocks.max_sm_mhz),
    ("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", _sample("mem_mhz")),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", _sample("power_w")),
    ("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "Power limit the driver enforces after all limiters (in W).", _sample("power_limit_w")),
    ("DCGM_FI_DEV_POWER_MGMT_LIMIT", "Power management limit (in W), as read when the watch started.", _facts_power("limit_w")),
    ("DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF", "Default power management limit (in W).", _facts_power("default_limit_w")),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", _sample("temp_c")),
    ("DCGM_FI_DEV_SLOWDOWN_TEMP", "GPU slowdown temperature (in C).", lambda v: v.facts.thermal.slowdown_c),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", _sample("mem_used_mib")),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", _fb_free),
    ("DCGM_FI_DEV_PCIE_LINK_GEN", "PCIe current link generation.", _sample("pcie_gen")),
    ("DCGM_FI_DEV_PCIE_LINK_WIDTH", "PCIe current link width (lanes).", _sample("pcie_width")),
    # NVML's PCIe throughput is a rate (KB/s over 20 ms); the values dcgm-exporter serves are that rate.
    ("DCGM_FI_DEV_PCIE_TX_THROUGHPUT", "PCIe TX throughput (in KB/s) via NVML.", lambda v: v.extras.pcie_tx_kbs),
    ("DCGM_FI_DEV_PCIE_RX_THROUGHPUT", "PCIe RX throughput (in KB/s) via NVML.", lambda v: v.extras.pcie_rx_kbs),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "NVLink throughput, TX + RX of all active links (KiB/s / 1000, as DCGM).",
     _nvlink_total),
    # Nanoseconds, as DCGM serves them (dcgm_fields.h; dcgm-exporter's help said "us" until its PR #589).
    ("DCGM_FI_DEV_POWER_VIOLATION", "Throttling duration due to power constraints (in ns), since driver load.",
     _sample("violation_power_ns")),
    ("DCGM_FI_DEV_THERMAL_VIOLATION", "Throttling duration due to thermal constraints (in ns), since driver load.",
     _sample("violation_thermal_ns")),
    ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "Clock-event reasons, NVML bitmask.", _sample("reasons")),
    ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "Clock-event reasons, NVML bitmask (the name before DCGM 3.3).", _sample("reasons")),
) + tuple((name, help_text, _extra(field)) for name, help_text, field in (
    # dcgm-exporter's default counters that NVML answers: (DCGM field, its help text, the GpuExtras field)
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "Total number of PCIe retries.", "pcie_replays"),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "Total energy consumption since boot (in mJ).", "energy_mj"),
    ("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C).", "memory_temp_c"),
    ("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", "last_xid"),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "Number of remapped rows for correctable errors", "remapped_rows_correctable"),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "Number of remapped rows for uncorrectable errors",
     "remapped_rows_uncorrectable"),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "Whether remapping of rows has failed", "row_remap_failure"),
    # 1 licensed, 0 not (dcgm_fields.h); served on a vGPU guest's GPU only, as NVML has no licence elsewhere
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "vGPU License status", "vgpu_license_status"),
))

_GPUVET_GAUGES: tuple[tuple[str, str, Callable[["GpuView"], Any]], ...] = (
    ("gpuvet_sm_clock_ratio", "SM clock as a share of its maximum (0..1).", lambda v: v.sm_ratio),
    ("gpuvet_temp_slowdown_margin_celsius", "Degrees left before the GPU slows itself down.", lambda v: v.slowdown_margin_c),
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
    minor = view.extras.minor_number if view.extras.minor_number is not None else view.index
    return [str(view.index), view.uuid or "", view.bus_id or "", f"nvidia{minor}", view.name or "", snap.hostname,
            snap.driver_version or ""]


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
    diagnosis = GaugeMetricFamily("gpuvet_diagnosis", "The watch's diagnosis of the GPU: 1 for the current state.",
                                  labels=GPU_LABELS + ("state",))
    for view in snap.gpus:
        labels, s = _gpu_labels(view, snap), view.sample
        if s is not None and s.reasons is not None:
            for bit, reason in CLOCK_EVENT_REASONS.items():
                reasons.add_metric(labels + [reason], 1.0 if s.reasons & bit else 0.0)
        for state in GPU_STATES:
            diagnosis.add_metric(labels + [state], 1.0 if view.diagnosis.state == state else 0.0)
    yield from (reasons, diagnosis)


def _host_families(snap: "Snapshot") -> Iterator[Metric]:
    up = GaugeMetricFamily("gpuvet_gpu_telemetry_up", "1 when every GPU is sampled; 0 with the reason when none is, "
                           "or when one was lost (fell off the bus: its gpuvet_diagnosis state is \"lost\").",
                           labels=("Hostname", "reason"))
    lost = [f"GPU {v.index} lost ({v.diagnosis.evidence.get('nvml_error') or 'NVML cannot read it'})"
            for v in snap.gpus if v.diagnosis.state == "lost"]
    reason = "; ".join(lost + ([snap.gpu_error] if snap.gpu_error else []))
    up.add_metric([snap.hostname, reason], 1.0 if snap.gpus and not lost else 0.0)
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
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        server_class = type("_Server", (_BoundedServer,), {"address_family": family})
        self._server = server_class((host, port), _QuietHandler)
        self._server.set_app(make_wsgi_app(self.registry))
        threading.Thread(target=self._server.serve_forever, name="gpuvet-exporter", daemon=True).start()
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


# prometheus_client's own server starts a thread per connection and never times one out: 1,000
# connections that send nothing held 1,004 threads and doubled its memory. Here a connection gets
# IDLE_SECONDS to send its request, and at most MAX_CONNECTIONS are served at once (a scrape takes
# milliseconds; Prometheus opens one at a time); one more is closed at once.
IDLE_SECONDS = 10.0
MAX_CONNECTIONS = 32


class _QuietHandler(WSGIRequestHandler):
    timeout = IDLE_SECONDS  # StreamRequestHandler sets it on the connection

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        """No line on stderr per scrape (the watch's own screen is there)."""


class _BoundedServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, *args: Any, **kwargs: Any):
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)  # over the bound: closed, no thread
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that timed out or hung up: its connection is closed, nothing printed."""
