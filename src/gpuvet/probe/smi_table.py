"""The default `nvidia-smi` table, and `nvidia-smi dmon` samples.

The table is what people paste most often, so gpuvet reads it, but it holds less than the other
forms: long names are cut ("NVIDIA GeForce RTX 2080 ..."), the power cap shown is the enforced
limit, and the layout changed over the years (narrow before ~530, wide after; "Driver-Model"
instead of "Persistence-M" on Windows; "KMD Version" from the 610 drivers on). Each cell is read
by the column label above it, not by its position, so these layouts all work.
"""

from __future__ import annotations

import re

from ..facts import Driver, Gpu, GpuProcess, MigDevice
from ..text_patterns import PCI_BUS_ID
from . import smi_series
from . import values as v
from ..untrusted_text import quote
from .bounded_read import check_gpu_index
from .errors import CaptureError
from .smi_common import fan_speeds

_HEADER = re.compile(
    r"NVIDIA-SMI\s+\S+\s+(?:Driver|KMD) Version:\s*(?P<driver>\S+)"
    r"(?:\s+CUDA(?: UMD)? Version:\s*(?P<cuda>\S+))?"
)
_TIME = re.compile(r"\d\d:\d\d:\d\d")  # the timestamp line nvidia-smi prints above the table

# What the table abbreviates -> the names nvidia-smi -q and --query-gpu use.
_COMPUTE_MODES = {
    "default": "Default",
    "e. process": "Exclusive_Process",
    "e. thread": "Exclusive_Thread",
    "prohibited": "Prohibited",
}
_DRIVER_MODELS = {"WDDM", "TCC", "MCDM"}
TRUNCATED_NAME = "truncated in the default nvidia-smi table"

# The table's regular expressions match only a row's fixed start; what follows (a name, which may
# hold spaces) is cut with string operations, so a run of spaces costs linear time.
_NAME_START = re.compile(r"(?P<index>\d+)\s+")
_POWER_CELL = re.compile(r"\s*(?P<fan>\S+)\s+(?P<temp>\S+)\s+(?P<perf>\S+)\s+(?P<draw>\S+)\s*/\s*(?P<cap>\S+)\s*")
_PROCESS_START = re.compile(r"\|\s*(?P<gpu>\d+)\s+(?:(?P<gi>\S+)\s+(?P<ci>\S+)\s+)?(?P<pid>\d+)\s+(?P<type>[A-Z][A-Z+]*)\s")
_BUS_ID = re.compile(PCI_BUS_ID)


def looks_like_smi_table(text: str) -> bool:
    """True when the text starts with the default table (optionally after its timestamp line)."""
    lines = [line for line in text.splitlines() if line.strip()][:4]
    for position, line in enumerate(lines):
        if line.startswith("|") and _HEADER.search(line):
            return True
        is_timestamp = position == 0 and _TIME.search(line) and not line.startswith(("|", "#"))
        if not (line.startswith("+-") or is_timestamp):
            return False
    return False


def parse_smi_table(text: str) -> tuple[Driver, list[Gpu]]:
    lines = text.splitlines()
    found = next(((i, m) for i, line in enumerate(lines) if (m := _HEADER.search(line))), None)
    if found is None:
        first = next((line.strip() for line in lines if line.strip()), "")
        raise CaptureError(
            "expected the default nvidia-smi table with its '| NVIDIA-SMI ... Driver Version: ...' "
            f"header line, found {first[:80]!r}"
        )
    header_at, header = found
    driver = Driver(version=header.group("driver"), cuda_version=v.text(header.group("cuda")))

    labels, blocks, end = _gpu_table(lines, header_at + 1)
    gpus = [_gpu(labels, block, position) for position, block in enumerate(blocks)]
    rest = lines[end:]
    _add_mig_devices(rest, gpus)
    _add_processes(rest, gpus)
    _add_warnings(rest, gpus)
    return driver, gpus


# -- the GPU table ---------------------------------------------------------------------------

def _cells(line: str) -> list[str]:
    """The cells between the '|' of one table line."""
    body = line.strip()
    body = body[1:] if body.startswith("|") else body
    body = body[:-1] if body.endswith("|") else body
    return body.split("|")


