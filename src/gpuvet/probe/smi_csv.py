"""`nvidia-smi --query-gpu=<fields> --format=csv`: one row of named values per GPU.

The header names every column ("memory.total [MiB]"), so any selection and order of fields works
and fields a driver does not know are simply absent. Without the header (`csv,noheader`) the
values cannot be told apart, so such a capture is refused.
"""

from __future__ import annotations

import csv
import re
from typing import Callable

from ..facts import Driver, Gpu, PcieLink, reasons_from_mask
from . import values as v
from .errors import CaptureError

# A query field name with an optional unit: "pci.bus_id", "memory.total [MiB]".
_HEADER_CELL = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*(?: \[[^\]]*\])?")

# Fields only --query-gpu has; one of them in the header tells it from --query-compute-apps etc.
_GPU_QUERY_FIELDS = {
    "index", "name", "uuid", "pci.bus_id", "driver_version", "kmd_version", "memory.total",
    "pstate", "temperature.gpu", "power.draw", "utilization.gpu", "compute_cap", "vbios_version",
}

# Missing-value reasons that say nothing beyond "no value" (kept out of gpu.unavailable).
_UNINFORMATIVE = {"nvidia-smi reported N/A", "none", "empty in capture"}

Row = dict[str, str]


def looks_like_smi_csv(text: str) -> bool:
    """True when the first line is a --query-gpu CSV header."""
    return _header_fields(_first_line(text)) is not None


def parse_smi_csv(text: str) -> tuple[Driver, list[Gpu]]:
    first = _first_line(text)
    header = _header_fields(first)
    if header is None:
        raise CaptureError(
            f"expected the header line of `nvidia-smi --query-gpu=... --format=csv` "
            f"(field names such as 'index, name, pci.bus_id'), found {first[:80]!r}; "
            "captures made with csv,noheader cannot be read because the columns are not named"
        )
    rows = [_row(header, cells) for cells in _data_rows(text)]
    if not rows:
        raise CaptureError("the --query-gpu CSV has a header but no GPU rows")
    driver = _driver(rows[0])
    gpus = [_gpu(row, position) for position, row in enumerate(rows)]
    return driver, gpus


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
    return [cells for cells in csv.reader(lines, skipinitialspace=True) if any(c.strip() for c in cells)]


def _row(header: list[str], cells: list[str]) -> Row:
    if len(cells) != len(header):
        raise CaptureError(f"a --query-gpu CSV row has {len(cells)} values for {len(header)} header fields")
    return {name: cell.strip() for name, cell in zip(header, cells)}


# -- turning a row into facts ----------------------------------------------------------------

class _Fields:
    """Looks fields up in one row (first present name wins) and keeps why a value is missing."""

    def __init__(self, row: Row, gpu: Gpu | None = None):
        self.row, self.gpu = row, gpu

    def raw(self, *names: str) -> str | None:
        present = [self.row[name] for name in names if name in self.row]
        with_value = [raw for raw in present if v.missing_reason(raw) is None]
        return (with_value or present or [None])[0]

    def get(self, fact: str, names: tuple[str, ...] | str, convert: Callable = v.text):
        raw = self.raw(*((names,) if isinstance(names, str) else names))
        value = convert(raw)
        if value is None and raw is not None and self.gpu is not None:
            reason = v.missing_reason(raw)
            if reason and reason not in _UNINFORMATIVE:
                self.gpu.unavailable[fact] = reason
        return value


def _driver(row: Row) -> Driver:
    f = _Fields(row)
    # kmd_version replaces driver_version from the 595 drivers on; both name the same driver.
    return Driver(version=f.get("version", ("kmd_version", "driver_version")))


def _gpu(row: Row, position: int) -> Gpu:
    index = v.integer(row.get("index"))
    gpu = Gpu(index=position if index is None else index)
    f = _Fields(row, gpu)
    gpu.name = f.get("name", "name")
    gpu.uuid = f.get("uuid", "uuid")
    gpu.serial = f.get("serial", "serial")
    gpu.vbios = f.get("vbios", "vbios_version")
    gpu.compute_capability = f.get("compute_capability", "compute_cap")
    gpu.pstate = f.get("pstate", "pstate", v.pstate)
    gpu.persistence_mode = f.get("persistence_mode", "persistence_mode", v.flag)
    gpu.compute_mode = f.get("compute_mode", "compute_mode")
    gpu.driver_model = f.get("driver_model", "driver_model.current")
    gpu.utilization_pct = f.get("utilization_pct", "utilization.gpu", v.integer)
    gpu.memory_total_mib = f.get("memory_total_mib", "memory.total", v.mib)
    gpu.memory_used_mib = f.get("memory_used_mib", "memory.used", v.mib)
    gpu.memory_reserved_mib = f.get("memory_reserved_mib", "memory.reserved", v.mib)
    gpu.mig_enabled = f.get("mig_enabled", "mig.mode.current", v.flag)
    gpu.mig_pending = f.get("mig_pending", "mig.mode.pending", v.flag)
    _power(f, gpu)
    _pcie(f, gpu)
    _clocks(f, gpu)
    _thermal(f, gpu)
    _ecc(f, gpu)
    return gpu


