"""`nvidia-smi --query-gpu=<fields> --format=csv`: one row of named values per GPU.

The header names every column ("memory.total [MiB]"), so any selection and order of fields works
and fields a driver does not know are simply absent. Without the header (`csv,noheader`) the
values cannot be told apart, so such a capture is refused.
"""

from __future__ import annotations

import csv
import re
from ..facts import Driver, Gpu, reasons_from_mask
from . import smi_series
from . import values as v
from .errors import CaptureError
from .smi_common import REASON_KEYS, Paths, build_gpu

# A query field name with an optional unit: "pci.bus_id", "memory.total [MiB]".
_HEADER_CELL = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*(?: \[[^\]]*\])?")

# Fields only --query-gpu has; one of them in the header tells it from --query-compute-apps etc.
_GPU_QUERY_FIELDS = {
    "index", "name", "uuid", "pci.bus_id", "driver_version", "kmd_version", "memory.total",
    "pstate", "temperature.gpu", "power.draw", "utilization.gpu", "compute_cap", "vbios_version",
}

Row = dict[str, str]


def looks_like_smi_csv(text: str) -> bool:
    """True when the first line is a --query-gpu CSV header."""
    return _header_fields(_first_line(text)) is not None


def parse_smi_csv(text: str) -> tuple[Driver, list[Gpu]]:
    driver, gpus, _series, _note = parse_smi_csv_loop(text)
    return driver, gpus


def parse_smi_csv_loop(text: str) -> tuple[Driver, list[Gpu], dict[int, list[dict]], str | None]:
    """The GPUs of a --query-gpu CSV, and, when it is a monitoring loop (`-l 5`, `-lms 500`: the
    same GPU in several rows), each GPU's samples oldest first (smi_series.SAMPLE_FIELDS) with a
    note on how the rows were told apart. A GPU's facts are its last row's."""
    first = _first_line(text)
    header = _header_fields(first)
    if header is None:
        raise CaptureError(
            f"expected the header line of `nvidia-smi --query-gpu=... --format=csv` "
            f"(field names such as 'index, name, pci.bus_id'), found {first[:80]!r}; "
            "captures made with csv,noheader cannot be read because the columns are not named"
        )
    data = _data_rows(text)
    if data and len(data[-1]) < len(header):
        if len(data) > 1:
            data = data[:-1]  # a loop stopped by Ctrl-C mid-row: the earlier samples stand
        else:
            raise CaptureError(
                f"truncated --query-gpu CSV: its last row has {len(data[-1])} of {len(header)} values; "
                "capture it again with the same `nvidia-smi --query-gpu=... --format=csv > gpus.csv`"
            )
    if not data:
        raise CaptureError("the --query-gpu CSV has a header but no GPU rows")
    # Every row keeps the fields that tell GPUs apart and the sampled ones; only the rows that
    # become a GPU's facts are read whole (a day of `-l 5` is 17,000 rows of ~200 fields).
    kept = [(i, name) for i, name in enumerate(header) if name in _IDENTITY or name in _SAMPLE_FIELDS]
    rows = [_row(header, cells, kept) for cells in data]
    driver = _driver(_row(header, data[0]))
    keys, note = _gpu_keys(header, rows)
    by_gpu: dict[object, list[int]] = {}
    for number, key in enumerate(keys):
        by_gpu.setdefault(key, []).append(number)
    if all(len(group) == 1 for group in by_gpu.values()):  # a snapshot: one row per GPU
        return driver, [_gpu(_row(header, cells), position) for position, cells in enumerate(data)], {}, None
    gpus, series = [], {}
    for position, group in enumerate(by_gpu.values()):
        gpu = _gpu(_row(header, data[group[-1]]), position)
        gpus.append(gpu)
        samples, thinned = smi_series.thin([_sample(rows[number]) for number in group])
        timed = smi_series.relative_times(samples)
        series[gpu.index] = samples
        if thinned and thinned not in (note or ""):
            note = (note + "; " if note else "") + thinned
        if not timed:
            note = (note + "; " if note else "") + "no timestamp column: the interval between samples is not known"
    return driver, gpus, series, note