def _gpu_table(lines: list[str], start: int) -> tuple[list[list[str]], list[list[str]], int]:
    """Column labels (one list per label row), the lines of each GPU, and where the table ends."""
    labels: list[list[str]] = []
    i = start
    while i < len(lines) and not lines[i].startswith("|="):
        if lines[i].startswith("|") and not lines[i].startswith("|-"):
            labels.append(_cells(lines[i]))
        i += 1
    blocks: list[list[str]] = []
    current: list[str] = []
    labels_end = i
    for i in range(labels_end + 1, len(lines)):
        line = lines[i]
        if line.startswith("|"):
            current.append(line)
            continue
        if current:
            blocks.append(current)
            current = []
        if not line.startswith("+"):  # a blank line (or anything else) ends the GPU table
            return labels, blocks, i
    if current or not blocks:
        # Every GPU's rows close with a '+---' border: text that ends inside a GPU, or before the
        # first one, was cut when it was copied.
        raise CaptureError(
            f"truncated nvidia-smi table: it stops inside the GPU table after {len(blocks)} complete "
            "GPU(s), without the closing '+---' border; capture it again with `nvidia-smi > smi.txt`"
        )
    return labels, blocks, len(lines)


def _gpu(labels: list[list[str]], block: list[str], position: int) -> Gpu:
    gpu = Gpu(index=position)
    for row, line in enumerate(block):
        for column, cell in enumerate(_cells(line)):
            label = labels[row][column] if row < len(labels) and column < len(labels[row]) else ""
            _read_cell(gpu, label, cell)
    return gpu


def _read_cell(gpu: Gpu, label: str, cell: str) -> None:
    if "Persistence-M" in label or "Driver-Model" in label or "TCC/WDDM" in label:
        _read_name_cell(gpu, cell)
    elif "Bus-Id" in label:
        gpu.pcie.bus_id = v.bus_id(cell)
    elif "Volatile Uncorr. ECC" in label:
        _read_ecc_cell(gpu, cell)
    elif "Pwr:Usage/Cap" in label:
        _read_power_cell(gpu, cell)
    elif "Memory-Usage" in label:
        used, _, total = cell.partition("/")
        gpu.memory_used_mib = _value(gpu, "memory_used_mib", used, v.mib)
        gpu.memory_total_mib = _value(gpu, "memory_total_mib", total, v.mib)
    elif "Compute M." in label:
        utilization, _, mode = cell.strip().partition(" ")
        gpu.utilization_pct = _value(gpu, "utilization_pct", utilization, v.integer)
        mode = mode.strip()
        gpu.compute_mode = _COMPUTE_MODES.get(mode.lower(), v.text(mode))
    elif "MIG M." in label:
        gpu.mig_enabled = v.flag(cell.strip().rstrip("*"))


def _read_name_cell(gpu: Gpu, cell: str) -> None:
    """ "  0  NVIDIA H100 80GB HBM3          On  " -> index, name, persistence (or driver model)."""
    body = cell.strip()
    m = _NAME_START.match(body)
    name_mode = body[m.end():].rsplit(None, 1) if m else []
    index = v.whole(m.group("index")) if m else None
    if index is None or len(name_mode) != 2:
        gpu.unavailable["name"] = f"unreadable in the default nvidia-smi table: {quote(body)}"
        return
    check_gpu_index(index, "this nvidia-smi table")
    gpu.index = index
    gpu.name, mode = v.cut(name_mode[0].rstrip()), name_mode[1]
    if gpu.name.endswith("..."):
        gpu.unavailable["name"] = TRUNCATED_NAME
    if mode.upper() in _DRIVER_MODELS:  # Windows shows the driver model in this place
        gpu.driver_model = mode.upper()
    else:
        gpu.persistence_mode = v.flag(mode)


def _read_ecc_cell(gpu: Gpu, cell: str) -> None:
    """A count when ECC is on, "Off" when it is off, "On" in MIG mode (counts are per instance)."""
    raw = cell.strip()
    count = v.whole(raw)
    if count is not None:
        gpu.ecc.enabled = True
        gpu.ecc.volatile_uncorrected = count
    elif raw.lower() in ("on", "off"):
        gpu.ecc.enabled = v.flag(raw)
    else:
        gpu.ecc.enabled = None
        gpu.unavailable["ecc.enabled"] = f"the default nvidia-smi table shows {quote(raw)} (ECC not supported)"


