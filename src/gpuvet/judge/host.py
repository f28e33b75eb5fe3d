"""host.* and storage.workdir: can the machine around the GPUs keep up, and is your work safe?"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..catalog import checked
from ..facts import Host
from ..record import Finding
from .common import FAIL, PASS, SKIP, WARN, Context, finding, why_missing
from .host_io import NETWORK_VOLUME_MODELS

# The checks this module judges, by their catalogue ids (catalog.checked refuses an id it lacks).
HOST_CPU = checked("host.cpu")
HOST_PREEMPTIBLE = checked("host.preemptible")
HOST_SHM = checked("host.shm")
HOST_SOMAXCONN = checked("host.somaxconn")
HOST_STEAL = checked("host.steal")
STORAGE_PERSISTENCE = checked("storage.persistence")
STORAGE_WORKDIR = checked("storage.workdir")

GIB = 1024**3

# A DataLoader decoding and augmenting images needs several cores per GPU; the seed saw a 4090
# with 8 cores held under 90% busy, and train a third faster with 16: 8 is the starved case.
CORES_PER_GPU_WARN = 16
CORES_PER_GPU_FAIL = 4
SHM_FAIL_BYTES = 1 * GIB  # Docker's default is 64 MB: DataLoader workers die with "bus error"
SHM_WARN_BYTES = 4 * GIB
STEAL_WARN_PCT = 5.0
STEAL_FAIL_PCT = 15.0
SOMAXCONN_MIN = 1024  # the seed's 128 dropped a batch API's 200 concurrent connections
WORKDIR_FREE_WARN_BYTES = 20 * GIB


def _no_host(check: str, subject: str = "host") -> list[Finding]:
    return [finding(check, subject, SKIP, "host facts not in the capture (gpuvet run collects them)")]


def check_cpu(ctx: Context) -> list[Finding]:
    host = ctx.machine.host
    if host is None:
        return _no_host(HOST_CPU)
    cores = host.cpu_usable_cores or host.cpu_logical_cores
    if not cores:
        return [finding(HOST_CPU, "host", SKIP, f"CPU count unknown: {why_missing(host, 'cpu_logical_cores')}")]
    model = host.cpu_model or "CPU"
    described = f"{cores} usable cores ({host.cpu_physical_cores or '?'} physical, {host.cpu_logical_cores or '?'} logical), {model}"
    gpus = len(ctx.machine.gpus)
    expected = f"at least {CORES_PER_GPU_WARN} usable cores per GPU (under {CORES_PER_GPU_FAIL} fails)"
    source = ("PyTorch DataLoader practice: several worker processes per GPU; the seed: an 8-core RTX 4090 instance "
              "stayed under 90% GPU busy, and 16 cores cut its training time by a third")
    if gpus == 0:
        return [finding(HOST_CPU, "host", PASS, described, measured=described,
                        expected=f"{expected}; no GPU here to feed", source=source)]
    per_gpu = cores / gpus
    measured = f"{described}; {per_gpu:.1f} per GPU"
    remedy = "raise DataLoader num_workers up to the core count; if the GPU still waits on data, rent more vCPUs per GPU"
    if per_gpu < CORES_PER_GPU_FAIL:
        return [finding(HOST_CPU, "host", FAIL, f"only {per_gpu:.1f} CPU cores per GPU: the input pipeline will starve the GPUs",
                        measured=measured, expected=expected, source=source, remedy=remedy)]
    if per_gpu < CORES_PER_GPU_WARN:
        return [finding(HOST_CPU, "host", WARN, f"{per_gpu:.1f} CPU cores per GPU: image decoding and augmentation may not keep up",
                        measured=measured, expected=expected, source=source, remedy=remedy)]
    return [finding(HOST_CPU, "host", PASS, f"{per_gpu:.0f} CPU cores per GPU ({cores} usable, {model})", measured=measured,
                    expected=expected, source=source)]


def check_shm(ctx: Context) -> list[Finding]:
    host = ctx.machine.host
    if host is None:
        return _no_host(HOST_SHM)
    size = host.shm_total_bytes
    if size is None:
        return [finding(HOST_SHM, "host", SKIP, f"/dev/shm not readable: {why_missing(host, 'shm_total_bytes')}")]
    measured = f"/dev/shm {size / GIB:.1f} GiB ({(host.shm_free_bytes or 0) / GIB:.1f} GiB free)"
    remedy = ("start the container with `--shm-size=16g` (or `--ipc=host`); on Kubernetes mount an emptyDir with "
              "medium: Memory at /dev/shm")
    expected = f"at least {SHM_WARN_BYTES // GIB} GiB (under {SHM_FAIL_BYTES // GIB} GiB fails)"
    source = ("PyTorch DataLoader workers hand batches over in shared memory (/dev/shm); Docker's default is 64 MB "
              "(docs.docker.com, `docker run --shm-size`)")
    if size < SHM_FAIL_BYTES:
        return [finding(HOST_SHM, "host", FAIL,
                        f"/dev/shm is only {size / 2**20:.0f} MiB: PyTorch DataLoader workers crash with 'bus error' or 'No space left'",
                        measured=measured, expected=expected, source=source, remedy=remedy)]
    if size < SHM_WARN_BYTES:
        return [finding(HOST_SHM, "host", WARN, f"/dev/shm is {size / GIB:.1f} GiB: tight for several DataLoader workers with large batches",
                        measured=measured, expected=expected, source=source, remedy=remedy)]
    return [finding(HOST_SHM, "host", PASS, measured, measured=measured, expected=expected, source=source)]


def check_steal(ctx: Context) -> list[Finding]:
    host = ctx.machine.host
    if host is None:
        return _no_host(HOST_STEAL)
    if host.steal_pct is None:
        return [finding(HOST_STEAL, "host", SKIP, f"CPU steal not measurable: {why_missing(host, 'steal_pct')}")]
    window = f" over {host.steal_window_s:.1f} s" if host.steal_window_s else ""
    since_boot = f", {host.steal_since_boot_pct:.1f}% since boot" if host.steal_since_boot_pct is not None else ""
    measured = f"{host.steal_pct:.1f}% steal{window}{since_boot}"
    worst = max(host.steal_pct, host.steal_since_boot_pct or 0.0)
    expected = f"under {STEAL_WARN_PCT:.0f}% ({STEAL_FAIL_PCT:.0f}% or more fails)"
    source = "/proc/stat steal time (CPU time the hypervisor gave to other guests), over the window and since boot"
    remedy = "run `vmstat 1 10` (column st) while your job runs; high steal means an oversold host: ask for another one"
    if worst >= STEAL_FAIL_PCT:
        return [finding(HOST_STEAL, "host", FAIL, f"the hypervisor takes {worst:.0f}% of CPU time: neighbours share your cores",
                        measured=measured, expected=expected, source=source, remedy=remedy)]
    if worst >= STEAL_WARN_PCT:
        return [finding(HOST_STEAL, "host", WARN, f"{worst:.0f}% CPU steal: the host is busy with other tenants",
                        measured=measured, expected=expected, source=source, remedy=remedy)]
    where = f" ({host.hypervisor} guest)" if host.hypervisor else ""
    return [finding(HOST_STEAL, "host", PASS, f"{measured}{where}", measured=measured, expected=expected, source=source)]


def check_somaxconn(ctx: Context) -> list[Finding]:
    host = ctx.machine.host
    if host is None:
        return _no_host(HOST_SOMAXCONN)
    value = host.somaxconn
    if value is None:
        return [finding(HOST_SOMAXCONN, "host", SKIP, f"net.core.somaxconn not readable: {why_missing(host, 'somaxconn')}")]
    measured = f"net.core.somaxconn = {value}"
    expected = f">= {SOMAXCONN_MIN} (4096 on kernels since 5.4)"
    source = "Linux: net.core.somaxconn caps every listen() backlog; seed: 128 dropped 200 concurrent requests"
    if value < SOMAXCONN_MIN:
        return [finding(HOST_SOMAXCONN, "host", WARN,
                        f"TCP accept queue of {value}: a server (inference API, Jupyter, rendezvous) drops connections under bursts",
                        measured=measured, expected=expected, source=source,
                        remedy="sudo sysctl -w net.core.somaxconn=4096 (now), and to keep it after a reboot: "
                               "echo 'net.core.somaxconn = 4096' | sudo tee /etc/sysctl.d/60-somaxconn.conf")]
    return [finding(HOST_SOMAXCONN, "host", PASS, measured, measured=measured, expected=expected, source=source)]


def preemptible_of(options: Mapping[str, Any], host: Host | None) -> tuple[bool | None, str]:
    """Whether the instance can be reclaimed, and who says so: the user (--preemptible or
    --on-demand) first, else the cloud's instance metadata, else unknown ("")."""
    stated = stated_yes_no(options.get("preemptible"))
    if stated is not None:
        return stated, "as you stated"
    if host is not None and host.preemptible is not None:
        return host.preemptible, f"{host.lifecycle} per the {host.lifecycle_source}"
    return None, ""