def _power(f: _Fields, gpu: Gpu) -> None:
    p = gpu.power
    p.draw_w = f.get("power.draw_w", ("power.draw", "power.draw.average", "power.draw.instant"), v.number)
    p.limit_w = f.get("power.limit_w", "power.limit", v.number)
    p.enforced_limit_w = f.get("power.enforced_limit_w", "enforced.power.limit", v.number)
    p.default_limit_w = f.get("power.default_limit_w", "power.default_limit", v.number)
    p.min_limit_w = f.get("power.min_limit_w", "power.min_limit", v.number)
    p.max_limit_w = f.get("power.max_limit_w", "power.max_limit", v.number)


def _pcie(f: _Fields, gpu: Gpu) -> None:
    pcie = gpu.pcie
    pcie.bus_id = v.bus_id(f.raw("pci.bus_id"))
    link = PcieLink(
        # "current" was renamed "gpucurrent" (same value); "max" is min(GPU, host).
        current_gen=f.get("pcie.current_gen", ("pcie.link.gen.gpucurrent", "pcie.link.gen.current"), v.integer),
        max_gen=f.get("pcie.max_gen", "pcie.link.gen.max", v.integer),
        current_width=f.get("pcie.current_width", "pcie.link.width.current", v.integer),
        max_width=f.get("pcie.max_width", "pcie.link.width.max", v.integer),
        source="nvidia-smi",
    )
    if any(x is not None for x in (link.current_gen, link.max_gen, link.current_width, link.max_width)):
        pcie.readings.append(link)
    pcie.device_max_gen = f.get("pcie.device_max_gen", "pcie.link.gen.gpumax", v.integer)
    pcie.host_max_gen = f.get("pcie.host_max_gen", "pcie.link.gen.hostmax", v.integer)


def _clocks(f: _Fields, gpu: Gpu) -> None:
    c = gpu.clocks
    c.sm_mhz = f.get("clocks.sm_mhz", "clocks.current.sm", v.integer)
    c.graphics_mhz = f.get("clocks.graphics_mhz", "clocks.current.graphics", v.integer)
    c.memory_mhz = f.get("clocks.memory_mhz", "clocks.current.memory", v.integer)
    c.max_sm_mhz = f.get("clocks.max_sm_mhz", "clocks.max.sm", v.integer)
    c.max_graphics_mhz = f.get("clocks.max_graphics_mhz", "clocks.max.graphics", v.integer)
    c.max_memory_mhz = f.get("clocks.max_memory_mhz", "clocks.max.memory", v.integer)
    c.applications_graphics_mhz = f.get(
        "clocks.applications_graphics_mhz", "clocks.applications.graphics", v.integer
    )
    c.default_applications_graphics_mhz = f.get(
        "clocks.default_applications_graphics_mhz", "clocks.default_applications.graphics", v.integer
    )
    # Renamed from "throttle" to "event" reasons in the 535 drivers; the bitmask is the same.
    mask = f.get("clocks.event_reasons", ("clocks_event_reasons.active", "clocks_throttle_reasons.active"),
                 v.hex_or_int)
    c.event_reasons = None if mask is None else reasons_from_mask(mask)


def _thermal(f: _Fields, gpu: Gpu) -> None:
    t = gpu.thermal
    t.gpu_c = f.get("thermal.gpu_c", "temperature.gpu", v.number)
    t.memory_c = f.get("thermal.memory_c", "temperature.memory", v.number)
    # Degrees below T.Limit. Slowdown starts a little below T.Limit (its offset, about -2 C, is
    # not a --query-gpu field), so this margin errs on the safe side, as the -q parsers do.
    t.slowdown_margin_c = f.get("thermal.slowdown_margin_c", "temperature.gpu.tlimit", v.number)


def _ecc(f: _Fields, gpu: Gpu) -> None:
    e = gpu.ecc
    e.enabled = f.get("ecc.enabled", "ecc.mode.current", v.flag)
    e.pending_enabled = f.get("ecc.pending_enabled", "ecc.mode.pending", v.flag)
    e.volatile_corrected = f.get("ecc.volatile_corrected", "ecc.errors.corrected.volatile.total", v.integer)
    e.volatile_uncorrected = f.get("ecc.volatile_uncorrected", "ecc.errors.uncorrected.volatile.total", v.integer)
    e.aggregate_corrected = f.get("ecc.aggregate_corrected", "ecc.errors.corrected.aggregate.total", v.integer)
    e.aggregate_uncorrected = f.get(
        "ecc.aggregate_uncorrected", "ecc.errors.uncorrected.aggregate.total", v.integer
    )
    e.retired_pages_sbe = f.get("ecc.retired_pages_sbe", "retired_pages.single_bit_ecc.count", v.integer)
    e.retired_pages_dbe = f.get("ecc.retired_pages_dbe", "retired_pages.double_bit.count", v.integer)
    e.retired_pages_pending = f.get("ecc.retired_pages_pending", "retired_pages.pending", v.flag)
    e.remapped_rows_correctable = f.get("ecc.remapped_rows_correctable", "remapped_rows.correctable", v.integer)
    e.remapped_rows_uncorrectable = f.get(
        "ecc.remapped_rows_uncorrectable", "remapped_rows.uncorrectable", v.integer
    )
    e.remapped_rows_pending = f.get("ecc.remapped_rows_pending", "remapped_rows.pending", v.flag)
    e.remapped_rows_failure = f.get("ecc.remapped_rows_failure", "remapped_rows.failure", v.flag)
