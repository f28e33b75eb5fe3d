"""storage.* and net.*: can the disks and the network keep the GPUs fed?

Two yardsticks, and a finding says which one it failed:
- the device: what its kind (NVMe, SATA SSD, HDD) does when healthy. Falling far short is a FAIL
  (a throttled, shared or mislabelled volume); falling short is a WARN.
- the training job: what the GPUs of this machine consume (image-classification figures, see
  NEED_SOURCE). Falling short is a WARN: the GPUs may wait on data, depending on the job.
Network file systems, virtual disks ("unknown") and container layers have no device yardstick,
only the job's.
"""

from __future__ import annotations

from ..catalog import checked
from ..facts import Host, Nic, RdmaPort
from ..record import MEASURED, Finding, Measurement, Valued
from .bench_common import measured, one, planned, worst
from .common import FAIL, PASS, SKIP, WARN, Context, finding

# The checks this module judges, by their catalogue ids (catalog.checked refuses an id it lacks).
NET_LOOPBACK = checked("net.loopback")
NET_NICS = checked("net.nics")
NET_NODE_TO_NODE = checked("net.node_to_node")
NET_RDMA = checked("net.rdma")
STORAGE_RANDOM_READ = checked("storage.random_read")
STORAGE_READ = checked("storage.read")
STORAGE_SHARED = checked("storage.shared")
STORAGE_SMALL_FILES = checked("storage.small_files")
STORAGE_WRITE = checked("storage.write")

# -- storage yardsticks -----------------------------------------------------------------------

DEVICE_SOURCE = ("typical healthy figures (vendor datasheets): NVMe SSD 2-7 GB/s sequential and 100k+ random "
                 "4 KiB reads/s at queue depth 32; SATA SSD capped by SATA III at ~550 MB/s, 75-100k reads/s; "
                 "7200 rpm HDD 120-250 MB/s, 100-200 reads/s")
# kind -> measurement -> (warn below, fail below, what a healthy one does)
DEVICE_FLOOR: dict[str, dict[str, tuple[float, float, str]]] = {
    "nvme": {"disk.seq_read": (1500, 500, "2-7 GB/s"), "disk.seq_write": (1000, 300, "1-6 GB/s"),
             "disk.rand_read_iops": (50_000, 10_000, "100k+ reads/s")},
    "ssd": {"disk.seq_read": (250, 80, "~500 MB/s (SATA III)"), "disk.seq_write": (200, 60, "~450 MB/s"),
            "disk.rand_read_iops": (20_000, 2_000, "75-100k reads/s")},
    "hdd": {"disk.seq_read": (80, 30, "120-250 MB/s"), "disk.seq_write": (80, 30, "120-250 MB/s"),
            "disk.rand_read_iops": (75, 30, "100-200 reads/s")},
}
# Block volumes that show up as NVMe but are network storage with provisioned limits.
NETWORK_VOLUME_MODELS = ("Elastic Block Store", "PersistentDisk", "nvme_card-pd", "Virtual_Disk")

NEED_SOURCE = ("gpuvet rule of thumb: ResNet-50 training consumes ~2,500 images/s per A100 (NVIDIA "
               "DeepLearningExamples, mixed precision) and ImageNet JPEGs average ~110 KB: ~300 MB/s, "
               "2,500 files or random reads per second per GPU")
NEED_MB_S_PER_GPU = 300.0
NEED_SAMPLES_PER_GPU = 2500.0  # files/s or random reads/s
CHECKPOINT_WRITE_MB_S = 100.0  # below: a 10 GB checkpoint keeps the GPUs idle for minutes
DEFAULT_DATASET_GB = 50.0  # the seed's example
DEFAULT_CHECKPOINT_GB = 10.0

CHECKS = {"disk.seq_write": STORAGE_WRITE, "disk.seq_read": STORAGE_READ,
          "disk.rand_read_iops": STORAGE_RANDOM_READ, "disk.small_files": STORAGE_SMALL_FILES}
