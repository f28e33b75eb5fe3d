"""Host facts: CPU, memory, /dev/shm, cloud and hypervisor, container, CPU steal, work directory.

Everything is read from procfs/sysfs and psutil, without root and without running commands.
`collect_host` never raises: a read that fails leaves its field None and says why in
`host.unavailable`. The classifiers (cloud, hypervisor, container, steal, storage kind) are pure
functions so they can be tested on documented inputs.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import re
import shutil
import socket
import sys
import time
from collections.abc import Collection, Iterator, Mapping
from pathlib import PurePosixPath
from types import ModuleType
from typing import NamedTuple

from gpuvet.facts import Host, Storage

PROC_STAT = "/proc/stat"
PROC_CPUINFO = "/proc/cpuinfo"
PROC_MOUNTINFO = "/proc/self/mountinfo"
SOMAXCONN = "/proc/sys/net/core/somaxconn"
PROC_UPTIME = "/proc/uptime"
DMI_DIR = "/sys/class/dmi/id"
SYS_HYPERVISOR_TYPE = "/sys/hypervisor/type"
CLOCKSOURCES = "/sys/devices/system/clocksource/clocksource0/available_clocksource"
NUMA_DIR = "/sys/devices/system/node"
PROC_SELF_CGROUP = "/proc/self/cgroup"
CGROUP_ROOT = "/sys/fs/cgroup"

# World-readable (0444) DMI files; serials and UUIDs are root-only and not read.
DMI_FIELDS = (
    "sys_vendor", "product_name", "product_version", "bios_vendor", "bios_version",
    "board_vendor", "board_name", "chassis_vendor", "chassis_asset_tag",
)


# -- failure isolation -----------------------------------------------------------------------

def _why(error: BaseException) -> str:
    """A short reason for `host.unavailable`."""
    if isinstance(error, FileNotFoundError):
        hint = "" if sys.platform.startswith("linux") else " (not Linux)"
        return f"no {error.filename}{hint}"
    if isinstance(error, PermissionError):
        return f"permission denied: {error.filename}"
    return f"{type(error).__name__}: {error}"


@contextlib.contextmanager
def _isolated(unavailable: dict[str, str], field: str) -> Iterator[None]:
    """Run one sub-read; if it fails, record why under `field` and carry on."""
    try:
        yield
    except Exception as error:  # a probe must never stop the run
        unavailable[field] = _why(error)


def _psutil() -> ModuleType:
    """psutil, imported where a fact needs it: without it (a broken install) those facts are
    "not available" with the reason, and judging a capture never needs it at all."""
    try:
        import psutil
    except ImportError as err:
        raise RuntimeError(f"psutil is not installed ({err}): `pip install psutil`") from None
    return psutil


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


# -- CPU --------------------------------------------------------------------------------------

# ARM cores seen in GPU servers (Grace is Neoverse-V2); MIDR part numbers as in Linux cputype.h.
_ARM_PARTS = {"0xd0c": "Neoverse-N1", "0xd40": "Neoverse-V1", "0xd49": "Neoverse-N2",
              "0xd4f": "Neoverse-V2"}


def _cpuinfo_first_block(text: str) -> dict[str, str]:
    """Keys of the first processor in /proc/cpuinfo (all processors are the same model)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() not in fields:
            fields[key.strip()] = value.strip()
    return fields


def cpu_model_from_cpuinfo(text: str) -> str | None:
    """x86 "model name"; POWER "cpu"; ARM has no model string, so name it from its part number."""
    fields = _cpuinfo_first_block(text)
    for key in ("model name", "cpu model", "cpu"):
        if fields.get(key):
            return fields[key]
    implementer, part = fields.get("CPU implementer"), fields.get("CPU part")
    if implementer and part:
        if implementer.lower() == "0x41" and part.lower() in _ARM_PARTS:
            return f"ARM {_ARM_PARTS[part.lower()]}"
        return f"ARM implementer {implementer} part {part}"
    return None