def _read_power_cell(gpu: Gpu, cell: str) -> None:
    m = _POWER_CELL.fullmatch(cell)
    if not m:
        gpu.unavailable["power.draw_w"] = f"unreadable in the default nvidia-smi table: {quote(cell.strip())}"
        return
    fan_speeds(gpu, m.group("fan"))  # ERR!: the fan's reading failed (gpu.fan_failure)
    gpu.thermal.gpu_c = _value(gpu, "thermal.gpu_c", m.group("temp"), v.number)
    gpu.pstate = _value(gpu, "pstate", m.group("perf"), v.pstate)
    gpu.power.draw_w = _value(gpu, "power.draw_w", m.group("draw"), v.number)
    gpu.power.enforced_limit_w = _value(gpu, "power.enforced_limit_w", m.group("cap"), v.number)


def _value(gpu: Gpu, fact: str, raw: str, convert):
    """`convert(raw)`; when that gives nothing for a reason worth keeping, keep the reason."""
    value = convert(raw)
    if value is None:
        raw = raw.strip()
        reason = v.missing_reason(raw)
        if reason is None and raw:
            gpu.unavailable[fact] = f"nvidia-smi printed {quote(raw, quotes=False)}"
    return value


# -- the sections below the GPU table ------------------------------------------------------

def _section_rows(lines: list[str], title: str) -> list[str] | None:
    """The row lines of the section titled `title` ("Processes:"), None when there is none."""
    start = next((i for i, line in enumerate(lines) if line.startswith("|") and title in line), None)
    if start is None:
        return None
    rows: list[str] = []
    in_body = False
    for line in lines[start + 1:]:
        if line.startswith("|="):
            in_body = True
        elif not in_body:
            continue
        elif line.startswith("|"):
            rows.append(line)
        elif not line.startswith("+") or not line.strip():
            break
    return rows


def _by_index(gpus: list[Gpu]) -> dict[int, Gpu]:
    return {gpu.index: gpu for gpu in gpus}


def _add_processes(lines: list[str], gpus: list[Gpu]) -> None:
    rows = _section_rows(lines, "Processes:")
    if rows is None:  # the capture stops before the process table
        return
    listed: dict[int, list[GpuProcess]] = {}
    for gpu in gpus:
        gpu.processes = listed[gpu.index] = []
    for line in rows:
        row = line.strip()
        m = _PROCESS_START.match(row)
        name_memory = _name_and_memory(row[m.end():]) if m and row.endswith("|") else None
        index = v.whole(m.group("gpu")) if m else None
        if m is None or name_memory is None or index not in listed:
            continue  # "No running processes found"
        listed[index].append(
            GpuProcess(
                pid=v.whole(m.group("pid")),
                name=v.cut(name_memory[0]),  # may be cut at the front: "...\NVIDIA Share.exe"
                type=m.group("type"),
                used_memory_mib=v.mib(name_memory[1]),
            )
        )


def _name_and_memory(tail: str) -> tuple[str, str] | None:
    """ "  python3    1234MiB |" -> ("python3", "1234MiB"); None when no memory cell ends it."""
    body = tail.removesuffix("|").strip()
    if body.endswith("N/A"):
        return body[:-3].strip(), "N/A"
    if not body.endswith("MiB"):
        return None
    head = body[:-3].rstrip()
    digits = len(head) - len(head.rstrip("0123456789"))
    if not digits or head[:-digits][-1:] not in ("", " ", "\t"):
        return None
    return head[:-digits].strip(), head[-digits:] + "MiB"


def _add_mig_devices(lines: list[str], gpus: list[Gpu]) -> None:
    """Rows like "|  0    2   0   0  |   22MiB / 71424MiB  | 16      0 | ..." (GPU GI CI MIG-dev)."""
    gpus_by_index = _by_index(gpus)
    for line in _section_rows(lines, "MIG devices:") or []:
        cells = _cells(line)
        ids = [v.whole(x) for x in cells[0].split()]
        if len(ids) != 4 or None in ids or ids[0] not in gpus_by_index:
            continue  # the BAR1 line under each device, or "No MIG devices found"
        used, _, total = cells[1].partition("/") if len(cells) > 1 else ("", "", "")
        sm = cells[2].split() if len(cells) > 2 else []
        gpus_by_index[ids[0]].mig_devices.append(
            MigDevice(
                index=ids[3],
                gpu_instance_id=ids[1],
                compute_instance_id=ids[2],
                sm_count=v.integer(sm[0]) if sm else None,
                memory_used_mib=v.mib(used),
                memory_total_mib=v.mib(total),
            )
        )


