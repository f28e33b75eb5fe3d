"""Captures taken elsewhere -> one machine's facts.

A user may hold an `nvidia-smi -q -x` sent by a provider, a `topo -m` pasted in a chat, an
`lspci -vv` of the same box, or a whole capture bundle. The kind of each file is recognised from
its content (never its name), and several files of one machine merge into one `Machine`.
"""

from __future__ import annotations

import codecs
import dataclasses
import re
import sys
from dataclasses import dataclass, field
from datetime import datetime

from ..facts import ECC_READ_FAILED, CaptureEntry, Driver, Gpu, KernelLog, Machine, PcieLink, Topology
from ..untrusted_text import clean_document
from . import failed_reads, kernel_log, lspci, nvlink_errors, nvlink_status, proc_version, smi_csv, smi_series, smi_table, smi_text, smi_xml, topo
from . import values as v
from .bounded_read import MAX_CAPTURE_BYTES, check_gpu_count, check_size, read_bounded
from .errors import CaptureError

# nvidia-smi prints these instead of a report when it cannot talk to the driver.
_SMI_ERRORS = (
    (re.compile(r"Failed to initialize NVML: Driver/library version mismatch", re.I),
     "the NVIDIA driver was upgraded without reloading its kernel module (reboot, or reload the nvidia modules)"),
    (re.compile(r"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver", re.I),
     "no NVIDIA driver was loaded on that machine"),
    (re.compile(r"Failed to initialize NVML", re.I), "NVML could not start on that machine"),
    (re.compile(r"^No devices were found", re.I | re.M), "that machine showed no NVIDIA GPU"),
    (re.compile(r"^ERROR: .*", re.M), "nvidia-smi refused the command"),
)

KINDS = ("nvidia-smi -q -x, nvidia-smi -q, nvidia-smi (table), --query-gpu CSV, topo -m, nvlink -s, nvlink -e, lspci -vv, "
         "/proc/driver/nvidia/version, a kernel log (dmesg, journalctl -k, syslog), a capture bundle, or a gpuvet run record")


@dataclass
class Capture:
    """What one capture (or one section of a bundle) says."""

    path: str
    kind: str
    phase: str = ""  # "idle" or "load" for bundle sections; "" when unknown
    driver: Driver | None = None
    gpus: list[Gpu] = field(default_factory=list)
    topology: Topology | None = None
    nvlinks: list[nvlink_status.NvlinkStatus] = field(default_factory=list)
    nvlink_errors: list[nvlink_errors.NvlinkErrors] = field(default_factory=list)
    pci_links: list[tuple[str, PcieLink]] = field(default_factory=list)
    pci_drivers: dict[str, str] = field(default_factory=dict)  # bus id -> kernel driver
    pci_names: dict[str, str] = field(default_factory=dict)  # bus id -> lspci device text
    kernel_module_version: str | None = None
    kernel_log: KernelLog | None = None  # dmesg, journalctl -k, syslog, /dev/kmsg text
    attached: int | None = None  # GPUs on the machine by the report's header (more than `gpus` with `-i N`)
    timestamp: datetime | None = None  # when nvidia-smi wrote the report ("Timestamp" / <timestamp>)
    note: str | None = None
    # A monitoring loop (`--query-gpu ... -l 5`, dmon): GPU index -> its samples, oldest first.
    series: dict[int, list[dict]] = field(default_factory=dict)