def cpu_flags_from_cpuinfo(text: str) -> set[str]:
    return set(_cpuinfo_first_block(text).get("flags", "").split())


def parse_cpu_max(text: str) -> float | None:
    """cgroup v2 cpu.max "<quota> <period>" -> CPUs allowed; "max ..." -> None (no limit)."""
    quota, period = text.split()[:2]
    return None if quota == "max" else int(quota) / int(period)


def parse_cfs_quota(quota_text: str, period_text: str) -> float | None:
    """cgroup v1 cpu.cfs_quota_us / cpu.cfs_period_us -> CPUs allowed; quota -1 -> None."""
    quota = int(quota_text)
    return None if quota < 0 else quota / int(period_text)


def usable_cores(affinity_count: int, quota_cpus: float | None) -> int:
    """Cores this process can keep busy: its affinity set, cut down by a cgroup CPU quota."""
    if quota_cpus is None:
        return affinity_count
    return min(affinity_count, max(1, math.ceil(quota_cpus)))


def _self_and_ancestors(base: str, cgroup_path: str) -> list[str]:
    # Inside a container the cgroup mount shows the container's own cgroup as its root while
    # /proc/self/cgroup may still name the host path, so try every level up to the mount root.
    path = PurePosixPath("/", cgroup_path.lstrip("/"))
    return [base + str(p).rstrip("/") for p in (path, *path.parents)]


def cgroup_cpu_quota() -> float | None:
    """The tightest CPU quota on this process's cgroup or its ancestors (v2 and v1)."""
    limits = []
    for line in _read(PROC_SELF_CGROUP).splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            for directory in _self_and_ancestors(CGROUP_ROOT, path):
                with contextlib.suppress(FileNotFoundError):
                    limits.append(parse_cpu_max(_read(f"{directory}/cpu.max")))
        elif "cpu" in controllers.split(","):
            for base in (f"{CGROUP_ROOT}/cpu,cpuacct", f"{CGROUP_ROOT}/cpu"):
                for directory in _self_and_ancestors(base, path):
                    with contextlib.suppress(FileNotFoundError):
                        limits.append(parse_cfs_quota(_read(f"{directory}/cpu.cfs_quota_us"),
                                                      _read(f"{directory}/cpu.cfs_period_us")))
    known = [limit for limit in limits if limit is not None]
    return min(known) if known else None


# -- CPU steal (/proc/stat) -------------------------------------------------------------------

_STEAL = 7  # cpu  user nice system idle iowait irq softirq steal guest guest_nice


def parse_cpu_times(proc_stat_text: str) -> tuple[int, ...]:
    """The aggregate "cpu" line of /proc/stat, in USER_HZ ticks since boot."""
    for line in proc_stat_text.splitlines():
        if line.startswith("cpu "):
            return tuple(int(value) for value in line.split()[1:])
    raise ValueError("no aggregate 'cpu' line in /proc/stat")


def steal_percent(before: tuple[int, ...], after: tuple[int, ...]) -> float | None:
    """Share of CPU time the hypervisor gave to someone else between two readings.

    guest/guest_nice are already counted inside user/nice, so only user..steal are summed.
    None when the kernel has no steal column or no time passed.
    """
    if len(before) <= _STEAL or len(after) <= _STEAL:
        return None
    delta = [a - b for a, b in zip(after[:_STEAL + 1], before[:_STEAL + 1])]
    total = sum(delta)
    if total <= 0 or delta[_STEAL] < 0:
        return None
    return 100.0 * delta[_STEAL] / total


def steal_since_boot_percent(times: tuple[int, ...]) -> float | None:
    return steal_percent((0,) * len(times), times)


# -- cloud, hypervisor, container -------------------------------------------------------------

_AZURE_ASSET_TAG = "7783-7084-3265-9085-8269-3286-77"