_IDENTITY = ("pci.bus_id", "uuid", "index", "serial")
# Fields a monitoring loop samples; a header of only these names no GPU (the seeds' own
# `--query-gpu=temperature.gpu,power.draw,clocks.gr --format=csv -l 5`).
_SAMPLED = {"timestamp", "temperature.gpu", "temperature.memory", "power.draw", "power.draw.average",
            "power.draw.instant", "clocks.current.graphics", "clocks.current.sm", "clocks.current.memory",
            "clocks.current.video", "utilization.gpu", "utilization.memory", "memory.used", "memory.free",
            "fan.speed", "pstate", "clocks_event_reasons.active", "clocks_throttle_reasons.active"}


def _gpu_keys(header: list[str], rows: list[Row]) -> tuple[list[object], str | None]:
    """Which GPU each row is: by bus id, UUID, index or serial; without any of them, rows of
    only sampled fields are one GPU's loop (said in the note), else one GPU per row."""
    for name in _IDENTITY:
        # An index of 0 is GPU 0, not a value zeroed before sharing (a one-GPU loop repeats it).
        if name in header and all(v.text(row.get(name)) and (name == "index" or not _zeroed(row[name])) for row in rows):
            if name == "index":
                return [smi_series.gpu_index(row[name], "--query-gpu CSV") for row in rows], None
            return [row[name] for row in rows], None
    if set(header) <= _SAMPLED and len(rows) > 1:
        return [0] * len(rows), ("rows read as samples of one GPU: the query names no GPU (add index to it, "
                                 "e.g. --query-gpu=index,timestamp,...; on a machine with several GPUs their rows interleave)")
    return list(range(len(rows))), None


def _zeroed(raw: str) -> bool:
    return raw.startswith("GPU-00000000-0000") or set(raw) <= {"0"}  # redacted before sharing


# The fields _sample reads.
_SAMPLE_FIELDS = {"timestamp", "temperature.gpu", "power.draw", "power.draw.average", "power.draw.instant",
                  "enforced.power.limit", "power.limit", "clocks.current.sm", "clocks.current.graphics",
                  "clocks.current.memory", "utilization.gpu", "memory.used"}


def _sample(row: Row) -> dict:
    def first(*names: str) -> float | None:
        return next((x for x in (smi_series.reading(row.get(n)) for n in names) if x is not None), None)
    return {
        "t": smi_series.timestamp(row.get("timestamp")),
        "temp_c": first("temperature.gpu"),
        "power_w": first("power.draw", "power.draw.average", "power.draw.instant"),
        "power_limit_w": first("enforced.power.limit", "power.limit"),
        "sm_mhz": first("clocks.current.sm", "clocks.current.graphics"),
        "mem_mhz": first("clocks.current.memory"),
        "util_pct": first("utilization.gpu"),
        "mem_used_mib": first("memory.used"),
    }


# -- reading the CSV -------------------------------------------------------------------------

def _first_line(text: str) -> str:
    return text.lstrip("\ufeff\r\n \t").split("\n", 1)[0].strip()


def _header_fields(line: str) -> list[str] | None:
    """Canonical field names ("memory.total") of a header line, or None if it is not one."""
    cells = [cell.strip() for cell in line.split(",")]
    if len(cells) < 2 or not all(_HEADER_CELL.fullmatch(cell) for cell in cells):
        return None
    names = [_field_name(cell) for cell in cells]
    return names if _GPU_QUERY_FIELDS.intersection(names) else None


def _field_name(cell: str) -> str:
    return cell.split(" [", 1)[0].strip().lower()


def _data_rows(text: str) -> list[list[str]]:
    lines = text.lstrip("\ufeff\r\n \t").splitlines()[1:]
    reader = csv.reader(lines, skipinitialspace=True)
    try:
        return [cells for cells in reader if any(c.strip() for c in cells)]
    except csv.Error as err:  # a field over csv's 131,072-character limit, a stray quote...
        raise CaptureError(f"a --query-gpu CSV that nvidia-smi did not write: data line {reader.line_num}: {err}") from None


def _row(header: list[str], cells: list[str], fields: list[tuple[int, str]] | None = None) -> Row:
    """A row's values by field name: all of them, or only `fields` ((position, name) pairs)."""
    if len(cells) != len(header):
        raise CaptureError(f"a --query-gpu CSV row has {len(cells)} values for {len(header)} header fields")
    if fields is not None:
        return {name: cells[i].strip() for i, name in fields}
    return {name: cell.strip() for name, cell in zip(header, cells)}


# -- turning a row into facts ----------------------------------------------------------------