REMEDY_DATA = ("copy the dataset to local NVMe before training, or pack small files into large shards "
               "(WebDataset tar, TFRecord, LMDB); confirm with `gpuvet bench disk --path DIR` or "
               "`fio --name=r --rw=read --bs=1M --direct=1 --size=1G --directory=DIR`")
REMEDY_DEVICE = ("ask the provider which volume type backs this path and its IOPS/throughput limits; "
                 "check the device with `lsblk -d -o NAME,ROTA,MODEL,SIZE` and `iostat -x 1` while it runs")


def check_storage(ctx: Context) -> list[Finding]:
    if not planned(ctx, "disk"):
        return []
    paths = _tested_paths(ctx)
    if not paths:
        return [finding(STORAGE_READ, "storage", SKIP, "disk was not measured")]
    findings = []
    for path in paths:
        for name, check in CHECKS.items():
            m = one(ctx, name, path)
            findings.append(_storage_finding(ctx, check, m) if m else _not_measured(ctx, "disk", check, path))
    return findings


SHARED_HOW = "run `gpuvet run --path /your/dataset/mount`"
_KIND_WORDS = {"nvme": "NVMe", "ssd": "SSD", "hdd": "HDD", "unknown": "virtual or unknown disk", "tmpfs": "tmpfs",
               "overlay": "container layer", "network": "network file system"}


def check_shared_storage(ctx: Context) -> list[Finding]:
    """storage.shared: was shared storage among the tested paths? A network file system, or a volume
    other than the working directory's; a path the user chose on the working directory's own disk
    tests that disk again, not the storage a dataset is read from."""
    if not planned(ctx, "disk"):
        return []
    measured_paths = [m for m in ctx.measurements if m.name in CHECKS and m.value is not None]
    paths = list(dict.fromkeys(m.subject for m in measured_paths))
    if not paths:
        return []  # nothing measured: storage.read and the per-path skips say why
    details = {p: next((m.details for m in measured_paths if m.subject == p and m.details), {}) for p in paths}
    workdir = ctx.machine.host.workdir if ctx.machine.host else None
    labels = ", ".join(f"{p} ({_KIND_WORDS.get(k, k) if (k := details[p].get('kind')) else 'kind unknown'})" for p in paths)
    beyond = [p for p in paths if _beyond_workdir(details[p], workdir.mount_point if workdir else None)]
    if not beyond:
        chosen = [p for p in paths if p in (ctx.options.get("paths") or [])]
        same = ""
        if chosen and workdir and workdir.mount_point:
            fs = f" on {workdir.fs_type}" if workdir.fs_type else ""
            same = f" ({', '.join(chosen)} is on the working directory's own disk: mount {workdir.mount_point}{fs})"
        return [finding(STORAGE_SHARED, "storage", SKIP,
                        f"local disk only: {labels} tested{same}; no shared or network storage tested: {SHARED_HOW}",
                        measured=f"tested {labels}", remedy=SHARED_HOW)]
    mounts = "; ".join(f"{p}: {details[p].get('fs_type') or '?'} at mount {details[p].get('mount_point') or '?'}" for p in beyond)
    return [finding(STORAGE_SHARED, "storage", PASS, f"shared storage tested: {', '.join(beyond)}",
                    measured=f"tested {labels}; {mounts}",
                    expected="a network file system, or a volume other than the working directory's, among the tested paths",
                    source="each tested path's file system and mount point (findmnt), against the working directory's "
                           f"mount ({workdir.mount_point if workdir and workdir.mount_point else 'not examined'})")]


def _beyond_workdir(details: dict, workdir_mount: str | None) -> bool:
    """A network file system, or a different mount than the working directory's; never a tmpfs
    (/dev/shm, /tmp on some systems): RAM, neither shared nor kept."""
    if details.get("kind") == "network":
        return True
    if details.get("kind") == "tmpfs" or details.get("fs_type") == "tmpfs":
        return False
    mount = details.get("mount_point")
    return bool(workdir_mount and mount and mount != workdir_mount)