PREEMPTIBLE_TELL = "`gpuvet run --preemptible` or `--on-demand`"


def check_preemptible(ctx: Context) -> list[Finding]:
    """host.preemptible: can the instance be reclaimed? What the user stated wins, then the cloud's
    instance metadata; nothing inside a machine says it otherwise, and unknown is no pass."""
    host: Host | None = ctx.machine.host
    preemptible, said_by = preemptible_of(ctx.options, host)
    if preemptible is None:
        asked = host.unavailable.get("lifecycle") if host else None
        where = f"the instance metadata did not say ({asked}): " if asked else "not visible from inside the machine: "
        return [finding(HOST_PREEMPTIBLE, "host", SKIP,
                        f"{where}see the billing page or instance type, then tell gpuvet ({PREEMPTIBLE_TELL})",
                        remedy=f"see the billing page or instance type, then run {PREEMPTIBLE_TELL}")]
    lifecycle = (host.lifecycle if host is not None and said_by != "as you stated" else None) or \
        ("preemptible" if preemptible else "on-demand")
    source = ("what you stated (--preemptible / --on-demand)" if said_by == "as you stated"
              else f"the cloud's instance metadata ({(host.lifecycle_source if host else None) or 'its lifecycle'})")
    expected = "an instance that is not reclaimed mid-job (on-demand or reserved)"
    if preemptible:
        return [finding(HOST_PREEMPTIBLE, "host", WARN,
                        f"preemptible ({said_by}): it can be reclaimed at any time; make the job resumable and keep "
                        "checkpoints on persistent storage", measured=lifecycle, expected=expected, source=source,
                        remedy="make the job resumable and keep checkpoints on persistent storage (a network volume "
                               "or object storage), or rent an on-demand instance")]
    return [finding(HOST_PREEMPTIBLE, "host", PASS, f"not preemptible ({said_by})", measured=lifecycle,
                    expected=expected, source=source)]


