"""What gpuvet knows about a machine: one model filled by every backend.

Live NVML, `nvidia-smi -q -x`, `nvidia-smi -q`, sysfs, `lspci -vv` and `nvidia-smi topo -m` all
produce these same objects, so the judge never knows (or cares) where a fact came from.

A value of ``None`` means "not known". Where the backend could say why (the driver answered
NotSupported on a vGPU guest, nvidia-smi printed "[N/A]", the section was not in the capture),
the reason is kept in the object's ``unavailable`` map under the field's dotted path.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from dataclasses import dataclass, field

# Clock-event reason names, in NVML bit order (old "throttle" and new "event" names map here).
CLOCK_EVENT_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


# Gpu.remap_histogram's keys: memory banks by how many spare rows they have left.
REMAP_LEVELS = ("max", "high", "partial", "low", "none")


def reasons_from_mask(mask: int) -> list[str]:
    """Active clock-event reason names from an NVML bitmask."""
    return [name for bit, name in CLOCK_EVENT_REASONS.items() if mask & bit]


@dataclass
class Power:
    draw_w: float | None = None
    limit_w: float | None = None  # the management limit someone set (nvidia-smi -pl)
    enforced_limit_w: float | None = None  # after every limiter: what the GPU obeys
    default_limit_w: float | None = None
    min_limit_w: float | None = None
    max_limit_w: float | None = None


@dataclass
class PcieLink:
    """One reading of a PCIe link: generation (1..6) and width (lanes)."""

    current_gen: int | None = None
    max_gen: int | None = None
    current_width: int | None = None
    max_width: int | None = None
    source: str = ""  # "nvml", "nvidia-smi", "sysfs", "lspci"
    under_load: bool | None = None  # True: read while a load ran; None: unknown


DRIVER_SOURCES = ("nvml", "nvidia-smi")  # PcieLink.source of a reading the NVIDIA driver made (not lspci, sysfs)


@dataclass
class Pcie:
    bus_id: str | None = None  # normalised "0000:01:00.0"
    # NVML/nvidia-smi first, sysfs or lspci (the host's view, LnkSta/LnkCap) after;
    # benchmarks append readings taken under load.
    readings: list[PcieLink] = field(default_factory=list)
    device_max_gen: int | None = None  # what the GPU itself supports
    host_max_gen: int | None = None  # what the slot/root port supports
    replay_count: int | None = None  # PCIe replays since the GPU's last reset (NVML, 'Replays Since Reset')
    # The host's AER counters for this device (sysfs aer_dev_correctable/nonfatal/fatal TOTAL_ERR_*):
    # {"correctable": n, "nonfatal": n, "fatal": n}; None: not read (a capture, or no AER in sysfs).
    aer_counts: dict[str, int] | None = None
    kernel_driver: str | None = None  # nvidia, vfio-pci, nouveau ... (None: unknown)


@dataclass
class Clocks:
    sm_mhz: int | None = None
    graphics_mhz: int | None = None
    memory_mhz: int | None = None
    max_sm_mhz: int | None = None
    max_graphics_mhz: int | None = None
    max_memory_mhz: int | None = None
    applications_graphics_mhz: int | None = None
    default_applications_graphics_mhz: int | None = None
    event_reasons: list[str] | None = None  # active reasons (CLOCK_EVENT_REASONS names)


@dataclass
class Thermal:
    gpu_c: float | None = None
    memory_c: float | None = None
    slowdown_c: float | None = None
    shutdown_c: float | None = None
    max_operating_c: float | None = None
    # Degrees left before the GPU slows itself down. Newer drivers on some GPUs report only
    # T.Limit-relative values; the backend computes the margin from whichever it has.
    slowdown_margin_c: float | None = None
    # Each fan's speed in % of its maximum (NVML nvmlDeviceGetFanSpeed_v2, nvidia-smi 'Fan Speed'); an
    # item None: that fan's reading failed (nvidia-smi's ERR!). None: no fan reported (passively
    # cooled), or not read; unavailable["thermal.fan_pct"] says which.
    fan_pct: list[int | None] | None = None


@dataclass
class Ecc:
    enabled: bool | None = None  # None: not supported or unknown
    pending_enabled: bool | None = None
    volatile_corrected: int | None = None
    volatile_uncorrected: int | None = None
    aggregate_corrected: int | None = None
    aggregate_uncorrected: int | None = None
    retired_pages_sbe: int | None = None
    retired_pages_dbe: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None


@dataclass
class MigDevice:
    index: int | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    sm_count: int | None = None
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None
    uuid: str | None = None


@dataclass
class GpuProcess:
    pid: int | None = None
    name: str | None = None
    type: str | None = None  # "C" compute, "G" graphics, "C+G"
    used_memory_mib: int | None = None


@dataclass
class NvLink:
    link: int
    active: bool
    speed_gbs: float | None = None  # per direction, as nvidia-smi nvlink -s prints it
    version: int | None = None
    remote_bus_id: str | None = None
    remote_type: str | None = None  # "gpu", "switch" (NVSwitch), "ibmnpu"


@dataclass
class Fabric:
    """NVSwitch systems (HGX/DGX): the GPU's registration with the fabric manager (NVML
    GpuFabricInfo, the `Fabric` section of `nvidia-smi -q`). None on GPUs without a fabric."""

    state: str | None = None  # "Not Started", "In Progress", "Completed" (nvidia-smi's words)
    status: str | None = None  # "Success" or the error the registration ended with
    health: str | None = None  # newer drivers: "Healthy", "Unhealthy", ...


@dataclass
class Gpu:
    index: int
    name: str | None = None
    uuid: str | None = None
    serial: str | None = None
    brand: str | None = None
    architecture: str | None = None
    vbios: str | None = None
    compute_capability: str | None = None  # "8.6"
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None
    memory_reserved_mib: int | None = None
    persistence_mode: bool | None = None
    compute_mode: str | None = None  # Default, Exclusive_Process, Prohibited
    pstate: int | None = None  # 0..15
    driver_model: str | None = None  # Windows: WDDM/TCC
    utilization_pct: int | None = None
    virtualization_mode: str | None = None  # none, passthrough, vgpu, host_vgpu, host_vsga
    mig_enabled: bool | None = None
    mig_pending: bool | None = None
    mig_devices: list[MigDevice] = field(default_factory=list)
    processes: list[GpuProcess] | None = None  # None: could not be read
    power: Power = field(default_factory=Power)
    pcie: Pcie = field(default_factory=Pcie)
    clocks: Clocks = field(default_factory=Clocks)
    thermal: Thermal = field(default_factory=Thermal)
    ecc: Ecc = field(default_factory=Ecc)
    nvlinks: list[NvLink] | None = None  # None: not read; []: no link active
    # NVLink error counters summed over the links: {"replay": n, "recovery": n, "crc": n}
    # (NVML field values, `nvidia-smi nvlink -e`; Blackwell's counters by their own names); None: not read.
    nvlink_errors: dict[str, int] | None = None
    # The links whose error counters are not 0: link number -> counter -> count ({} when all are 0).
    nvlink_error_links: dict[str, dict[str, int]] | None = None
    fabric: Fabric | None = None  # None: not an NVSwitch system, or not read
    recovery_action: str | None = None  # 'GPU Recovery Action': "None", "GPU Reset", "Drain and Reset" ...
    # Time spent under each clock-event reason since the driver loaded, in microseconds
    # ('Clocks Event Reasons Counters'; NVML's violation counters): reason name -> us.
    clock_event_time_us: dict[str, float] | None = None
    # 'Bank Remap Availability Histogram': banks with Max/High/Partial/Low/None spare rows left.
    remap_histogram: dict[str, int] | None = None
    reference: str | None = None  # id of the matched reference-spec row
    unavailable: dict[str, str] = field(default_factory=dict)  # dotted field -> why


# Gpu.unavailable key for memory-health fields nvidia-smi printed as "Unknown Error": a read that
# failed (a GPU in trouble), which gpu.ecc fails rather than reading as "no errors".
ECC_READ_FAILED = "ecc_read"


@dataclass
class Topology:
    """`nvidia-smi topo -m`: how each pair of devices connects (X, NV#, PIX, PXB, PHB, NODE, SYS)."""

    devices: list[str] = field(default_factory=list)  # column order: GPU0.., NIC0.. / mlx5_0..
    links: dict[str, dict[str, str]] = field(default_factory=dict)
    cpu_affinity: dict[str, str] = field(default_factory=dict)
    numa_affinity: dict[str, str] = field(default_factory=dict)
    nic_names: dict[str, str] = field(default_factory=dict)  # NIC0 -> mlx5_0
    shows_nvlink: bool = True  # False for `topo -mp`, which hides NVLink
    source: str = ""

    @property
    def gpus(self) -> list[str]:
        return [d for d in self.devices if d.startswith("GPU")]


@dataclass
class Driver:
    version: str | None = None
    cuda_version: str | None = None  # highest CUDA the driver supports, "12.4"
    nvml_version: str | None = None
    kernel_module_version: str | None = None  # /proc/driver/nvidia/version
    # NVSwitch systems: the fabric manager service (live only; None: not read or no NVSwitch).
    fabric_manager_state: str | None = None  # systemctl is-active: "active", "inactive", "failed", "not installed"
    fabric_manager_version: str | None = None  # nv-fabricmanager --version


@dataclass
class Storage:
    path: str | None = None
    mount_point: str | None = None
    fs_type: str | None = None
    device: str | None = None
    kind: str | None = None  # nvme, ssd, hdd, network, overlay, tmpfs, unknown
    model: str | None = None
    ephemeral: bool | None = None  # True where the platform marks the disk as instance storage
    ephemeral_reason: str | None = None
    total_bytes: int | None = None
    free_bytes: int | None = None


@dataclass
class Nic:
    name: str
    speed_mbps: int | None = None  # /sys/class/net/<nic>/speed; None when down or virtual
    operstate: str | None = None  # up, down, unknown
    mtu: int | None = None
    driver: str | None = None
    virtual: bool = False  # loopback, bridges, veth, docker0 ...


@dataclass
class RdmaPort:
    device: str  # mlx5_0
    port: int
    state: str | None = None  # ACTIVE, DOWN ...
    phys_state: str | None = None  # LinkUp, Disabled ...
    rate_gbps: float | None = None
    link_layer: str | None = None  # InfiniBand, Ethernet (RoCE)


@dataclass
class Host:
    hostname: str | None = None
    os: str | None = None
    kernel: str | None = None
    cpu_model: str | None = None
    cpu_physical_cores: int | None = None
    cpu_logical_cores: int | None = None
    cpu_usable_cores: int | None = None  # what this process may run on (affinity, cgroup quota)
    cpu_mhz: float | None = None
    cpu_max_mhz: float | None = None
    memory_total_bytes: int | None = None
    memory_available_bytes: int | None = None
    numa_nodes: int | None = None
    shm_total_bytes: int | None = None
    shm_free_bytes: int | None = None
    dmi: dict[str, str] = field(default_factory=dict)
    cloud: str | None = None
    hypervisor: str | None = None  # kvm, xen, microsoft, vmware, ... None: bare metal or unknown
    container: str | None = None  # docker, podman, kubernetes, ... None: not in a container
    # Spot / preemptible, as the cloud's instance metadata says (None: not asked or no answer).
    preemptible: bool | None = None
    lifecycle: str | None = None  # the platform's own word: "spot", "on-demand", "SPOT", "Regular", ...
    lifecycle_source: str | None = None  # the metadata path it came from
    steal_pct: float | None = None  # over steal_window_s
    steal_window_s: float | None = None
    steal_since_boot_pct: float | None = None
    somaxconn: int | None = None
    uptime_s: float | None = None  # /proc/uptime: turns counters since boot into rates
    workdir: Storage | None = None
    nics: list[Nic] | None = None  # None: not read
    rdma: list[RdmaPort] | None = None  # None: not read; []: no RDMA device
    unavailable: dict[str, str] = field(default_factory=dict)


@dataclass
class Torch:
    installed: bool = False
    version: str | None = None
    cuda: str | None = None  # torch.version.cuda: the runtime the wheel was built with
    hip: str | None = None
    cuda_available: bool | None = None
    device_count: int | None = None
    arch_list: list[str] | None = None  # torch.cuda.get_arch_list(); None: not read
    nccl: str | None = None  # torch.cuda.nccl.version(): the NCCL PyTorch carries ("2.21.5")
    error: str | None = None


@dataclass
class ContainerRuntime:
    """What a CUDA program needs from a container, or a host needs to give one GPUs."""

    dev_nodes: list[str] = field(default_factory=list)  # /dev/nvidia0.., nvidiactl, nvidia-uvm
    libcuda: str | None = None  # the driver library's real file (libcuda.so.535.183.01)
    libcuda_version: str | None = None  # from its name; must equal the kernel module's version
    docker: bool = False  # a docker CLI on this host
    nvidia_runtime: bool | None = None  # docker's daemon.json names the nvidia runtime / the toolkit is installed
    cdi_specs: list[str] = field(default_factory=list)  # /etc/cdi, /var/run/cdi NVIDIA specs


@dataclass
class Stack:
    python: str | None = None
    torch: Torch = field(default_factory=Torch)
    nvcc_version: str | None = None
    cuda_home: str | None = None  # /usr/local/cuda
    cuda_home_target: str | None = None  # where /usr/local/cuda points
    # The toolkit /usr/local/cuda holds: version.json's "cuda" entry (CUDA 11.1+) or version.txt.
    cuda_home_version: str | None = None
    cuda_module_loading: str | None = None  # env CUDA_MODULE_LOADING
    peermem_loaded: bool | None = None  # nvidia_peermem in /proc/modules (GPUDirect RDMA); None: not read
    container: ContainerRuntime | None = None
    unavailable: dict[str, str] = field(default_factory=dict)


@dataclass
class Listener:
    """A TCP server listening on this machine, and whether strangers could use it."""

    address: str
    port: int
    pid: int | None = None
    process: str | None = None
    all_interfaces: bool = False  # bound to 0.0.0.0 / :: rather than loopback
    kind: str | None = None  # jupyter, ssh, tensorboard, ... when recognised
    protected: bool | None = None  # token/password known to be set (True) or known absent (False)
    note: str | None = None


@dataclass
class Audit:
    """Configuration that slows, breaks or exposes work on this machine (read-only advice)."""

    ssh_client: dict[str, str] = field(default_factory=dict)  # ~/.ssh/config options for Host *
    sshd: dict[str, str] = field(default_factory=dict)  # effective sshd_config options we care about
    authorized_keys: list[dict[str, str]] = field(default_factory=list)  # {"type", "comment", "options", "restricted"}
    listeners: list[Listener] = field(default_factory=list)
    jupyter: dict[str, str] = field(default_factory=dict)  # config options found, and their file
    environment: dict[str, str] = field(default_factory=dict)  # CUDA_MODULE_LOADING, ...
    unavailable: dict[str, str] = field(default_factory=dict)


class _CaptureEntryBase(typing.TypedDict):
    path: str
    kind: str  # "smi_xml", "topo", "error", ...


class CaptureEntry(_CaptureEntryBase, total=False):
    """A capture a record was made from (gpuvet inspect)."""

    note: str  # why it could not be read, for kind "error"
    attached: int  # GPUs on the machine by the report's header (more than it lists with `-i N`)
    # When the capture was taken by its own timestamp (nvidia-smi's "Timestamp", the capturing
    # machine's local time, zone unknown): a report is dated when it was inspected, and a
    # provider's capture may be months older than that.
    taken_at: str


@dataclass
class KernelEvent:
    """One NVIDIA-related event in the kernel log: an Xid, an NVSwitch SXid, a GPU that fell off
    the bus, a driver that could not start a GPU (RmInitAdapter), or a PCIe AER report."""

    kind: str  # "xid", "sxid", "fallen_off_bus", "init_failed", "reset_required", "aer"
    bus_id: str | None = None  # normalised "0000:01:00.0"; None when the line names no device
    code: int | None = None  # the Xid or SXid number
    severity: str | None = None  # what the line itself says: "fatal", "nonfatal", "corrected", "uncorrected"
    process: str | None = None  # Xid lines name the process whose channel hit it (name=...)
    when: str | None = None  # the time as the log printed it ("[74889.644138]", "Feb 09 15:47:06")
    uptime_s: float | None = None  # seconds since boot, when the log gives them
    line: str = ""  # the message, as logged (one line)
    # The time as ISO 8601, when it is known: from the line's own date (with its zone when the line
    # gives one), or, read live, seconds since boot plus the boot time. None: seconds since boot only.
    at: str | None = None
    line_number: int | None = None  # 1-based, in the text read: what an undated line is cited by


@dataclass
class KernelLog:
    """What the kernel log says about the NVIDIA driver since boot (or since the log begins)."""

    source: str | None = None  # "/dev/kmsg", "journalctl -k", "dmesg", or the capture's path
    read: bool = False
    why_unread: str | None = None  # every way tried and why each failed (dmesg_restrict, no host log ...)
    lines: int = 0
    first: str | None = None  # the time of its first and last lines, as printed
    last: str | None = None
    since_boot: bool | None = None  # True: it starts at boot (the ring buffer was not wrapped)
    events: list[KernelEvent] = field(default_factory=list)
    gpu_buses: list[str] = field(default_factory=list)  # buses the driver named as NVIDIA GPUs
    # The instant events' ages are counted from (ISO 8601): when it was read live, else the time of
    # the log's last dated line (a capture's "now"); None: no line carries a date.
    now: str | None = None
    now_is: str | None = None  # "read" (live) or "last line" (a capture)


@dataclass
class Machine:
    source: str = "live"  # "live" or "capture"
    driver: Driver = field(default_factory=Driver)
    gpus: list[Gpu] = field(default_factory=list)
    gpu_error: str | None = None  # why there are no GPU facts (no driver, NVML failed, ...)
    topology: Topology | None = None
    host: Host | None = None  # None: not captured
    stack: Stack | None = None  # None: not captured
    audit: Audit | None = None  # None: not captured
    kernel_log: KernelLog | None = None  # None: not read (not asked, or not among the captures)
    # Xids NVML reported while gpuvet's benchmarks ran, each line naming the benchmark it hit.
    nvml_xid_events: list[KernelEvent] = field(default_factory=list)
    captures: list[CaptureEntry] = field(default_factory=list)
    probe_errors: dict[str, str] = field(default_factory=dict)  # probe -> error, when one broke


# -- dict <-> dataclass ----------------------------------------------------------------------

def to_dict(obj: typing.Any) -> typing.Any:
    return dataclasses.asdict(obj) if dataclasses.is_dataclass(obj) and not isinstance(obj, type) else obj


# Resolving a class's annotations is most of the work of rebuilding it (a cluster of 1,000 nodes
# rebuilds every GPU): once per class.
_type_hints = functools.cache(typing.get_type_hints)


def from_dict(cls: type, data: typing.Any) -> typing.Any:
    """Build dataclass `cls` from a dict, ignoring unknown keys (records from newer versions)."""
    if data is None:
        return None
    hints = _type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name in data:
            kwargs[f.name] = _convert(hints[f.name], data[f.name])
    return cls(**kwargs)


def _convert(hint: typing.Any, value: typing.Any) -> typing.Any:
    if value is None:
        return None
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        return _convert(inner[0], value) if len(inner) == 1 else value
    if origin is list:
        (item,) = typing.get_args(hint)
        return [_convert(item, v) for v in value]
    if origin is dict:
        _, item = typing.get_args(hint)
        return {k: _convert(item, v) for k, v in value.items()}
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return from_dict(hint, value)
    return value