def _tested_paths(ctx: Context) -> list[str]:
    names = set(CHECKS) | {"bench.disk"}
    return list(dict.fromkeys(m.subject for m in ctx.measurements if m.name in names))


def _not_measured(ctx: Context, bench: str, check: str, subject: str) -> Finding:
    """A planned host benchmark that left no figure: its note's reason (never a GPU verdict)."""
    note = next((m for m in measured(ctx, f"bench.{bench}", subject)), None)
    if note is None:
        return finding(check, subject, SKIP, f"{bench} gave no figure here")
    reason = note.details.get("reason", "no reason given")
    failed = note.details.get("outcome") == "failed"
    return finding(check, subject, SKIP, f"the {bench} benchmark could not run: {reason}" if failed else reason)


def _storage_finding(ctx: Context, check: str, m: Valued) -> Finding:
    details = m.details
    kind = details.get("kind") or "unknown"
    # The subject is the path; the summary says which engine measured, on what.
    where = f"({details.get('engine') or '?'}; {_describe_kind(kind, details.get('model'))}, {details.get('fs_type') or '?'})"
    measured_text = _measured_text(m)
    if kind == "tmpfs":
        return finding(check, m.subject, MEASURED, f"{_figure(m)} {where}: RAM, not a disk (data here is lost at reboot)",
                       measured=measured_text)
    device_status, device_words, device_expected = _against_device(m, kind, details.get("model"))
    need_status, need_words, need_expected = _against_need(ctx, m)
    status = worst(device_status, need_status)
    words = "; ".join(w for w in (device_words, need_words) if w)
    expected = "; ".join(e for e in (device_expected, need_expected) if e) or None
    sources = [s for s, st in ((DEVICE_SOURCE, device_expected), (NEED_SOURCE, need_expected)) if st]
    remedy = None
    if status != PASS:
        remedy = REMEDY_DEVICE if device_status != PASS and device_status is not None else REMEDY_DATA
    return finding(check, m.subject, status, f"{_figure(m)} {where}{': ' + words if words else ''}",
                   measured=measured_text, expected=expected, source="; ".join(sources) or None, remedy=remedy)


def _describe_kind(kind: str, model: str | None) -> str:
    label = {"nvme": "NVMe", "ssd": "SATA/SAS SSD", "hdd": "HDD", "network": "network file system",
             "overlay": "container layer", "tmpfs": "tmpfs", "unknown": "virtual or unknown disk"}.get(kind, kind)
    return f"{label} {model}" if model else label


def _figure(m: Measurement) -> str:
    label = {"disk.seq_write": "sequential write", "disk.seq_read": "sequential read",
             "disk.rand_read_iops": "random 4 KiB reads", "disk.small_files": "small-file reads"}[m.name]
    latency = ""
    if m.details.get("p50_us") is not None and m.details.get("p99_us") is not None:
        latency = f", p50 {_number(m.details['p50_us'])} us, p99 {_number(m.details['p99_us'])} us"
    return f"{label} {_number(m.value)} {m.unit}{latency}"


def _number(value: float | None) -> str:
    return "?" if value is None else f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def _measured_text(m: Measurement) -> str:
    d = m.details
    parts = [f"{_number(m.value)} {m.unit}", f"engine {d.get('engine', '?')}", f"cache {d.get('cache', '?')}"]
    if m.name == "disk.rand_read_iops":
        parts.append(f"depth {d.get('queue_depth')}, p50 {d.get('p50_us')} us, p99 {d.get('p99_us')} us")
    elif m.name == "disk.small_files":
        parts.append(f"{d.get('files')} files of {(d.get('file_bytes') or 0) // 1024} KiB, {d.get('readers')} readers, "
                     f"{_number(d.get('read_mb_s'))} MB/s" + (f" over {d['read_rounds']} cold rounds" if d.get("read_rounds") else "")
                     + f"; created at {_number(d.get('write_files_s'))} files/s")
    else:
        parts.append(f"{(d.get('block_size') or 0) // 2**20} MiB blocks x {d.get('queue_depth')} in flight, "
                     f"{(d.get('bytes') or 0) / 1e9:.2f} GB in {d.get('runtime_s')} s")
    return "; ".join(parts)