def stated_yes_no(value: object) -> bool | None:
    """A yes/no the user gave (a flag, or words a record or an import may hold: "spot", "on-demand")."""
    if isinstance(value, bool) or value is None:
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "y", "spot", "preemptible", "interruptible"):
        return True
    if text in ("0", "false", "no", "n", "on-demand", "ondemand", "reserved"):
        return False
    return None


def workdir_persistence(host: Host) -> tuple[bool | None, str]:
    """(persistent?, why) for the working directory: True or False where the facts tell, None where
    they cannot. A local disk of a VM or cloud instance may be instance storage, wiped when the
    instance stops or is reclaimed, and nothing inside the machine says which."""
    w = host.workdir
    if w is None or w.fs_type is None:
        return None, "the working directory was not examined"
    if w.kind in ("overlay", "tmpfs") or w.ephemeral:
        return False, w.ephemeral_reason or f"{w.kind}: not kept"
    if w.kind == "network":
        return True, "a network file system: it outlives the instance"
    if w.model and any(tag in w.model for tag in NETWORK_VOLUME_MODELS):
        return True, f"{w.model}: a network block volume, kept when the instance stops"
    physical = not (host.hypervisor or host.cloud or host.container)
    if physical and w.kind in ("nvme", "ssd", "hdd"):
        return True, "a local disk of a physical machine"
    where = ", ".join(x for x in (host.cloud, f"{host.hypervisor} guest" if host.hypervisor else None,
                                  f"in {host.container}" if host.container else None) if x)
    disk = {"nvme": "a local NVMe disk", "ssd": "a local SSD", "hdd": "a local HDD"}.get(w.kind or "", "a virtual or unknown disk")
    return None, f"cannot tell whether {disk}{' (' + where + ')' if where else ''} is kept when the instance stops or is reclaimed"


def _confirm_persistence(path: str) -> str:
    return (f"check `findmnt -T {path}`, `lsblk -o NAME,TYPE,ROTA,MODEL` and the provider's docs on instance "
            "(local, ephemeral) storage versus persistent volumes")


