"""Reading `nvidia-smi topo -m` (and `topo -mp`): how each pair of GPUs and NICs is connected.

The capture is a matrix. The header names the devices (GPU0.., then NICs as NIC0.. or mlx5_0..) and
then some per-GPU columns (CPU Affinity, NUMA Affinity, GPU NUMA ID); each row starts with a device
name, holds one link code per device column (X, NV12, PIX, PXB, PHB, NODE, SYS, older SOC...) and,
for GPU rows, the per-GPU cells. Under it come the "Legend:" and, on newer drivers, a "NIC Legend:"
that maps NIC0 -> mlx5_0.

Markdown pastes expand TABs to spaces, so empty cells (Windows prints empty affinities) would
vanish from a plain whitespace split; the cells are put back at the 8-column tab stops nvidia-smi
used. Drivers that print "GPU NUMA ID" put one more cell in the row than the header names, an empty
one before GPU NUMA ID (`GPU0\\t X \\t0-19\\t0\\t\\tN/A`); it only shifts that last column, which
Topology does not keep, so the per-GPU cells are read left to right.

`nvidia-smi topo -p2p` prints a matrix of the same shape (codes OK, CNS, NS...): it is refused.
"""

from __future__ import annotations

import re

from gpuvet.facts import Topology
from gpuvet.probe import values
from gpuvet.probe.bounded_read import check_gpu_count, check_gpu_index
from gpuvet.probe.errors import CaptureError
from gpuvet.untrusted_text import quote

# nvidia-smi underlines the header with ESC[4m ... ESC[0m even when its output is piped.
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# Header columns that are not devices; they contain spaces, so they are matched whole.
_GPU_COLUMNS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
_HEADER_TOKEN = re.compile("|".join(_GPU_COLUMNS) + r"|\S+")
_NV_CODE = re.compile(r"NV(\d+)")
_NIC_LEGEND_ENTRY = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")
_NV_LEGEND_LINE = re.compile(r"^\s*NV#\s*=")
# "Legend:", "  X    = Self", "  NV#  = ...", "NIC Legend:", "  NIC0: mlx5_0"
_LEGEND_LINE = re.compile(r"^(?:(?:NIC )?Legend:\s*|\s+\S+\s*=.*|\s+NIC\d+\s*:.*)$")
# `topo -p2p` status codes and its legend line; never seen in a `topo -m` matrix.
_P2P_CODES = {"OK", "CNS", "GNS", "TNS", "NS", "DR", "U"}
_P2P_LEGEND_LINE = re.compile(r"^\s*OK\s*=\s*Status Ok")
_TAB_WIDTH = 8


def nvlink_count(code: str) -> int:
    """Bonded NVLinks a matrix cell stands for: "NV12" -> 12; PIX, SYS, X ... -> 0."""
    match = _NV_CODE.fullmatch(code.strip())
    return (values.whole(match.group(1)) or 0) if match else 0


def looks_like_topo(text: str) -> bool:
    """True when the text starts with a topo matrix (a "GPU0 ..." header, a "GPU0  X ..." row)
    that is not `topo -p2p` output. A truncated matrix is claimed: parse_topo then says what is wrong."""
    head = _strip_ansi(text[:8192]).lstrip().splitlines()
    return _find_header(head[:2]) == 0 and not any(_P2P_LEGEND_LINE.match(line) for line in head)


def parse_topo(text: str, source: str = "") -> Topology:
    """Parse `nvidia-smi topo -m` or `topo -mp` output; the matrix may sit anywhere in the text.

    Raises CaptureError when the text holds no matrix (e.g. nvidia-smi printed an error instead).
    """
    lines = _strip_ansi(text).splitlines()
    header_at = _find_header(lines)
    if header_at is None:
        raise CaptureError(
            "expected `nvidia-smi topo -m` output (a header line 'GPU0 GPU1 ...' followed by a row "
            f"'GPU0  X ...'); found {_describe(text)}"
        )
    devices, gpu_columns = _split_header(lines[header_at])
    _check_device_names(devices)
    topology = Topology(devices=devices, source=source)

    rows = _matrix_rows(lines[header_at + 1 :])
    if len(rows) != len(devices):
        raise CaptureError(
            f"topo matrix has {len(devices)} device columns but {len(rows)} rows; expected one row "
            "per device (truncated capture?)"
        )
    for row in rows:
        _read_row(row, devices, gpu_columns, topology)

    legend = _legend(lines[header_at + 1 + len(rows) :])
    if any(_P2P_LEGEND_LINE.match(line) for line in legend):
        raise CaptureError("this is `nvidia-smi topo -p2p` output (P2P status), not `topo -m`")
    topology.nic_names = _nic_legend(legend)
    topology.shows_nvlink = _shows_nvlink(legend, topology)
    return topology