# Canonical keys (see smi_common) -> --query-gpu field names, newest names first.
PATHS: Paths = {
    "name": ("name",),
    "uuid": ("uuid",),
    "serial": ("serial",),
    "vbios": ("vbios_version",),
    "compute_capability": ("compute_cap",),
    "persistence": ("persistence_mode",),
    "compute_mode": ("compute_mode",),
    "pstate": ("pstate",),
    "driver_model": ("driver_model.current",),
    "utilization": ("utilization.gpu",),
    "mig_current": ("mig.mode.current",),
    "mig_pending": ("mig.mode.pending",),
    "memory_total": ("memory.total",),
    "memory_used": ("memory.used",),
    "memory_reserved": ("memory.reserved",),
    "power_draw": ("power.draw", "power.draw.average", "power.draw.instant"),
    "power_limit": ("power.limit",),
    "power_enforced": ("enforced.power.limit",),
    "power_default": ("power.default_limit",),
    "power_min": ("power.min_limit",),
    "power_max": ("power.max_limit",),
    "bus_id": ("pci.bus_id",),
    # "current" was renamed "gpucurrent" (same value); "max" is min(GPU, host).
    "pcie_gen_current": ("pcie.link.gen.gpucurrent", "pcie.link.gen.current"),
    "pcie_gen_max": ("pcie.link.gen.max",),
    "pcie_gen_device_max": ("pcie.link.gen.gpumax",),
    "pcie_gen_host_max": ("pcie.link.gen.hostmax",),
    "pcie_width_current": ("pcie.link.width.current",),
    "pcie_width_max": ("pcie.link.width.max",),
    "clock_sm": ("clocks.current.sm",),
    "clock_graphics": ("clocks.current.graphics",),
    "clock_memory": ("clocks.current.memory",),
    "clock_max_sm": ("clocks.max.sm",),
    "clock_max_graphics": ("clocks.max.graphics",),
    "clock_max_memory": ("clocks.max.memory",),
    "clock_app_graphics": ("clocks.applications.graphics",),
    "clock_default_app_graphics": ("clocks.default_applications.graphics",),
    "fan_speed": ("fan.speed",),
    "temp_gpu": ("temperature.gpu",),
    "temp_memory": ("temperature.memory",),
    # Degrees below T.Limit; the slowdown offset (about -2 C) is not a --query-gpu field, so the
    # margin errs on the safe side.
    "temp_tlimit": ("temperature.gpu.tlimit",),
    "ecc_current": ("ecc.mode.current",),
    "ecc_pending": ("ecc.mode.pending",),
    "volatile_corrected_parts": ("ecc.errors.corrected.volatile.total",),
    "volatile_uncorrected_parts": ("ecc.errors.uncorrected.volatile.total",),
    "aggregate_corrected_parts": ("ecc.errors.corrected.aggregate.total",),
    "aggregate_uncorrected_parts": ("ecc.errors.uncorrected.aggregate.total",),
    "retired_sbe": ("retired_pages.single_bit_ecc.count",),
    "retired_dbe": ("retired_pages.double_bit.count",),
    "retired_pending": ("retired_pages.pending",),
    "remap_correctable": ("remapped_rows.correctable",),
    "remap_uncorrectable": ("remapped_rows.uncorrectable",),
    "remap_pending": ("remapped_rows.pending",),
    "remap_failure": ("remapped_rows.failure",),
}
# Renamed from "throttle" to "event" reasons in the 535 drivers.
for _reason in REASON_KEYS:
    PATHS["reason_" + _reason] = (f"clocks_event_reasons.{_reason}", f"clocks_throttle_reasons.{_reason}")


class _RowReport:
    def __init__(self, row: Row):
        self.row = row

    def value(self, path: str) -> str | None:
        return self.row.get(path)


def _driver(row: Row) -> Driver:
    # kmd_version replaces driver_version from the 610 drivers on; both name the same driver.
    version = next((row[k] for k in ("kmd_version", "driver_version") if v.text(row.get(k))), None)
    return Driver(version=v.text(version))


def _gpu(row: Row, position: int) -> Gpu:
    index = smi_series.gpu_index(row["index"], "--query-gpu CSV") if v.text(row.get("index")) else None
    gpu = build_gpu(position if index is None else index, _RowReport(row), PATHS)
    if gpu.clocks.event_reasons is None:  # a query that asked only for the bitmask
        mask = v.hex_or_int(row.get("clocks_event_reasons.active") or row.get("clocks_throttle_reasons.active"))
        gpu.clocks.event_reasons = None if mask is None else reasons_from_mask(mask)
    return gpu