# Exact chassis_asset_tag values (cloud-init ds-identify). OpenStack-based clouds are told
# apart by this tag, so it is checked before the generic "OpenStack Nova" product name.
_CLOUD_BY_ASSET_TAG = {
    _AZURE_ASSET_TAG: "azure",
    "OracleCloud.com": "oracle",
    "HUAWEICLOUD": "huawei",
    "OpenTelekomCloud": "opentelekomcloud",
    "SAP CCloud VM": "sap",
    "Samsung Cloud Platform": "samsung",
    "OpenStack Nova": "openstack",
    "OpenStack Compute": "openstack",
}


def cloud_from_dmi(dmi: Mapping[str, str]) -> str | None:
    """The cloud provider named by world-readable DMI fields, or None."""
    def get(key: str) -> str:
        return dmi.get(key, "").strip()

    if cloud := _CLOUD_BY_ASSET_TAG.get(get("chassis_asset_tag")):
        return cloud
    product = get("product_name")
    if product == "Google Compute Engine" or get("bios_vendor") == "Google":
        return "gcp"
    if any(get(key).startswith("Amazon EC2") for key in ("sys_vendor", "board_vendor",
                                                          "bios_vendor")):
        return "aws"
    if "amazon" in get("bios_version").lower():  # pre-Nitro Xen instances: "4.2.amazon"
        return "aws"
    if product == "Alibaba Cloud ECS" or get("sys_vendor") == "Alibaba Cloud":
        return "alibaba"
    if product in ("OpenStack Nova", "OpenStack Compute"):
        return "openstack"
    return None


# -- spot / preemptible, from the cloud's instance metadata -------------------------------------

METADATA_ADDRESS = "http://169.254.169.254"  # AWS, GCP (metadata.google.internal) and Azure alike
METADATA_BUDGET_S = 0.5  # all requests together: a machine off the cloud must not wait


class Lifecycle(NamedTuple):
    """Whether the platform can take the instance back (spot, preemptible), as its metadata says."""

    preemptible: bool | None  # None: the metadata did not answer
    value: str | None  # the platform's own word: "spot", "on-demand", "SPOT", "Regular", ...
    source: str  # the metadata path it came from
    error: str | None = None  # why there is no answer


# Each cloud's documented metadata path and what its answer means (AWS instance-life-cycle:
# spot | on-demand | scheduled; GCP provisioning-model: SPOT | STANDARD, older instances only
# scheduling/preemptible: TRUE | FALSE; Azure compute/priority: Regular | Low | Spot).
_AWS_TOKEN = "/latest/api/token"
_AWS_LIFECYCLE = "/latest/meta-data/instance-life-cycle"
_GCP_MODEL = "/computeMetadata/v1/instance/scheduling/provisioning-model"
_GCP_PREEMPTIBLE = "/computeMetadata/v1/instance/scheduling/preemptible"
_AZURE_PRIORITY = "/metadata/instance/compute/priority?api-version=2021-02-01&format=text"


class _Metadata:
    """Read-only requests to the link-local metadata service within one time budget, never
    through a proxy (the environment's HTTP proxy cannot reach a link-local address)."""

    def __init__(self, base_url: str, budget_s: float):
        import urllib.request

        self._base = base_url.rstrip("/")
        self._deadline = time.monotonic() + budget_s
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def fetch(self, path: str, headers: dict[str, str], method: str = "GET") -> str:
        import urllib.request

        left = self._deadline - time.monotonic()
        if left <= 0.01:
            raise TimeoutError("out of time")
        request = urllib.request.Request(self._base + path, headers=headers, method=method)
        with self._opener.open(request, timeout=left) as response:
            return response.read(256).decode("ascii", "replace").strip()


def instance_lifecycle(cloud: str | None, base_url: str = METADATA_ADDRESS,
                       budget_s: float = METADATA_BUDGET_S) -> Lifecycle | None:
    """Spot or on-demand, from the instance metadata of AWS, GCP or Azure (None: another cloud or
    none, where there is no such metadata to ask). Never raises: a failed request says why."""
    readers = {"aws": _aws_lifecycle, "gcp": _gcp_lifecycle, "azure": _azure_lifecycle}
    if cloud not in readers:
        return None
    return readers[cloud](_Metadata(base_url, budget_s))