def decode(data: bytes, path: str) -> str:
    """Text of a capture file; UTF-16 with a BOM is what Windows PowerShell writes with `>`."""
    if not data.strip():
        raise CaptureError(f"{path}: the file is empty; expected {KINDS}")
    for bom, codec in ((codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16")):
        if data.startswith(bom):
            return clean_document(data.decode(codec, errors="replace"))
    if b"\x00" in data[:4096]:
        raise CaptureError(f"{path}: this is a binary file, not a text capture; expected {KINDS}")
    # Escape sequences and control characters go here, once, before a parser copies any text
    # (a GPU name, a legend line) into the facts a renderer shows.
    return clean_document(data.decode("utf-8", errors="replace"))


STDIN = "-"  # `ssh host nvidia-smi -q -x | gpuvet inspect -`
STDIN_NAME = "stdin"  # how messages and the record name a capture read from stdin


def read_captures(path: str) -> list[Capture]:
    """Every capture in the file at `path` ("-": standard input); a bundle holds several."""
    if path == STDIN:
        path = STDIN_NAME
        if _stdin_fd() is not None:
            data = read_bounded(path, fd=_stdin_fd())
        else:
            data = sys.stdin.buffer.read(MAX_CAPTURE_BYTES + 1)
            check_size(len(data), path)
    else:
        data = read_bounded(path)
    # A capture copied through Windows (or saved by PowerShell) has CRLF line ends: the kind and
    # a bundle's banners are found from the content, whatever ends its lines.
    text = decode(data, path).replace("\r\n", "\n")
    if _is_bundle(text):
        return _bundle_captures(text, path)
    return [parse_capture(text, path)]


def _stdin_fd() -> int | None:
    """The descriptor of stdin, or None when it has none (an in-memory stream in tests, embedding)."""
    try:
        return sys.stdin.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError
        return None


def detect_kind(text: str) -> str | None:
    head = text.lstrip()[:4096]
    if smi_xml.looks_like_smi_xml(head):
        return "smi-xml"
    if smi_text.looks_like_smi_text(head):
        return "smi-text"
    if smi_csv.looks_like_smi_csv(text):
        return "smi-csv"
    if smi_table.looks_like_smi_table(text):
        return "smi-table"
    if smi_table.looks_like_dmon(text):
        return "smi-dmon"
    if topo.looks_like_topo(text):
        return "topo"
    if nvlink_errors.looks_like_nvlink_errors(text):  # before nvlink -s: its Link lines look alike
        return "nvlink-errors"
    if nvlink_status.looks_like_nvlink_status(text):
        return "nvlink-status"
    if lspci.looks_like_lspci(text):
        return "lspci"
    if proc_version.looks_like_proc_version(text):
        return "proc-version"
    if kernel_log.looks_like_kernel_log(text):  # last: the loosest test (a time prefix on most lines)
        return "kernel-log"
    return None


def parse_capture(text: str, path: str, phase: str = "") -> Capture:
    kind = detect_kind(text)
    if kind is None:
        _raise_for_error_message(text, path)
        first = next((line.strip() for line in text.splitlines() if line.strip()), "")
        raise CaptureError(f"{path}: not a capture gpuvet knows (starts with {first[:60]!r}); expected {KINDS}")
    capture = Capture(path=path, kind=kind, phase=phase)
    try:
        _fill(capture, text)
    except CaptureError as err:
        raise CaptureError(f"{path}: {err}") from None
    return capture


_SMI_TEXT_GPU = re.compile(r"^GPU [0-9A-Fa-f]+:[0-9A-Fa-f]+:", re.M)


def _fill(capture: Capture, text: str) -> None:
    kind = capture.kind
    # Counted before parsing: parsing thousands of GPUs (then judging them) is the unbounded part.
    if kind == "smi-xml":
        check_gpu_count(text.count("<gpu id="), f"this {kind} capture")
    elif kind == "smi-text":
        check_gpu_count(len(_SMI_TEXT_GPU.findall(text)), f"this {kind} capture")
    if kind == "smi-xml":
        text = smi_xml.without_dtd(text)  # `nvidia-smi -q -x --dtd`: KBs of DTD before the data
        capture.driver, capture.gpus = smi_xml.parse_smi_xml(text)
        capture.attached = smi_xml.attached_gpus(text)
        capture.note = _fewer_than_attached(capture.attached, len(capture.gpus))
        capture.timestamp = _timestamp(text)
        _mark_failed_reads(capture.gpus, failed_reads.in_xml(text))
    elif kind == "smi-text":
        capture.driver, capture.gpus = smi_text.parse_smi_text(text)
        capture.attached = smi_text.attached_gpus(text)
        capture.note = _fewer_than_attached(capture.attached, len(capture.gpus))
        capture.timestamp = _timestamp(text)
        _mark_failed_reads(capture.gpus, failed_reads.in_text(text))
    elif kind == "smi-csv":
        capture.driver, capture.gpus, capture.series, capture.note = smi_csv.parse_smi_csv_loop(text)
        if capture.series:
            capture.note = _loop_note("--query-gpu loop", capture.series, capture.note)
            _watching_a_job(capture.gpus, "--query-gpu loop")
    elif kind == "smi-table":
        capture.driver, capture.gpus = smi_table.parse_smi_table(text)
    elif kind == "smi-dmon":
        samples = smi_table.parse_dmon(text)
        capture.gpus = _gpus_from_dmon(samples)
        capture.series = smi_table.dmon_series(samples)
        _watching_a_job(capture.gpus, "nvidia-smi dmon")
        capture.note = _loop_note("nvidia-smi dmon", capture.series,
                                  "only power, temperature, clocks and utilization; each GPU's last sample gives its facts")
    elif kind == "topo":
        capture.topology = topo.parse_topo(text, source=capture.path)
    elif kind == "nvlink-status":
        capture.nvlinks = nvlink_status.parse_nvlink_status(text)
    elif kind == "nvlink-errors":
        capture.nvlink_errors = nvlink_errors.parse_nvlink_errors(text)
    elif kind == "lspci":
        devices = lspci.parse_lspci(text)
        capture.pci_links = lspci.gpu_link_readings(devices)
        for dev in devices:
            # bus_id and vendor_device are None only on the headless device a cut capture starts with
            if dev.is_nvidia_gpu and dev.bus_id is not None and dev.vendor_device is not None:
                capture.pci_names[dev.bus_id] = dev.vendor_device
                if dev.kernel_driver:
                    capture.pci_drivers[dev.bus_id] = dev.kernel_driver
        if not capture.pci_names:
            capture.note = "no NVIDIA GPU in this lspci output"
    elif kind == "proc-version":
        capture.kernel_module_version = proc_version.parse_kernel_module_version(text)
    elif kind == "kernel-log":
        capture.kernel_log = kernel_log.parse_kernel_log(text, capture.path)
        capture.note = f"kernel log: {capture.kernel_log.lines} lines, {len(capture.kernel_log.events)} NVIDIA event line(s), judged by gpu.xid"
    check_gpu_count(len(capture.gpus), f"this {kind} capture")
    if not capture.gpus and kind in ("smi-xml", "smi-text", "smi-csv", "smi-table"):
        raise CaptureError(f"the {kind} capture lists no GPU")


def _mark_failed_reads(gpus: list[Gpu], failed: dict[str, list[str]]) -> None:
    """nvidia-smi's "Unknown Error" in a memory-health field is a read that failed (a GPU in
    trouble), not a zero: kept where gpu.ecc finds it, so it never passes."""
    for gpu in gpus:
        fields = failed.get(gpu.pcie.bus_id or "")
        if fields:
            gpu.unavailable[ECC_READ_FAILED] = f"nvidia-smi printed \"{failed_reads.READ_FAILED}\" for {', '.join(fields)}"


_TIMESTAMP = re.compile(r"^\s*(?:<timestamp>|Timestamp\s*:\s*)(?P<when>\w{3} \w{3} +\d{1,2} \d\d:\d\d:\d\d \d{4})", re.M)


def _timestamp(text: str) -> datetime | None:
    m = _TIMESTAMP.search(text[:8192])
    if not m:
        return None
    try:
        return datetime.strptime(" ".join(m.group("when").split()), "%a %b %d %H:%M:%S %Y")
    except ValueError:
        return None


def _fewer_than_attached(attached: int | None, found: int) -> str | None:
    """`nvidia-smi -q -i N` (or an edited file) shows some of the machine's GPUs: say the rest went unjudged."""
    if attached is None or found >= attached:
        return None
    return (f"{attached} GPUs attached but {found} in this report (captured with `-i`, or part of the file removed): "
            f"the other {attached - found} are not in it; `nvidia-smi -q` without -i reports them all")


def _raise_for_error_message(text: str, path: str) -> None:
    for pattern, meaning in _SMI_ERRORS:
        m = pattern.search(text[:4096])
        if m:
            line = next(line for line in text.splitlines() if m.group(0) in line).strip()
            raise CaptureError(
                f"{path}: this capture is an error message, not a report: {line!r} ({meaning}); "
                f"fix that, then capture again (e.g. `nvidia-smi -q -x > gpu.xml`)"
            )


def _gpus_from_dmon(samples: list[dict]) -> list[Gpu]:
    last: dict[int, dict] = {}
    for sample in samples:
        if sample.get("gpu") is not None:
            last[int(sample["gpu"])] = sample
    gpus = []
    for index, sample in sorted(last.items()):
        gpu = Gpu(index=index)
        gpu.power.draw_w = sample.get("pwr")
        gpu.thermal.gpu_c = sample.get("gtemp")
        gpu.thermal.memory_c = sample.get("mtemp")
        gpu.clocks.sm_mhz = _int(sample.get("pclk"))
        gpu.clocks.memory_mhz = _int(sample.get("mclk"))
        gpu.utilization_pct = _int(sample.get("sm"))
        gpus.append(gpu)
    return gpus


def _watching_a_job(gpus: list[Gpu], what: str) -> None:
    """A monitoring loop is taken while a job runs, most often the user's own: its last sample's
    utilization and memory are that job, not a neighbour found before you start. They are judged
    as a time series (gpu.trend, as watch judges them), not by gpu.isolation."""
    for gpu in gpus:
        gpu.utilization_pct = gpu.memory_used_mib = None
        gpu.processes = None
        gpu.unavailable["processes"] = (f"this {what} watches a running job (yours, most often), not the GPU before you "
                                        "start; take `nvidia-smi -q -x` before the job to see who else is on it")


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


def _loop_note(what: str, series: dict[int, list[dict]], extra: str | None) -> str:
    """ "nvidia-smi dmon: 1 GPU, 5 samples each (...)" """
    counts = sorted({len(rows) for rows in series.values()})
    each = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    return f"{what}: {len(series)} GPU{'s' if len(series) != 1 else ''}, {each} samples each, judged as a time series by gpu.trend" \
        + (f"; {extra}" if extra else "")


def loop_series(captures: list[Capture]) -> list[dict]:
    """Each monitoring loop's samples per GPU, as run-record series ("capture.telemetry", plotted
    like a sustained load's): t is seconds from the first sample, or the sample's number when
    the capture has no times ("timed": false)."""
    out = []
    for c in captures:
        for index, samples in sorted(c.series.items()):
            timed = all(s["t"] is not None for s in samples)
            rows = [[s["t"] if timed else n] + [s[k] for k in smi_series.SAMPLE_FIELDS[1:]] for n, s in enumerate(samples)]
            out.append({"name": "capture.telemetry", "subject": f"gpu{index}", "source": c.path, "kind": c.kind,
                        "timed": timed, "interval_s": None, "columns": list(smi_series.SAMPLE_FIELDS), "rows": rows})
    return out


# -- capture bundles (nvidia_gpu_exporter's collect.sh: sections between '#####' banners) ----

_BANNER = re.compile(r"^#{20,}\n# (?P<title>[^\n]*)\n(?:# [^\n]*\n)*?#{20,}\n", re.M)


def _is_bundle(text: str) -> bool:
    return len(_BANNER.findall(text[:20000])) >= 2


def _bundle_captures(text: str, path: str) -> list[Capture]:
    matches = list(_BANNER.finditer(text))
    captures = []
    for i, m in enumerate(matches):
        title = m.group("title").strip()
        body = text[m.end() : matches[i + 1].start() if i + 1 < len(matches) else len(text)]
        phase = title.split("::", 1)[0].strip() if "::" in title else ""
        section = f"{path} [{title}]"
        if not body.strip():
            continue
        try:
            if detect_kind(body) is None:
                _raise_for_error_message(body, section)
                continue  # help texts, field lists, empty process tables
            captures.append(parse_capture(body, section, phase=phase if phase in ("idle", "load") else ""))
        except CaptureError as err:
            # One failed command (Windows `topo -m`) must not hide the rest of the bundle.
            captures.append(Capture(path=section, kind="error", note=str(err).removeprefix(f"{section}: ")))
    if not any(c.kind != "error" for c in captures):
        raise CaptureError(f"{path}: a capture bundle with no section gpuvet can read")
    return captures


# -- merging -----------------------------------------------------------------------------------

# Full reports first: they carry the most facts about each GPU.
_RANK = {"smi-xml": 0, "smi-text": 1, "smi-csv": 2, "smi-table": 3, "smi-dmon": 4}
_BUSY_PCT = 50  # a GPU this busy, with work on it, shows its PCIe link as it runs under load


def _base_order(report: Capture) -> tuple:
    """Which report gives each GPU's facts. The judgement must not depend on the order the files
    were given, so: an idle snapshot first (a bundle's "idle" section); then the one with every
    GPU (not an `-i N` one); a full report (-q, -q -x) before a table or CSV; among those, the idler
    one: the fewest processes, the least memory used, the least busy, since isolation is about
    what runs before you start; then the fullest form, the earliest timestamp, and the path, so
    ties never fall back on argument order. The other reports only add PCIe readings, marked
    "under load" when taken while the GPU worked (what gpu.pcie_link reads the link from)."""
    return (report.phase == "load", -len(report.gpus), _RANK[report.kind] > _RANK["smi-text"], _occupancy(report),
            _RANK[report.kind], report.timestamp or datetime.max, report.path)


def _occupancy(report: Capture) -> tuple:
    """(0, processes, MiB used, % busy) summed over the GPUs; (1,) when the report lists no processes."""
    if any(g.processes is None for g in report.gpus):
        return (1,)
    return (0, sum(len(g.processes or []) for g in report.gpus), sum(g.memory_used_mib or 0 for g in report.gpus),
            sum(g.utilization_pct or 0 for g in report.gpus))


def _working(gpu: Gpu) -> bool:
    """Busy with real work (a process or a context's worth of memory), not just the driver waking it."""
    return (gpu.utilization_pct or 0) >= _BUSY_PCT and bool(gpu.processes or (gpu.memory_used_mib or 0) >= 1024)


def merge(captures: list[Capture]) -> Machine:
    """One machine from several captures of it (match GPUs by bus id, then UUID, then index).

    Raises CaptureError when two reports name different GPUs or drivers (two machines), or when an
    lspci output without an NVIDIA GPU is all there is to judge.
    """
    _check_lspci_has_gpus(captures)
    machine = Machine(source="capture")
    machine.captures = [_entry(c) for c in captures]
    reports = sorted((c for c in captures if c.kind in _RANK), key=_base_order)
    if reports:
        base = reports[0]
        for other in reports[1:]:
            _refuse_other_machine(base, other)
        machine.gpus = base.gpus
        machine.driver = base.driver or Driver()
        for other in reports[1:]:
            _merge_report(machine, other)
    for c in captures:
        if c.topology is not None and machine.topology is None and _topology_fits(machine, c.path, c.topology, reports):
            machine.topology = c.topology
        if c.kernel_module_version:
            machine.driver.kernel_module_version = c.kernel_module_version
            _note_stale_module(machine, c)
        if c.nvlinks:
            _merge_nvlinks(machine, c.nvlinks)
        if c.nvlink_errors:
            _merge_nvlink_errors(machine, c.nvlink_errors)
        if c.pci_names:
            _merge_lspci(machine, c)
        if c.kernel_log is not None:
            _merge_kernel_log(machine, c.kernel_log)
    if machine.topology is not None:
        _ensure_topology_gpus(machine, machine.topology)
    if not machine.gpus:
        machine.gpu_error = "the captures hold no per-GPU facts"
    return machine


def _entry(c: Capture, now: datetime | None = None) -> CaptureEntry:
    entry = CaptureEntry(path=c.path, kind=c.kind)
    taken = _taken_words(c.timestamp, now or datetime.now())
    if c.note or taken:
        entry["note"] = "; ".join(part for part in (taken, c.note) if part)
    if c.timestamp is not None:
        entry["taken_at"] = c.timestamp.isoformat(timespec="seconds")
    if c.attached:  # "Attached GPUs: 4" of a `-i 0` report: the machine has more than it lists
        entry["attached"] = c.attached
    return entry


def _taken_words(taken: datetime | None, now: datetime) -> str:
    """ "taken Mon Jul  8 08:11:21 2024 by its own timestamp, 2.4 years before this inspection": the
    record is dated when it was inspected; a provider's report may be months older than that."""
    if taken is None:
        return ""
    days = (now - taken).total_seconds() / 86400  # both the machines' local time: within a day
    if days < -1:
        age = "dated after this inspection: check that machine's clock"
    elif days < 2:
        age = "within a day of this inspection"
    elif days < 60:
        age = f"{days:.0f} days before this inspection"
    else:
        age = f"{days / 365.25:.1f} years before this inspection" if days >= 365 else f"{days / 30.4:.0f} months before this inspection"
    return f"taken {taken.strftime('%a %b %d %H:%M:%S %Y')} by its own timestamp, {age}"


def _find(machine: Machine, gpu: Gpu) -> Gpu | None:
    for other in machine.gpus:
        if gpu.pcie.bus_id and other.pcie.bus_id == gpu.pcie.bus_id:
            return other
        if gpu.uuid and other.uuid == gpu.uuid and not gpu.uuid.startswith("GPU-00000000-0000"):
            return other
    if not gpu.pcie.bus_id:
        return next((o for o in machine.gpus if o.index == gpu.index), None)
    return None


def _merge_report(machine: Machine, report: Capture) -> None:
    """A second report of the same GPUs: its PCIe readings are added (a load capture's matter
    most), and every fact the first report lacks is taken from it: `nvidia-smi -q -d POWER` and
    `-q -d PERFORMANCE` print disjoint sections of one machine, whatever order they are given in."""
    if machine.driver.version is None and report.driver:
        machine.driver = report.driver
    unmatched, loaded, filled = [], False, 0
    for gpu in report.gpus:
        target = _find(machine, gpu)
        if target is None:
            unmatched.append(f"gpu{gpu.index}")
            continue
        for reading in gpu.pcie.readings:
            if report.phase == "load" or _working(gpu):
                reading.under_load = loaded = True
            target.pcie.readings.append(reading)
        # What ran on the GPU comes from the idler report only: a report taken under load fills
        # no occupancy (isolation is about what runs before you start).
        busy = report.phase == "load" or _working(gpu)
        filled += len(_fill_missing(target, gpu, skip=_OCCUPANCY if busy else ()))
    if report.gpus and len(unmatched) < len(report.gpus):
        under_load = " (taken under load)" if loaded else ""
        if filled:
            note = (f"another report of these GPUs: its PCIe link readings{under_load} and the facts the other report "
                    "lacks are used; where both give a fact, the idler report's is kept")
        else:
            note = (f"another report of these GPUs: only its PCIe link readings are used{under_load}; "
                    "isolation and the rest come from the idler one")
        _note(machine, report.path, note)
    if unmatched:
        _note(machine, report.path, f"{', '.join(unmatched)} here match no GPU of the other report: "
                                    "not used; is this capture from the same machine?")


_OCCUPANCY = ("processes", "utilization_pct", "memory_used_mib", "memory_reserved_mib")


def _fill_missing(target: object, source: object, prefix: str = "", skip: tuple[str, ...] = ()) -> list[str]:
    """Copy into `target` each field of `source` that `target` lacks (None, or an empty list),
    nested facts field by field; returns the dotted names filled. PCIe readings are added by the
    caller, not copied."""
    filled: list[str] = []
    for f in dataclasses.fields(target):  # type: ignore[arg-type]
        mine, theirs = getattr(target, f.name), getattr(source, f.name)
        name = f"{prefix}{f.name}"
        if theirs is None or f.name in ("readings", "unavailable", "index") or name in skip:
            continue
        if dataclasses.is_dataclass(mine) and dataclasses.is_dataclass(theirs):
            filled += _fill_missing(mine, theirs, f"{name}.", skip)
        elif mine is None or (mine == [] and theirs != []):
            setattr(target, f.name, theirs)
            filled.append(name)
    if isinstance(target, Gpu) and isinstance(source, Gpu):
        for key in filled:
            target.unavailable.pop(key, None)  # "not in the capture" no longer holds
        for key, why in source.unavailable.items():
            target.unavailable.setdefault(key, why)
    return filled


def _note(machine: Machine, path: str, note: str) -> None:
    """Shown under the capture's line in the terminal and kept in the record's machine.captures."""
    for entry in machine.captures:
        if entry["path"] == path:
            entry["note"] = f"{entry['note']}; {note}" if entry.get("note") else note


def _refuse_other_machine(base: Capture, other: Capture) -> None:
    """Two nvidia-smi reports whose GPUs or drivers disagree are two machines (or one machine
    before and after a change): merging them would judge a machine that does not exist."""
    differences = []
    if base.driver and other.driver and base.driver.version and other.driver.version \
            and base.driver.version != other.driver.version:
        differences.append("driver")
    by_bus = {g.pcie.bus_id: g for g in base.gpus if g.pcie.bus_id}
    by_uuid = {g.uuid: g for g in base.gpus if _real_uuid(g.uuid)}
    for gpu in other.gpus:
        match = by_bus.get(gpu.pcie.bus_id) if gpu.pcie.bus_id else None
        if match is None and _real_uuid(gpu.uuid):
            match = by_uuid.get(gpu.uuid)
        if match is None and not by_bus:
            match = next((g for g in base.gpus if g.index == gpu.index), None)
        if match is not None and _real_uuid(gpu.uuid) and _real_uuid(match.uuid) and gpu.uuid != match.uuid:
            differences.append("GPU UUIDs")
        elif match is not None and not _same_name(gpu.name, match.name):
            differences.append("GPU models")
    # Disjoint bus ids: another machine. Some shared: one report may hold a few of the GPUs (`-i`).
    other_buses = {g.pcie.bus_id for g in other.gpus if g.pcie.bus_id}
    if by_bus and other_buses and not other_buses & by_bus.keys():
        differences.append("PCI bus ids")
    if differences:
        raise CaptureError(
            f"{base.path}: {_describe(base)}; {other.path}: {_describe(other)}: not one machine "
            f"(different {', '.join(dict.fromkeys(differences))}); inspect them one at a time"
        )


def _real_uuid(uuid: str | None) -> bool:
    return bool(uuid and not uuid.startswith("GPU-00000000-0000"))  # zeroed: redacted before sharing


def _same_name(a: str | None, b: str | None) -> bool:
    """Equal, or one is the other cut by the default table ("NVIDIA GeForce RTX 2080 ...")."""
    if not a or not b or a == b:
        return True
    short, full = sorted((a, b), key=len)
    return short.endswith("...") and full.startswith(short[:-3].rstrip())


def _describe(report: Capture) -> str:
    """ "1 x NVIDIA GeForce RTX 3090 driver 590.44.01" """
    names: dict[str, int] = {}
    for gpu in report.gpus:
        name = gpu.name or "unnamed GPU"
        names[name] = names.get(name, 0) + 1
    text = ", ".join(f"{count} x {name}" for name, count in names.items())
    version = report.driver.version if report.driver else None
    return f"{text} driver {version}" if version else text


def _topology_fits(machine: Machine, path: str, topology: Topology, reports: list[Capture]) -> bool:
    """`topo -m` shows every GPU of its machine, so its GPU count must be the machine's: the
    reports' "Attached GPUs" (a `-i N` report still counts them all), else the GPUs they list.
    Only the count is compared: a matrix names no GPU model, so a topology of another machine
    with as many GPUs (NV12 links pasted beside an H100 report) cannot be told apart here."""
    shown = len(topology.gpus)
    reported = max((r.attached or len(r.gpus) for r in reports), default=0)
    if reported and shown != reported:
        _note(machine, path, f"this topo matrix shows {shown} GPUs, the nvidia-smi report {reported}: "
                             "not used; is this capture from the same machine?")
        return False
    return True


def _note_stale_module(machine: Machine, capture: Capture) -> None:
    """/proc/driver/nvidia/version names the kernel module loaded; nvidia-smi the driver it talked
    to. Different versions: the captures are from different times or machines, or the driver was
    upgraded without reloading its module (CUDA then fails with "driver/library version mismatch")."""
    module, driver = capture.kernel_module_version, machine.driver.version
    if module and driver and module != driver:
        _note(machine, capture.path, f"kernel module {module} loaded, but the nvidia-smi report says driver {driver}: "
                                     "captured at different times or on another machine, or the driver was upgraded "
                                     "without reloading its module (reboot, or reload the nvidia modules)")


def _check_lspci_has_gpus(captures: list[Capture]) -> None:
    """lspci without an NVIDIA GPU judges nothing: refuse it alone, note it beside other captures."""
    for c in captures:
        if c.kind != "lspci" or c.pci_names:
            continue
        if not any(o.gpus or o.topology or o.nvlinks or o.nvlink_errors or o.pci_names for o in captures):
            raise CaptureError(
                f"{c.path}: lspci output with no NVIDIA GPU (vendor 10de, display class); give the GPU machine's "
                "`sudo lspci -vvv -d 10de:` output, or its `nvidia-smi -q -x` with it"
            )


def _merge_kernel_log(machine: Machine, log: KernelLog) -> None:
    """Several kernel logs of one machine (dmesg and an older syslog) are read as one; their events
    are matched to the GPUs by PCI bus id when gpu.xid judges them."""
    have = machine.kernel_log
    if have is None:
        machine.kernel_log = log
        return
    have.source = f"{have.source} + {log.source}"
    have.lines += log.lines
    have.events += log.events
    have.gpu_buses = list(dict.fromkeys(have.gpu_buses + log.gpu_buses))
    have.since_boot = bool(have.since_boot or log.since_boot)
    have.first, have.last = have.first or log.first, log.last or have.last


def _nvlink_target(machine: Machine, index: int, name: str | None, uuid: str | None) -> Gpu:
    """The GPU an `nvlink -s`/`-e` block is about (by UUID, else index); a new one if none is known."""
    target = _find(machine, Gpu(index=index, uuid=uuid))
    if target is None:
        target = Gpu(index=index, name=name, uuid=uuid)
        machine.gpus.append(target)
    return target


def _merge_nvlinks(machine: Machine, statuses: list[nvlink_status.NvlinkStatus]) -> None:
    for status in statuses:
        target = _nvlink_target(machine, status.index, status.name, status.uuid)
        # "all links are inactive" means no link is up; "does not support Nvlink" or "not
        # supported ... in MIG mode" means the links were not read at all.
        if status.links or "inactive" in (status.note or "").lower():
            target.nvlinks = list(status.links)
        if status.note:
            target.unavailable["nvlinks"] = status.note
    machine.gpus.sort(key=lambda g: g.index)


def _merge_nvlink_errors(machine: Machine, blocks: list[nvlink_errors.NvlinkErrors]) -> None:
    for block in blocks:
        target = _nvlink_target(machine, block.index, block.name, block.uuid)
        totals, by_link = nvlink_errors.error_counts(block)
        if totals:  # links read, and some of their counters count faults
            target.nvlink_errors, target.nvlink_error_links = totals, by_link
        if block.note:
            target.unavailable["nvlink_errors"] = block.note
    machine.gpus.sort(key=lambda g: g.index)


def _merge_lspci(machine: Machine, capture: Capture) -> None:
    links = dict(capture.pci_links)
    reported = [g for g in machine.gpus if g.name]
    matched = 0
    for bus, name in capture.pci_names.items():
        target = next((g for g in machine.gpus if g.pcie.bus_id == bus), None)
        matched += target is not None
        if target is None:
            # Known only from lspci: its name there is pci.ids', not the driver's; gpu.model judges
            # --expect against it ('[A10]') and the rest of the rules treat the GPU as unnamed.
            target = Gpu(index=len(machine.gpus), name=None)
            target.pcie.bus_id = bus
            target.unavailable["name"] = f"only lspci saw this GPU: {name}"
            machine.gpus.append(target)
        if bus in links:
            target.pcie.readings.append(links[bus])
        if bus in capture.pci_drivers:
            target.pcie.kernel_driver = capture.pci_drivers[bus]
    if reported and not matched:
        for entry in machine.captures:
            if entry["path"] == capture.path:
                entry["note"] = "no GPU here has a bus id of the nvidia-smi report: is this capture from the same machine?"


def _ensure_topology_gpus(machine: Machine, topology: Topology) -> None:
    """A topo matrix alone still names the GPUs; give each one an entry to judge."""
    known = {g.index for g in machine.gpus}
    for label in topology.gpus:
        index = v.integer(label[3:])
        if index is not None and index not in known:
            machine.gpus.append(Gpu(index=index))
    machine.gpus.sort(key=lambda g: g.index)