def _against_device(m: Valued, kind: str, model: str | None) -> tuple[str | None, str, str]:
    floors = DEVICE_FLOOR.get(kind, {}).get(m.name)
    if floors is None:
        return None, "", ""
    warn, fail, healthy = floors
    volume = model and any(tag in model for tag in NETWORK_VOLUME_MODELS)
    label = _describe_kind(kind, None)
    expected = f"a healthy {label} does {healthy} (at least {_number(warn)} {m.unit} expected)"
    if m.value < fail:
        words = f"far below any healthy {label} ({healthy})"
    elif m.value < warn:
        words = f"below a healthy {label} ({healthy})"
    else:
        return PASS, "", expected
    if volume:
        words += f"; {model} is a network block volume: its provisioned limits decide this"
    return (FAIL if m.value < fail else WARN), words, expected


def checkpoint_rate(m: Valued) -> tuple[float, str]:
    """The slower of the direct write and the buffered write + fsync a checkpoint really is (torch.save,
    `dd conv=fdatasync`), and words naming both when they differ."""
    buffered = m.details.get("checkpoint_mb_s") if m.details else None
    if not isinstance(buffered, (int, float)) or buffered <= 0:
        return m.value, ""
    if buffered < m.value:
        return buffered, (f" (as torch.save writes it, through the page cache plus fsync: {buffered:,.0f} MB/s; "
                          f"{m.value:,.0f} MB/s with O_DIRECT)")
    return m.value, f" (O_DIRECT {m.value:,.0f} MB/s; through the page cache plus fsync {buffered:,.0f} MB/s)"


def _against_need(ctx: Context, m: Valued) -> tuple[str | None, str, str]:
    gpus = max(1, len(ctx.machine.gpus))
    per = f" for {gpus} GPUs" if gpus > 1 else " for one GPU"
    if m.name == "disk.seq_write":
        checkpoint_gb = float(ctx.options.get("checkpoint_gb") or DEFAULT_CHECKPOINT_GB)
        rate, how = checkpoint_rate(m)
        seconds = checkpoint_gb * 1000 / rate if rate else float("inf")
        words = f"a {checkpoint_gb:g} GB checkpoint takes {_duration(seconds)}{how}"
        expected = f">= {CHECKPOINT_WRITE_MB_S:.0f} MB/s to save checkpoints without long pauses"
        return (WARN if rate < CHECKPOINT_WRITE_MB_S else PASS), words, expected
    if m.name == "disk.seq_read":
        dataset_gb = float(ctx.options.get("dataset_gb") or DEFAULT_DATASET_GB)
        need = NEED_MB_S_PER_GPU * gpus
        words = f"reading a {dataset_gb:g} GB dataset takes {_duration(dataset_gb * 1000 / m.value)} per epoch"
        words += _page_cache_hint(ctx.machine.host, dataset_gb)
        return (WARN if m.value < need else PASS), words, f">= {need:,.0f} MB/s to stream images{per}"
    need = NEED_SAMPLES_PER_GPU * gpus
    if m.name == "disk.small_files":
        dataset_gb = float(ctx.options.get("dataset_gb") or DEFAULT_DATASET_GB)
        mb_s = _small_file_mb_s(m)
        if mb_s:
            words = f"a {dataset_gb:g} GB dataset of such files takes {_duration(dataset_gb * 1000 / mb_s)} per epoch"
        else:
            words = "no epoch time: the benchmark reported neither MB/s nor the file size"
        if m.value < need:
            words += f"; the GPUs consume about {need:,.0f} samples/s"
            if m.details.get("kind") == "network":
                words += "; every open is a round trip to the file server"
        return (WARN if m.value < need else PASS), words, f">= {need:,.0f} files/s{per}"
    words = f"the GPUs consume about {need:,.0f} samples/s" if m.value < need else ""
    return (WARN if m.value < need else PASS), words, f">= {need:,.0f} random reads/s{per} (shuffled records)"