def _metadata_error(error: BaseException) -> str:
    import urllib.error

    if isinstance(error, urllib.error.HTTPError):
        return f"HTTP {error.code}"
    reason = getattr(error, "reason", None) or error
    if isinstance(reason, (TimeoutError, socket.timeout)) or "timed out" in str(reason):
        return f"no answer within {METADATA_BUDGET_S:g} s"
    return _why(reason) if isinstance(reason, BaseException) else str(reason)


def _aws_lifecycle(metadata: _Metadata) -> Lifecycle:
    source = f"EC2 instance metadata {_AWS_LIFECYCLE}"
    try:  # IMDSv2: a session token first (a PUT), then the read with it
        token = metadata.fetch(_AWS_TOKEN, {"X-aws-ec2-metadata-token-ttl-seconds": "60"}, method="PUT")
    except Exception as error:  # noqa: BLE001 - any failure is a reason, never a crash
        return Lifecycle(None, None, source, f"IMDSv2 token request failed: {_metadata_error(error)}")
    try:
        value = metadata.fetch(_AWS_LIFECYCLE, {"X-aws-ec2-metadata-token": token})
    except Exception as error:  # noqa: BLE001
        return Lifecycle(None, None, source, _metadata_error(error))
    return _judged(value, source, yes={"spot"}, no={"on-demand", "scheduled", "capacity-block"})


def _judged(value: str, source: str, yes: set[str], no: set[str]) -> Lifecycle:
    """The answer as preemptible or not; a word the docs do not list is kept, but judges nothing."""
    word = value.strip().lower()
    if word in yes or word in no:
        return Lifecycle(word in yes, value, source)
    return Lifecycle(None, value, source, f"unexpected answer {value[:40]!r}")


def _gcp_lifecycle(metadata: _Metadata) -> Lifecycle:
    headers = {"Metadata-Flavor": "Google"}
    try:
        value = metadata.fetch(_GCP_MODEL, headers)
        return _judged(value, f"GCE metadata {_GCP_MODEL}", yes={"spot"}, no={"standard", "reservation_bound"})
    except Exception as error:  # noqa: BLE001 - older instances lack provisioning-model
        first_error = _metadata_error(error)
    source = f"GCE metadata {_GCP_PREEMPTIBLE}"
    try:
        value = metadata.fetch(_GCP_PREEMPTIBLE, headers)
    except Exception as error:  # noqa: BLE001
        return Lifecycle(None, None, source, f"{_metadata_error(error)} (provisioning-model: {first_error})")
    return _judged(value, source, yes={"true"}, no={"false"})


def _azure_lifecycle(metadata: _Metadata) -> Lifecycle:
    source = "Azure instance metadata compute/priority"
    try:
        value = metadata.fetch(_AZURE_PRIORITY, {"Metadata": "true"})
    except Exception as error:  # noqa: BLE001
        return Lifecycle(None, None, source, _metadata_error(error))
    return _judged(value, source, yes={"spot", "low"}, no={"regular"})


# systemd src/basic/virt.c: fields in this order, each matched by prefix against the table.
# systemd's "Oracle Corporation" -> VirtualBox entry is left out: Oracle's own bare-metal
# servers (OCI GPU shapes) report that vendor too.
_DMI_VM_FIELDS = ("product_name", "sys_vendor", "board_vendor", "bios_vendor", "product_version")
_DMI_VM_PREFIXES = (
    ("KVM", "kvm"), ("OpenStack", "kvm"), ("KubeVirt", "kvm"), ("Amazon EC2", "nitro"),
    ("QEMU", "qemu"), ("VMware", "vmware"), ("VMW", "vmware"), ("innotek GmbH", "virtualbox"),
    ("VirtualBox", "virtualbox"), ("Xen", "xen"), ("Bochs", "bochs"), ("Parallels", "parallels"),
    ("BHYVE", "bhyve"), ("Hyper-V", "hyperv"), ("Apple Virtualization", "apple"),
    ("Google Compute Engine", "google"),
)