def _strip_ansi(text: str) -> str:
    return _ANSI_ESCAPE.sub("", text)


def _describe(text: str) -> str:
    stripped = text.strip()
    return quote(stripped.splitlines()[0]) if stripped else "an empty text"


def _find_header(lines: list[str]) -> int | None:
    """Index of the header line: it starts with GPU0 and the next line is GPU0's row.

    A row with P2P status codes is `topo -p2p` output, which may come without its legend.
    """
    for i in range(len(lines) - 1):
        header, row = lines[i].split(), lines[i + 1].split()
        if (
            header[:1] == ["GPU0"]
            and "X" not in header
            and row[:1] == ["GPU0"]
            and not _P2P_CODES.intersection(row)
        ):
            return i
    return None


_GPU_LABEL = re.compile(r"GPU(\d+)")


def _check_device_names(devices: list[str]) -> None:
    """A matrix is devices squared, and a GPU label's number becomes a GPU index: bound both."""
    check_gpu_count(len(devices), "this topo matrix")
    for device in devices:
        label = _GPU_LABEL.fullmatch(device)
        if label:
            check_gpu_index(values.whole(label.group(1)), "this topo matrix")


def _split_header(line: str) -> tuple[list[str], list[str]]:
    """(device columns, per-GPU columns): devices are the names before the first per-GPU column."""
    tokens = _HEADER_TOKEN.findall(line)
    for i, token in enumerate(tokens):
        if token in _GPU_COLUMNS:
            return tokens[:i], tokens[i:]
    return tokens, []


def _matrix_rows(lines: list[str]) -> list[str]:
    """The lines under the header up to the blank line (or "Legend:") that ends the matrix."""
    rows = []
    for line in lines:
        if not line.strip() or line.strip().startswith("Legend"):
            break
        rows.append(line)
    return rows


def _legend(lines: list[str]) -> list[str]:
    """The legend block under the matrix; it ends at the first line that is not part of it."""
    block = []
    for line in lines:
        if line.strip() and not _LEGEND_LINE.match(line):
            break
        block.append(line)
    return block


def _read_row(line: str, devices: list[str], gpu_columns: list[str], topology: Topology) -> None:
    cells = _row_cells(line, len(devices))
    name, codes, per_gpu = cells[0], cells[1 : len(devices) + 1], cells[len(devices) + 1 :]
    if name not in devices or len(codes) != len(devices) or not all(codes):
        raise CaptureError(
            f"topo matrix row {quote(line.strip())} does not hold one link code for each of the "
            f"{len(devices)} devices in the header"
        )
    topology.links[name] = dict(zip(devices, codes))
    if name.startswith("GPU"):
        cell = dict(zip(gpu_columns, per_gpu))
        cpu, numa = values.text(cell.get("CPU Affinity")), values.text(cell.get("NUMA Affinity"))
        if cpu:
            topology.cpu_affinity[name] = cpu
        if numa:
            topology.numa_affinity[name] = numa


def _row_cells(line: str, device_count: int) -> list[str]:
    if "\t" in line:
        return [cell.strip() for cell in line.split("\t")]
    cells = _cells_at_tab_stops(line)
    link_cells = cells[1 : device_count + 1]
    if len(link_cells) == device_count and all(link_cells):
        return cells
    # Not an 8-column expansion (re-spaced by hand?): the link codes still split on whitespace.
    return line.split()


def _cells_at_tab_stops(line: str) -> list[str]:
    """Undo TAB expansion: a cell ends at a tab stop whose column before it is a space.

    A TAB always adds at least one space, so a chunk of 8 columns that ends in a space closes the
    cell; a chunk of only spaces is an empty cell (or the padding after a cell of exactly 8).
    """
    cells, current = [], ""
    for start in range(0, len(line), _TAB_WIDTH):
        chunk = line[start : start + _TAB_WIDTH]
        current += chunk
        if chunk.endswith(" "):
            cells.append(current.strip())
            current = ""
    if current.strip() or not cells:
        cells.append(current.strip())
    return cells


def _nic_legend(lines: list[str]) -> dict[str, str]:
    names = {}
    for line in lines:
        match = _NIC_LEGEND_ENTRY.match(line)
        if match:
            names[match.group(1)] = match.group(2)
    return names


def _shows_nvlink(legend: list[str], topology: Topology) -> bool:
    """`topo -mp` hides NVLink and drops the "NV#" legend line; without any legend, assume `topo -m`."""
    if any(nvlink_count(code) for row in topology.links.values() for code in row.values()):
        return True
    if not any(line.strip() == "Legend:" for line in legend):
        return True
    return any(_NV_LEGEND_LINE.match(line) for line in legend)