def _small_file_mb_s(m: Measurement) -> float | None:
    """MB/s of a small-file read: as reported, or files/s times the file size (older records)."""
    if m.details.get("read_mb_s"):
        return float(m.details["read_mb_s"])
    if m.value and m.details.get("file_bytes"):
        return m.value * m.details["file_bytes"] / 1e6
    return None


def _page_cache_hint(host: Host | None, dataset_gb: float) -> str:
    ram = host.memory_total_bytes if host else None
    if ram and dataset_gb * 1e9 < 0.5 * ram:
        return f" (after the first epoch it fits in the page cache: {ram / 2**30:.0f} GiB RAM)"
    return ""


def _duration(seconds: float) -> str:
    if seconds == float("inf"):
        return "forever"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


# -- network ----------------------------------------------------------------------------------

# The seed's `ping 127.0.0.1` table: 0.02 ms healthy (bare metal 0.03), 0.15 ms behind security-group
# filtering, 0.38 ms through a container overlay network. gpuvet's round trip adds Python at both
# ends (~10 us on a 2-core VM, measured: 25-30 us median), so the first bad band starts at 120 us.
LOOPBACK_WARN_US = 120.0
LOOPBACK_SOURCE = ("renters' loopback round trips (`ping -c 100 localhost`): 0.02 ms when healthy, 0.03 ms on bare metal, "
                   "0.15 ms behind security-group filtering, 0.38 ms through a container overlay network; gpuvet's TCP round "
                   "trip adds Python at both ends (25-30 us median on a healthy 2-core VM), hence the 120 us line; one TCP "
                   "stream over loopback does 5-50 Gbit/s (iperf3 on healthy machines)")
LOOPBACK_MIN_GBIT = 2.0  # one TCP stream over lo does 5-50 Gbit/s; less means starved CPUs or heavy filtering
MULTI_NODE_MIN_GBIT = 100.0  # per node, for data-parallel training without RDMA
NODE_LATENCY_WARN_US = 500.0  # same-zone TCP round trips are 50-200 us as an application sees them
NODE_LATENCY_SOURCE = ("zones of one cloud region are under 1-2 ms apart, usually under 1 ms (AWS re:Invent 2014 SPOT301; "
                       "Google Cloud: under 1 ms round trip at p95 between zones); inside one zone or placement group an "
                       "application's TCP round trip is 50-200 us, so 500 us or more means another zone, a VPN or an overlay")
NODE_LINK_SHARE_WARN = 0.5
MULTI_NODE_SOURCE = ("seed: multi-node training wants RDMA/RoCE; on plain TCP the speed-up of 8 GPUs fell below 5x. "
                     "NCCL's ring all-reduce moves 2(n-1)/n of the gradients per step over each node's link")
NODE_LINK_SOURCE = ("gpuvet rule of thumb: 4 parallel TCP streams (iperf3 -P 4) fill most of a healthy 10-100 GbE link; under "
                    "half means traffic shaping, a slower link at the other end, or a congested path between")
def check_network(ctx: Context) -> list[Finding]:
    """net.loopback (when the net benchmark was planned), net.nics and net.rdma (when the facts
    were read), net.node_to_node (for each `gpuvet net test` peer)."""
    findings = []
    if planned(ctx, "net"):
        findings.append(_loopback(ctx))
    findings += _nics(ctx) + _rdma(ctx) + _node_to_node(ctx)
    return findings