def _hypervisor_from_dmi(dmi: Mapping[str, str]) -> str | None:
    if (dmi.get("sys_vendor"), dmi.get("product_name")) == ("Microsoft Corporation",
                                                            "Virtual Machine"):
        return "hyperv"  # any Hyper-V guest, Azure or not
    for key in _DMI_VM_FIELDS:
        value = dmi.get(key, "")
        for prefix, name in _DMI_VM_PREFIXES:
            if value.startswith(prefix):
                if name == "nitro" and re.search(r"\.metal(-|$)", dmi.get("product_name", "")):
                    return None  # EC2 *.metal instance types run without a hypervisor
                return name
    return None


def hypervisor_from(dmi: Mapping[str, str], sys_hypervisor_type: str | None,
                    cpu_flags: Collection[str], clocksources: Collection[str] = ()) -> str | None:
    """The hypervisor under this machine; None for bare metal or when nothing says otherwise.

    `clocksources` (available_clocksource) adds a signal DMI lacks: kvm-clock exists only when
    the kernel found KVM's CPUID signature, so it tells a KVM-accelerated "QEMU" machine apart.
    """
    from_dmi = _hypervisor_from_dmi(dmi)
    if from_dmi == "qemu" and "kvm-clock" in clocksources:
        return "kvm"
    if from_dmi:
        return from_dmi
    if sys_hypervisor_type:
        return sys_hypervisor_type.strip().lower()
    if "kvm-clock" in clocksources:
        return "kvm"
    if any(source.startswith("hyperv") for source in clocksources):
        return "hyperv"
    if "xen" in clocksources:
        return "xen"
    if "hypervisor" in cpu_flags:
        return "unknown"
    return None


def container_from(dockerenv: bool, containerenv: bool, environ: Mapping[str, str],
                   pid1_cgroup: str | None) -> str | None:
    """The container runtime around this process, or None when not in a container."""
    cgroup = pid1_cgroup or ""
    if environ.get("KUBERNETES_SERVICE_HOST") or "kubepods" in cgroup:
        return "kubernetes"
    if containerenv:
        return "podman"
    if dockerenv:
        return "docker"
    if environ.get("container"):  # set by systemd-nspawn, LXC, podman
        return environ["container"]
    for marker in ("docker", "containerd", "lxc"):
        if marker in cgroup:
            return marker
    return None


# -- storage ----------------------------------------------------------------------------------

class Mount(NamedTuple):
    mount_point: str
    fs_type: str
    source: str
    dev: str | None  # "major:minor" from mountinfo


_NETWORK_FS = {"nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "ceph", "cephfs",
               "glusterfs", "beegfs", "wekafs", "9p", "virtiofs"}
# FUSE subtypes (fs type "fuse.<name>", or plain "fuse" with this source) that live on a network.
_NETWORK_FUSE = {"sshfs", "s3fs", "gcsfuse", "juicefs", "rclone", "goofys", "blobfuse",
                 "blobfuse2", "mountpoint-s3", "glusterfs", "cephfs", "ceph-fuse", "lustre"}
_OVERLAY_FS = {"overlay", "aufs", "fuse.fuse-overlayfs"}
_RAM_FS = {"tmpfs", "ramfs"}
# Virtual disks whose rotational flag echoes the hypervisor's setting, not the medium
# (virtio-blk reports 1 even on SSD-backed hosts).
_NO_MEDIA_INFO = ("vd", "loop", "zram", "ram")

# Disk models that the cloud marks as instance storage (wiped when the instance stops or is
# reclaimed). GCP's persistent disk is "nvme_card-pd", so local SSD must match exactly.
_INSTANCE_STORAGE = re.compile(
    r"Amazon EC2 NVMe Instance Storage|nvme_card\d*|EphemeralDisk"
    r"|Microsoft NVMe Direct Disk( v\d+)?")


def parse_mountinfo(text: str) -> list[Mount]:
    """Mounts from /proc/self/mountinfo.

    Line: "id parent maj:min root mount_point options [optional tags] - fs_type source ...".
    """
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 2:
            continue
        mounts.append(Mount(_unescape(fields[4]), tail[0], _unescape(tail[1]), fields[2]))
    return mounts


