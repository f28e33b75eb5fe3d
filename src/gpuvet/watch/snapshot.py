"""What one tick of the watch shows: a Snapshot of the GPUs (each a GpuView: facts, latest sample,
once-a-second extras, diagnosis), the host and the followed job.

`Monitor` (monitor.py) builds them; the view, the log, --once --json and the exporter read them."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..facts import CLOCK_EVENT_REASONS, Gpu
from ..judge.diagnose import Diagnosis, HostSample
from ..samples import Sample


@dataclass
class ProcessView:
    """A process on a GPU: NVML's entry plus what this machine's process table says about it."""

    pid: int
    name: str | None = None
    user: str | None = None
    used_mib: int | None = None
    visible: bool = True  # False: NVML lists it but this machine (container) has no such process
    in_job: bool | None = None
    host_pid: int | None = None  # NVML's pid, where it differs from `pid` (mapped through NSpid in a container)


@dataclass
class GpuExtras:
    """The once-a-second readings of one GPU."""

    pcie_tx_kbs: int | None = None  # KB/s over NVML's 20 ms window
    pcie_rx_kbs: int | None = None
    nvlink_tx_bps: float | None = None  # all active links, bytes/s since the last reading
    nvlink_rx_bps: float | None = None
    processes: list[ProcessView] | None = None  # None: NVML cannot list them here
    unavailable: dict[str, str] = field(default_factory=dict)
    minor_number: int | None = None  # /dev/nvidiaN (dcgm-exporter's "device" label), read once
    # dcgm-exporter's default counters that NVML answers (DCGM's names and units in the exporter)
    pcie_replays: int | None = None  # PCIe replays since reset
    energy_mj: int | None = None  # total energy since the driver loaded, mJ
    memory_temp_c: float | None = None  # HBM temperature
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    row_remap_failure: bool | None = None
    last_xid: int | None = None  # the last Xid NVML reported while gpuvet watched (None: none seen)
    vgpu_license_status: int | None = None  # a vGPU guest's licence: 1 licensed, 0 not (None: not a vGPU)


@dataclass
class WorkerView:
    pid: int
    name: str
    cpu_pct: float


@dataclass
class HostReading(HostSample):
    """The host at one tick; the HostSample fields feed the diagnosis, the rest is for reading."""

    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    disk_read_bps: float | None = None
    disk_write_bps: float | None = None
    net_rx_bps: float | None = None
    net_tx_bps: float | None = None
    worker_list: list[WorkerView] = field(default_factory=list)


@dataclass
class JobReading:
    """The followed job (--pid): its process tree's CPU and storage IO, and the GPUs it holds."""

    pid: int
    alive: bool = True
    name: str | None = None
    cmdline: str | None = None
    processes: int = 0
    cpu_pct: float | None = None  # % of one core, the whole tree
    read_bps: float | None = None
    write_bps: float | None = None
    gpus: list[int] = field(default_factory=list)
    # In a container: GPUs whose processes NVML lists but this container cannot map (PID namespace),
    # which may be the job's when `gpus` is empty.
    maybe_gpus: list[int] = field(default_factory=list)


@dataclass
class GpuView:
    index: int
    facts: Gpu
    sample: Sample | None
    extras: GpuExtras
    diagnosis: Diagnosis

    @property
    def name(self) -> str | None:
        return self.facts.name

    @property
    def uuid(self) -> str | None:
        return self.facts.uuid

    @property
    def bus_id(self) -> str | None:
        return self.facts.pcie.bus_id

    @property
    def sm_ratio(self) -> float | None:
        top = self.facts.clocks.max_sm_mhz
        return self.sample.sm_mhz / top if self.sample and self.sample.sm_mhz is not None and top else None

    @property
    def power_ratio(self) -> float | None:
        s = self.sample
        return s.power_w / s.power_limit_w if s and s.power_w is not None and s.power_limit_w else None

    @property
    def slowdown_margin_c(self) -> float | None:
        slowdown = self.facts.thermal.slowdown_c
        return slowdown - self.sample.temp_c if self.sample and self.sample.temp_c is not None and slowdown else None

    @property
    def mig_instances(self) -> int | None:
        """MIG instances on this GPU, None when MIG is off or unknown (NVML then gives no utilization)."""
        return len(self.facts.mig_devices) if self.facts.mig_enabled else None

    @property
    def reasons(self) -> list[str] | None:
        mask = self.sample.reasons if self.sample else None
        if mask is None:
            return None
        return [CLOCK_EVENT_REASONS.get(1 << i, f"0x{1 << i:x}") for i in range(mask.bit_length()) if mask & (1 << i)]


@dataclass
class Snapshot:
    t: float
    tick: int
    hostname: str
    interval_s: float
    gpus: list[GpuView]
    gpu_error: str | None  # why the GPU part is empty (or incomplete)
    host: HostReading | None
    job: JobReading | None = None
    job_diagnosis: Diagnosis | None = None
    driver_version: str | None = None
    source: str = "live"  # the facts' source: "replay: FILE" under GPUVET_NVML_REPLAY