def _loopback(ctx: Context) -> Finding:
    latency = one(ctx, "net.loopback_latency", "loopback")
    throughput = one(ctx, "net.loopback_throughput", "loopback")
    if latency is None and throughput is None:
        return _not_measured(ctx, "net", NET_LOOPBACK, "loopback")
    parts, status = [], PASS
    if latency:
        # On the seed's `ping 127.0.0.1` scale (ms), so the figure reads against its table.
        parts.append(f"TCP round trip {latency.value:.0f} us = {latency.value / 1000:.3f} ms median (p99 "
                     f"{latency.details.get('p99_us')} us, {latency.details.get('round_trips')} round trips)")
        if latency.value >= LOOPBACK_WARN_US:
            status = WARN
    if throughput:
        parts.append(f"one stream {throughput.value:.1f} Gbit/s ({throughput.details.get('engine')})")
        if throughput.value < LOOPBACK_MIN_GBIT:
            status = WARN
    text = "; ".join(parts)
    expected = (f"round trip under {LOOPBACK_WARN_US:.0f} us ({LOOPBACK_WARN_US / 1000:.2f} ms; the seed's ping: 0.02 ms "
                f"healthy, 0.15 ms filtered, 0.38 ms overlay), one stream over {LOOPBACK_MIN_GBIT:.0f} Gbit/s")
    if status == PASS:
        return finding(NET_LOOPBACK, "loopback", PASS, text, measured=text, expected=expected, source=LOOPBACK_SOURCE)
    return finding(NET_LOOPBACK, "loopback", WARN,
                   f"slow TCP stack on loopback: {text}: packet filtering, an overlay network or starved CPUs add this to every "
                   "connection (Jupyter, data loading, monitoring)",
                   measured=text, expected=expected, source=LOOPBACK_SOURCE,
                   remedy="`sudo iptables -S | wc -l` and `sudo nft list ruleset | wc -l` (filter rules), `cat /proc/loadavg` "
                          "(CPU starvation); inside a container, compare with `--network host`")


def _active_rdma(host: Host) -> list[RdmaPort]:
    return [p for p in host.rdma or [] if (p.state or "").upper() == "ACTIVE"]


def _describe_nic(nic: Nic) -> str:
    speed = f"{nic.speed_mbps / 1000:g} Gbit/s" if nic.speed_mbps else "speed not reported"
    return f"{nic.name} ({', '.join(filter(None, [nic.driver, nic.operstate, speed]))})"


def _nics(ctx: Context) -> list[Finding]:
    host = ctx.machine.host
    if host is None or host.nics is None:  # not read: captures and older records do not have it
        return []
    physical = [n for n in host.nics if not n.virtual]
    if not physical:
        virtual = ", ".join(n.name for n in host.nics) or "none"
        return [finding(NET_NICS, "host", SKIP, f"no physical network interface visible (only {virtual}): "
                                                   "a container in its own network namespace sees veth devices only")]
    listing = ", ".join(_describe_nic(n) for n in physical)
    speeds = [n.speed_mbps for n in physical if n.speed_mbps and n.operstate == "up"]
    fastest = max(speeds) / 1000 if speeds else None
    if ctx.options.get("multi_node") and not _active_rdma(host) and fastest is not None and fastest < MULTI_NODE_MIN_GBIT:
        return [finding(NET_NICS, "host", WARN,
                        f"multi-node training over {fastest:g} Gbit/s Ethernet without RDMA: gradient exchange will dominate each step",
                        measured=listing, expected=f">= {MULTI_NODE_MIN_GBIT:g} Gbit/s per node, or InfiniBand/RoCE",
                        source=MULTI_NODE_SOURCE,
                        remedy="ask for instances with InfiniBand/RoCE or 100+ GbE; measure with `gpuvet net serve` / `gpuvet net test HOST`")]
    hint = "" if speeds else " (virtual NICs do not report a speed: measure with `gpuvet net serve` / `gpuvet net test HOST`)"
    if not ctx.options.get("multi_node"):  # one machine: nothing to hold the links against
        return [finding(NET_NICS, "host", MEASURED, f"{listing}{hint}", measured=listing)]
    if fastest is None and not _active_rdma(host):
        # A speed nobody reported is not a fast one: measured, never a pass for multi-node training.
        return [finding(NET_NICS, "host", MEASURED, f"{listing}{hint}: not judged for multi-node training until measured",
                        measured=listing, expected=f">= {MULTI_NODE_MIN_GBIT:g} Gbit/s per node, or InfiniBand/RoCE",
                        source=MULTI_NODE_SOURCE,
                        remedy="measure between two nodes: `gpuvet net serve` on one, `gpuvet net test HOST` on the other")]
    return [finding(NET_NICS, "host", PASS, f"{listing}{hint}", measured=listing,
                    expected=f">= {MULTI_NODE_MIN_GBIT:g} Gbit/s per node, or InfiniBand/RoCE", source=MULTI_NODE_SOURCE)]