def _unescape(value: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes (\\040 ...)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), value)


def mount_for(path: str, mounts: list[Mount]) -> Mount | None:
    """The mount that holds `path`: the longest matching mount point; the last one if stacked."""
    best, best_length = None, -1
    for mount in mounts:
        point = mount.mount_point.rstrip("/") or "/"
        inside = path == point or path.startswith(point if point == "/" else point + "/")
        if inside and len(point) >= best_length:
            best, best_length = mount, len(point)
    return best


def storage_kind(fs_type: str | None, device_name: str | None, rotational: bool | None) -> str:
    """nvme, ssd, hdd, network, overlay, tmpfs or unknown.

    `device_name` is the whole disk behind a block device ("nvme0n1", "sda"), else the mount
    source (which names the program behind a plain "fuse" mount).
    """
    fs = (fs_type or "").lower()
    fuse_name: str | None
    if fs.startswith("fuse."):
        fuse_name = fs[len("fuse."):]
    else:
        fuse_name = (device_name or "").lower() if fs == "fuse" else None
    if fs in _NETWORK_FS or fuse_name in _NETWORK_FUSE:
        return "network"
    if fs in _OVERLAY_FS:
        return "overlay"
    if fs in _RAM_FS:
        return "tmpfs"
    if not device_name or fs.startswith("fuse"):
        return "unknown"
    if device_name.startswith(("rbd", "nbd")):  # Ceph RBD / network block device
        return "network"
    if device_name.startswith("nvme"):
        return "nvme"
    if device_name.startswith(_NO_MEDIA_INFO) or rotational is None:
        return "unknown"
    return "hdd" if rotational else "ssd"


def ephemeral_from(kind: str | None, model: str | None) -> tuple[bool | None, str | None]:
    """(ephemeral, reason): True where data is known to vanish with the instance or container."""
    if kind == "overlay":
        return True, "container writable layer: deleted with the container"
    if kind == "tmpfs":
        return True, "RAM-backed: lost at reboot"
    if model and _INSTANCE_STORAGE.fullmatch(model):
        return True, f"instance storage ({model}): wiped when the instance stops or is reclaimed"
    return None, None


def _mounts() -> list[Mount]:
    try:
        return parse_mountinfo(_read(PROC_MOUNTINFO))
    except OSError:  # not Linux: psutil knows the mounts but not their device numbers
        return [Mount(p.mountpoint, p.fstype, p.device, None)
                for p in _psutil().disk_partitions(all=True)]


def _block_device(mount: Mount) -> str | None:
    """Kernel name of the block device behind a mount ("nvme0n1p2", "dm-0"), or None."""
    # The device number works even where the source says "/dev/root".
    if mount.dev and os.path.exists(f"/sys/dev/block/{mount.dev}"):
        return os.path.basename(os.path.realpath(f"/sys/dev/block/{mount.dev}"))
    if mount.source.startswith("/dev/"):
        name = os.path.basename(os.path.realpath(mount.source))
        if os.path.exists(f"/sys/class/block/{name}"):
            return name
    return None


def _whole_disk(name: str) -> str:
    """Partition -> its disk; device-mapper / md -> the disk under its first member."""
    for _ in range(8):  # dm on md on partitions is as deep as real stacks go
        node = os.path.realpath(f"/sys/class/block/{name}")
        if os.path.exists(f"{node}/partition"):
            node = os.path.dirname(node)
            name = os.path.basename(node)
        slaves = sorted(os.listdir(f"{node}/slaves")) if os.path.isdir(f"{node}/slaves") else []
        if not slaves:
            return name
        name = slaves[0]
    return name