def check_workdir(ctx: Context) -> list[Finding]:
    """storage.workdir: what the working directory is on, and whether checkpoints fit there.
    Whether it outlives the instance is storage.persistence's finding."""
    host: Host | None = ctx.machine.host
    if host is None:
        return _no_host(STORAGE_WORKDIR, "storage")
    w = host.workdir
    if w is None or w.fs_type is None:
        return [finding(STORAGE_WORKDIR, "storage", SKIP, f"working directory not examined: {why_missing(host, 'workdir')}")]
    free = f"{w.free_bytes / GIB:.0f} GiB free" if w.free_bytes is not None else "free space unknown"
    where = f"{w.path} on {w.fs_type} ({w.kind or 'unknown'}{', ' + w.model if w.model else ''}), {free}"
    remedy = "keep datasets and checkpoints on persistent storage; check with `df -hT .` and the provider's volume docs"
    expected = f"a disk fit for heavy IO with room for checkpoints ({WORKDIR_FREE_WARN_BYTES // GIB} GiB free or more)"
    issues: list[str] = []
    if w.kind == "overlay":
        issues.append("the container's writable layer: deleted with the container, and slow for heavy IO")
    elif w.kind == "tmpfs":
        issues.append("RAM-backed tmpfs: lost at reboot and it eats memory")
    elif w.kind == "network":
        issues.append("a network file system: small-file reads are slow (pack datasets into tar/WebDataset shards)")
    if w.free_bytes is not None and w.free_bytes < WORKDIR_FREE_WARN_BYTES:
        issues.append(f"only {free}: checkpoints may not fit")
    if issues:
        return [finding(STORAGE_WORKDIR, "storage", WARN, "; ".join(issues), measured=where, expected=expected, remedy=remedy)]
    if w.free_bytes is None:
        return [finding(STORAGE_WORKDIR, "storage", SKIP, f"{where}: whether checkpoints fit is not known",
                        measured=where, remedy="check with `df -hT .`")]
    return [finding(STORAGE_WORKDIR, "storage", PASS, where, measured=where, expected=expected,
                    source="the file system and device behind the working directory (findmnt, statvfs, /sys/block)")]


def check_persistence(ctx: Context) -> list[Finding]:
    """storage.persistence: does the working directory (where checkpoints land by default) outlive
    the instance? Known from the facts where they tell; a VM's local disk may be instance storage,
    which only the provider's docs tell apart, and unknown is no pass (a warning on an instance
    that can be reclaimed, where losing it is the likely case)."""
    host: Host | None = ctx.machine.host
    if host is None:
        return _no_host(STORAGE_PERSISTENCE, "storage")
    w = host.workdir
    if w is None or w.fs_type is None:
        return [finding(STORAGE_PERSISTENCE, "storage", SKIP,
                        f"working directory not examined: {why_missing(host, 'workdir')}")]
    path = w.path or "."
    where = f"{path} on {w.fs_type}"
    measured = f"{where} ({w.kind or 'kind unknown'}{', ' + w.model if w.model else ''})"
    expected = "storage that outlives the instance (checkpoints survive a stop or a reclaim)"
    source = "the file system, device and platform behind the working directory (findmnt, /sys/block)"
    remedy = "keep checkpoints on a persistent volume or object storage"
    persistent, why = workdir_persistence(host)
    if persistent is True:
        return [finding(STORAGE_PERSISTENCE, "storage", PASS, f"{where}: {why}", measured=measured,
                        expected=expected, source=source)]
    if persistent is False:
        return [finding(STORAGE_PERSISTENCE, "storage", WARN, f"{where}: {why}; checkpoints there are lost with it",
                        measured=measured, expected=expected, source=source, remedy=remedy)]
    unknown = (f"{where}: {why}: check `findmnt -T {path}`, `lsblk -o NAME,TYPE,ROTA,MODEL` and the provider's docs "
               "on instance storage")
    preemptible, said_by = preemptible_of(ctx.options, host)
    if preemptible is True:
        return [finding(STORAGE_PERSISTENCE, "storage", WARN, f"{unknown}; the instance is preemptible ({said_by})",
                        measured=measured, expected=expected, source=source, remedy=f"{remedy}; {_confirm_persistence(path)}")]
    return [finding(STORAGE_PERSISTENCE, "storage", SKIP, unknown, measured=measured,
                    remedy=_confirm_persistence(path))]