def _describe_port(port: RdmaPort) -> str:
    rate = f"{port.rate_gbps:g} Gb/s" if port.rate_gbps else "rate ?"
    return f"{port.device} port {port.port} {port.state or '?'} {rate} {port.link_layer or ''}".strip()


def _rdma(ctx: Context) -> list[Finding]:
    host = ctx.machine.host
    if host is None or host.rdma is None:  # not read: captures and older records do not have it
        return []
    multi_node = bool(ctx.options.get("multi_node"))
    remedy = ("`ibstat` / `ibv_devinfo` show the ports; NCCL_DEBUG=INFO prints NET/IB when NCCL uses them "
              "(NET/Socket when it falls back to TCP)")
    if not host.rdma:
        if multi_node:
            return [finding(NET_RDMA, "host", WARN, "no RDMA device (InfiniBand/RoCE): multi-node all-reduce runs over TCP sockets",
                            measured="no /sys/class/infiniband devices", expected="InfiniBand or RoCE ports, ACTIVE",
                            source=MULTI_NODE_SOURCE, remedy=remedy)]
        scope = "this multi-GPU machine" if len(ctx.machine.gpus) > 1 else "one machine"
        return [finding(NET_RDMA, "host", SKIP, f"no RDMA device (InfiniBand/RoCE): not needed on {scope}; "
                                                   "it matters for multi-node training (judge with the multi-node option)")]
    listing = ", ".join(_describe_port(p) for p in host.rdma)
    active = _active_rdma(host)
    if not active and multi_node:
        return [finding(NET_RDMA, "host", WARN, f"RDMA ports present but none ACTIVE: {listing}",
                        measured=listing, expected="at least one ACTIVE port (phys_state LinkUp)",
                        source=MULTI_NODE_SOURCE, remedy=remedy)]
    if not active:  # not multi-node: nothing needs them
        return [finding(NET_RDMA, "host", MEASURED, f"RDMA ports present but none ACTIVE: {listing}; it matters for "
                        "multi-node training (judge with the multi-node option)", measured=listing)]
    return [finding(NET_RDMA, "host", PASS, f"{len(active)} of {len(host.rdma)} RDMA ports ACTIVE: {listing}", measured=listing,
                    expected="at least one ACTIVE port (phys_state LinkUp)" + (" for multi-node training" if multi_node else ""),
                    source="/sys/class/infiniband/*/ports/*/state and phys_state")]


def _node_to_node(ctx: Context) -> list[Finding]:
    subjects = list(dict.fromkeys(m.subject for m in ctx.measurements
                                  if m.subject.startswith("net:") and m.name in ("net.tcp_throughput", "net.tcp_latency", "bench.net")))
    return [_one_peer(ctx, subject) for subject in subjects]