def storage_for(path: str, unavailable: dict[str, str] | None = None) -> Storage:
    """Where `path` lives: mount, file system, disk kind and model, space, ephemerality.

    Never raises; reasons for missing values go into `unavailable` under "workdir[.field]".
    """
    notes = unavailable if unavailable is not None else {}
    storage = Storage(path=path)
    real = os.path.realpath(path)
    if not os.path.exists(real):
        notes["workdir"] = f"does not exist: {path}"
        return storage
    with _isolated(notes, "workdir.free_bytes"):
        usage = shutil.disk_usage(real)
        storage.total_bytes, storage.free_bytes = usage.total, usage.free
    mount = None
    with _isolated(notes, "workdir.mount_point"):
        mount = mount_for(real, _mounts())
    if mount is None:
        notes.setdefault("workdir.mount_point", f"no mount found for {real}")
        return storage
    storage.mount_point, storage.fs_type = mount.mount_point, mount.fs_type
    storage.device = mount.source
    disk = rotational = None
    with _isolated(notes, "workdir.kind"):
        block = _block_device(mount)
        disk = _whole_disk(block) if block else None
        if disk:
            rotational = _read(f"/sys/block/{disk}/queue/rotational").strip() == "1"
    storage.kind = storage_kind(mount.fs_type, disk or os.path.basename(mount.source), rotational)
    if disk:
        with contextlib.suppress(OSError):  # virtio and some RAID disks have no model
            storage.model = _read(f"/sys/block/{disk}/device/model").strip() or None
    storage.ephemeral, storage.ephemeral_reason = ephemeral_from(storage.kind, storage.model)
    return storage


# -- collection -------------------------------------------------------------------------------

def _read_dmi(unavailable: dict[str, str]) -> dict[str, str]:
    if not os.path.isdir(DMI_DIR):
        unavailable["dmi"] = f"no {DMI_DIR}"
        return {}
    dmi = {}
    for name in DMI_FIELDS:
        try:
            value = _read(f"{DMI_DIR}/{name}").strip()
        except FileNotFoundError:  # firmware fills only some fields
            continue
        except OSError as error:
            unavailable[f"dmi.{name}"] = _why(error)
            continue
        if value:
            dmi[name] = value
    return dmi


def _read_optional(path: str) -> str | None:
    try:
        return _read(path)
    except OSError:
        return None


def _fill_cpu(host: Host) -> None:
    notes = host.unavailable
    with _isolated(notes, "cpu_model"):
        cpuinfo = _read_optional(PROC_CPUINFO) or ""  # none outside Linux
        host.cpu_model = cpu_model_from_cpuinfo(cpuinfo) or platform.processor() or None
        if host.cpu_model is None:
            notes["cpu_model"] = f"no model in {PROC_CPUINFO} or platform.processor()"
    with _isolated(notes, "cpu_logical_cores"):
        host.cpu_logical_cores = _psutil().cpu_count(logical=True)
    with _isolated(notes, "cpu_physical_cores"):
        host.cpu_physical_cores = _psutil().cpu_count(logical=False)
        if host.cpu_physical_cores is None:
            notes["cpu_physical_cores"] = "psutil could not count physical cores"
    with _isolated(notes, "cpu_usable_cores"):
        if hasattr(os, "sched_getaffinity"):
            affinity = len(os.sched_getaffinity(0))
        else:  # macOS: no affinity API
            affinity = host.cpu_logical_cores
        quota = None
        with _isolated(notes, "cpu_usable_cores.cgroup_quota"):
            quota = cgroup_cpu_quota()
        host.cpu_usable_cores = usable_cores(affinity, quota) if affinity else None
    with _isolated(notes, "cpu_mhz"):
        freq = _psutil().cpu_freq()
        host.cpu_mhz = (freq.current or None) if freq else None  # 0.0 means "not reported"
        host.cpu_max_mhz = (freq.max or None) if freq else None
        if host.cpu_mhz is None:
            notes["cpu_mhz"] = "psutil reports no CPU frequency (common in VMs)"
        if host.cpu_max_mhz is None:
            notes["cpu_max_mhz"] = "no maximum CPU frequency reported (common in VMs)"