def _add_warnings(lines: list[str], gpus: list[Gpu]) -> None:
    """Lines like "WARNING: infoROM is corrupted at gpu 0008:00:00.0" go to the GPU they name."""
    gpus_by_bus = {gpu.pcie.bus_id: gpu for gpu in gpus if gpu.pcie.bus_id}
    for line in lines:
        if not line.startswith("WARNING:"):
            continue
        bus = _BUS_ID.search(line)
        named = v.bus_id(bus.group()) if bus else None
        gpu = gpus_by_bus.get(named) if named else None
        if gpu is not None:
            key = "inforom" if "inforom" in line.lower() else "warning"
            gpu.unavailable[key] = line.strip()


# -- nvidia-smi dmon -------------------------------------------------------------------------

def looks_like_dmon(text: str) -> bool:
    """True for `nvidia-smi dmon` output: a "# gpu pwr ..." header, then a units line."""
    lines = [line for line in text.splitlines() if line.strip()][:2]
    if len(lines) < 2 or not all(line.startswith("#") for line in lines):
        return False
    names = lines[0].lstrip("#").split()
    # pmon (per-process) has the same look; its "pid" column tells it apart.
    return "gpu" in names and "pid" not in names and len(names) >= 2


def parse_dmon(text: str) -> list[dict]:
    """One dict per sample row: {"gpu": 0, "pwr": 69.0, "gtemp": 41.0, "mtemp": None, ...}.

    A metric the GPU does not report ("-", "N/A", nan, 0x7fffffff) is None; the GPU index is
    bounded (smi_series.gpu_index); `dmon -o DT` adds "date" and "time" columns, kept as text."""
    names: list[str] | None = None
    samples: list[dict] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.startswith("#"):
            tokens = [t.lower() for t in line.lstrip("#").split()]
            if names is None and "gpu" in tokens:
                names = tokens
            continue  # the units line, or the header dmon repeats every few screens
        if names is None:
            break
        tokens = line.split()
        if len(tokens) == len(names):  # a row cut short at the end of a capture is dropped
            sample = {name: token if name in _DMON_TEXT else smi_series.reading(token) for name, token in zip(names, tokens)}
            sample["gpu"] = smi_series.gpu_index(tokens[names.index("gpu")], "nvidia-smi dmon")
            samples.append(sample)
    if names is None:
        raise CaptureError("expected `nvidia-smi dmon` output starting with a '# gpu ...' header line")
    if not samples:  # cut inside its header lines: nothing was sampled
        raise CaptureError("`nvidia-smi dmon` output with its header but no complete sample row (cut short?); "
                           "capture it again with `nvidia-smi dmon -c 10 > dmon.txt`")
    return samples


_DMON_TEXT = {"date", "time"}  # `dmon -o DT`; every other column is a number or "-"


def dmon_series(samples: list[dict]) -> dict[int, list[dict]]:
    """Each GPU's dmon rows as telemetry-like samples, oldest first ("t": seconds from the first
    row when `-o DT` or `-o T` gave times, else None: dmon's interval, 1 s by default, is not
    in its output)."""
    series: dict[int, list[dict]] = {}
    for row in samples:
        when = " ".join(str(row[k]) for k in ("date", "time") if row.get(k))
        t = smi_series.timestamp(when) if "date" in row else _seconds_of_day(row.get("time"))
        series.setdefault(row["gpu"], []).append({
            "t": t, "temp_c": row.get("gtemp"), "power_w": row.get("pwr"), "power_limit_w": None,
            "sm_mhz": row.get("pclk"), "mem_mhz": row.get("mclk"), "util_pct": row.get("sm"),
            "mem_used_mib": row.get("fb"),
        })
    for index, rows in series.items():
        series[index], _ = smi_series.thin(rows)  # capture's note counts the samples kept
        smi_series.relative_times(series[index])
    return series


def _seconds_of_day(raw: object) -> float | None:
    parts = [v.whole(p) if 1 <= len(p) <= 2 else None for p in str(raw or "").split(":")]
    if len(parts) != 3 or None in parts:
        return None
    h, m, s = parts
    return float(h * 3600 + m * 60 + s)  # type: ignore[operator]