def _one_peer(ctx: Context, subject: str) -> Finding:
    throughput = one(ctx, "net.tcp_throughput", subject)
    latency = one(ctx, "net.tcp_latency", subject)
    if throughput is None and latency is None:
        return _not_measured(ctx, "net", NET_NODE_TO_NODE, subject)
    peer = subject.removeprefix("net:")
    parts, problems, expected, sources = [], [], [], []
    if latency:
        parts.append(f"round trip {latency.value:.0f} us median (p99 {latency.details.get('p99_us')} us)")
        expected.append(f"round trip under {NODE_LATENCY_WARN_US:.0f} us in one zone")
        sources.append(NODE_LATENCY_SOURCE)
        if latency.value >= NODE_LATENCY_WARN_US:
            problems.append("high latency: another zone, a VPN or an overlay network between the nodes")
    if throughput:
        streams = throughput.details.get("streams") or 1
        route, link = _route_link(ctx.machine.host, throughput.details)
        parts.append(f"{throughput.value:.1f} Gbit/s, {streams} stream{'s' if streams > 1 else ''} "
                     f"({throughput.details.get('engine')}) {route}")
        if link:
            name, gbit = link
            expected.append(f">= {NODE_LINK_SHARE_WARN:.0%} of {name}'s {gbit:g} Gbit/s link ({NODE_LINK_SHARE_WARN * gbit:g} Gbit/s)")
            sources.append(NODE_LINK_SOURCE)
            if throughput.value < NODE_LINK_SHARE_WARN * gbit:
                problems.append(f"{throughput.value / gbit:.0%} of the {gbit:g} Gbit/s link of {name}")
        if ctx.options.get("multi_node") and throughput.value < MULTI_NODE_MIN_GBIT and not _active_rdma(ctx.machine.host or Host()):
            problems.append("too slow for multi-node training without RDMA")
            expected.append(f">= {MULTI_NODE_MIN_GBIT:g} Gbit/s or RDMA for multi-node training")
            sources.append(MULTI_NODE_SOURCE)
    else:
        parts.append(f"throughput not measured: {_note_reason(ctx, subject)}")
    text = "; ".join(parts)
    common = {"measured": text, "expected": "; ".join(expected) or None, "source": "; ".join(sources) or None}
    if problems:
        return finding(NET_NODE_TO_NODE, subject, WARN, f"to {peer}: {text}: {'; '.join(problems)}", **common,
                       remedy=f"iperf3 -c {peer} -P 8 (several streams); run `gpuvet net test` from the other machine too "
                              "(its link may be the slower one); check MTU (`ip link`) and that both nodes sit in one "
                              "zone / placement group")
    if not expected or _over_loopback(throughput):
        # Both ends on this machine (a test to itself over lo), or no figure with an expectation:
        # no network link was judged.
        return finding(NET_NODE_TO_NODE, subject, MEASURED, f"to {peer}: {text}", **common)
    return finding(NET_NODE_TO_NODE, subject, PASS, f"to {peer}: {text}", **common)


def _over_loopback(throughput: Measurement | None) -> bool:
    return throughput is not None and throughput.details.get("interface") == "lo"


def _note_reason(ctx: Context, subject: str) -> str:
    note = next(iter(measured(ctx, "bench.net", subject)), None)
    return note.details.get("reason", "no reason given") if note else "no figure"


def _route_link(host: Host | None, details: dict) -> tuple[str, tuple[str, float] | None]:
    """Words on the interface the test's traffic left through, and (name, Gbit/s) of its link when
    known. Records without the route (older ones) fall back to this machine's fastest link."""
    interface = details.get("interface")
    nics = {n.name: n for n in (host.nics or [])} if host else {}
    if interface is None:
        links = [(n.speed_mbps, n.name) for n in nics.values() if not n.virtual and n.speed_mbps and n.operstate == "up"]
        if not links:
            return "(route not recorded; no NIC reports a link speed)", None
        speed, name = max(links, key=lambda link: link[0])
        return f"(route not recorded; compared with the fastest link, {name})", (name, speed / 1000)
    via = f"through {interface}" + (f" from {details['source_address']}" if details.get("source_address") else "")
    nic = nics.get(interface)
    if interface == "lo" or (nic is not None and nic.name == "lo"):
        return f"{via}: both ends on this machine, no network link measured", None
    if nic is None:
        return f"{via} (not among the interfaces read: no link speed)", None
    if nic.speed_mbps and nic.operstate != "down":
        return f"{via} ({nic.speed_mbps / 1000:g} Gbit/s link)", (nic.name, nic.speed_mbps / 1000)
    why = "a virtual NIC: the provider's shaping sets its rate" if nic.virtual or not nic.speed_mbps else f"link {nic.operstate}"
    return f"{via} (no link speed reported: {why})", None