def _fill_memory(host: Host) -> None:
    notes = host.unavailable
    with _isolated(notes, "memory_total_bytes"):
        memory = _psutil().virtual_memory()
        host.memory_total_bytes, host.memory_available_bytes = memory.total, memory.available
    with _isolated(notes, "numa_nodes"):
        host.numa_nodes = sum(1 for name in os.listdir(NUMA_DIR) if re.fullmatch(r"node\d+", name))
    with _isolated(notes, "shm_total_bytes"):
        shm = os.statvfs("/dev/shm")
        host.shm_total_bytes = shm.f_frsize * shm.f_blocks
        host.shm_free_bytes = shm.f_frsize * shm.f_bavail


def _fill_lifecycle(host: Host) -> None:
    """Spot or on-demand from the cloud's metadata (AWS, GCP, Azure only; others have none to ask)."""
    lifecycle = instance_lifecycle(host.cloud)
    if lifecycle is None:
        return
    host.lifecycle_source = lifecycle.source
    if lifecycle.error or lifecycle.preemptible is None:
        host.unavailable["lifecycle"] = f"{lifecycle.source}: {lifecycle.error or 'no answer'}"
        return
    host.preemptible, host.lifecycle = lifecycle.preemptible, lifecycle.value


def _fill_platform(host: Host) -> None:
    notes = host.unavailable
    with _isolated(notes, "dmi"):
        host.dmi = _read_dmi(notes)
    with _isolated(notes, "cloud"):
        host.cloud = cloud_from_dmi(host.dmi)
        if host.cloud is None and not host.dmi:
            notes["cloud"] = "no DMI data to identify a cloud"
    with _isolated(notes, "lifecycle"):
        _fill_lifecycle(host)
    with _isolated(notes, "hypervisor"):
        cpuinfo = _read_optional(PROC_CPUINFO) or ""
        clocksources = set((_read_optional(CLOCKSOURCES) or "").split())
        host.hypervisor = hypervisor_from(host.dmi, _read_optional(SYS_HYPERVISOR_TYPE),
                                          cpu_flags_from_cpuinfo(cpuinfo), clocksources)
    with _isolated(notes, "container"):
        host.container = container_from(os.path.exists("/.dockerenv"),
                                        os.path.exists("/run/.containerenv"),
                                        os.environ, _read_optional("/proc/1/cgroup"))


def collect_host(workdir: str | None = None, steal_window_s: float = 0.5) -> Host:
    """Read every host fact. Takes about `steal_window_s` (the CPU steal sample); never raises."""
    host = Host()
    notes = host.unavailable
    started = time.monotonic()
    times_before = None
    with _isolated(notes, "steal_pct"):
        times_before = parse_cpu_times(_read(PROC_STAT))

    # The other reads run inside the steal window, so they cost no extra time.
    with _isolated(notes, "hostname"):
        host.hostname = socket.gethostname()
    with _isolated(notes, "os"):
        host.os = platform.freedesktop_os_release().get("PRETTY_NAME")
    with _isolated(notes, "kernel"):
        host.kernel = platform.release() or None
    _fill_cpu(host)
    _fill_memory(host)
    _fill_platform(host)
    with _isolated(notes, "somaxconn"):
        host.somaxconn = int(_read(SOMAXCONN))
    with _isolated(notes, "uptime_s"):
        host.uptime_s = float(_read(PROC_UPTIME).split()[0])
    with _isolated(notes, "workdir"):
        host.workdir = storage_for(workdir or os.getcwd(), notes)

    if times_before is not None:
        with _isolated(notes, "steal_pct"):
            time.sleep(max(0.0, steal_window_s - (time.monotonic() - started)))
            times_after = parse_cpu_times(_read(PROC_STAT))
            host.steal_window_s = round(time.monotonic() - started, 3)
            steal = steal_percent(times_before, times_after)
            host.steal_pct = None if steal is None else round(steal, 2)
            if steal is None:
                notes["steal_pct"] = "no steal column or no CPU time passed in the window"
            since_boot = steal_since_boot_percent(times_after)
            host.steal_since_boot_pct = None if since_boot is None else round(since_boot, 2)
    return host
