"""The live view: a Snapshot drawn with rich (GPU, host and job blocks, one diagnosis line each).

The view is redrawn every tick, so it is built for cost (issue 6: under 1% of one core at 1 Hz).
A frame is a list of `_Line`s, each a few (text, style) pieces with the rich attributes its line
has (base style, wrap or not, overflow); `_Frame` turns them into Segments itself: a line that fits
the width (nearly all of them) becomes one Segment a piece, and a line cut with "…" or cropped is
cut the way rich's Text.truncate cuts it. Only a line that rich would wrap, or one holding control
characters or tabs, is handed to rich as the Text it stands for (and what rich makes of it is kept
for the next frames while the line stays the same). Rich Text objects built, wrapped and rendered
for every line of every frame were ~80% of a frame's cost (~1 ms per GPU block); what is left is
mostly rich Live's own pass over the screen (splitting, padding, writing: ~1.5 ms for 8 GPUs).
tests/test_watch.py checks that every line looks exactly as rich draws the Text it stands for.

On a full screen (rich Live) the frame fits the console's height: when the full blocks need more
rows than it has, a compact layout takes their place (one row per GPU under column names, its
diagnosis on the next row or after the numbers, or alone where the screen is too narrow for both;
the job and host blocks whole), and GPUs that
still do not fit are counted on a "+N more GPUs (enlarge the window)" row, never dropped unseen.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator, NamedTuple

from rich.cells import cell_len, set_cell_size
from rich.console import OverflowMethod
from rich.segment import Segment
from rich.style import Style
from rich.text import Text

from ..judge import diagnose
from ..judge.diagnose import Diagnosis
from ..samples import Sample
from .snapshot import GpuExtras, GpuView, HostReading, JobReading, Snapshot

_FAULT_REASONS = {"hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown", "hw_power_brake_slowdown"}


_STATE_STYLE = {"ok": "green", "idle": "dim", "no_data": "dim", "underused": "yellow", "input_bound": "yellow",
                "io_bound": "yellow", "cpu_steal": "yellow", "slowing": "yellow", "clocks_held": "yellow",
                "power_capped": "red", "neighbour": "red", "thermal": "red", "hw_slowdown": "red",
                "no_gpu": "yellow", "job_gone": "dim", "lost": "bold red"}

_RULE = "─"
_RULE_CELLS = 300  # a block's title line: dashes to the screen's edge, at most this many


def _num(value: float | None, fmt: str = "{:.0f}", unit: str = "") -> str:
    return "-" if value is None else fmt.format(value) + unit


def _gib(mib: float | None) -> str:
    return "-" if mib is None else f"{mib / 1024:.1f} GiB"


def _bps(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 1e9:
        return f"{value / 1e9:.1f} GB/s"
    if value >= 1e6:
        return f"{value / 1e6:.1f} MB/s"
    if value >= 1e3:
        return f"{value / 1e3:.1f} kB/s"
    return f"{value:.0f} B/s"


def _bar(pct: float | None, width: int = 10) -> str:
    if pct is None:
        return " " * width
    filled = max(0, min(width, round(pct / 100 * width)))
    return "█" * filled + "·" * (width - filled)


# -- lines, and their Segments ---------------------------------------------------------------------

Piece = tuple[str, str]  # (text, style): a style as rich parses it, "" for none


class _Line(NamedTuple):
    """One line of the view, as the rich Text it stands for: Text(style=base, no_wrap=no_wrap,
    overflow=overflow) with each piece appended in its style. `fill`: a title line, whose last piece
    is repeated to the screen's edge (at most _RULE_CELLS) and cropped there."""

    pieces: tuple[Piece, ...]
    base: str = ""
    no_wrap: bool | None = None
    overflow: OverflowMethod | None = None
    fill: Piece | None = None

    def to_text(self) -> Text:
        text = Text(style=self.base, no_wrap=self.no_wrap, overflow=self.overflow)
        for piece, style in self.pieces:
            text.append(piece, style=style or None)
        if self.fill is not None:
            text.append(self.fill[0] * _RULE_CELLS, style=self.fill[1] or None)
        return text


def _row(label: str, *pieces: Piece) -> _Line:
    """A label + value line of a block: cut with "…" at the screen's edge, never wrapped."""
    return _Line(((f"  {label:<8} ", "bold"),) + pieces, no_wrap=True, overflow="ellipsis")


_STYLES: dict[tuple[str, str], Style | None] = {}


def _style(base: str, style: str) -> Style | None:
    """The Style of a piece on a line: its line's base style and its own, combined as Text does
    (parsed, not looked up in the console's theme: the view's consoles have rich's default one)."""
    key = (base, style)
    if key not in _STYLES:
        _STYLES[key] = (Style.parse(base) + Style.parse(style)) or None
    return _STYLES[key]


_SLOW: dict[tuple[_Line, int, int], list[Segment]] = {}  # lines rich drew (by width): reused while unchanged
_SLOW_KEEP = 512


class _Frame:
    """The whole view: its lines, turned into Segments when rich asks (see the module's note).

    `fit(height, width)`: the lines of a layout for a screen of `height` rows and `width` cells,
    used when `lines` would take more rows than the console has (options.size: rich hands a Group's
    items no height); without `fit` (a plain print) every line is printed."""

    def __init__(self, lines: list[_Line], fit: Callable[[int, int], list[_Line]] | None = None):
        self.lines = lines
        self.fit = fit

    def widest(self) -> int:
        """Cells the longest line needs (a title's rule not counted): a print to a pipe or file
        is made this wide, so nothing is cut at a terminal's width that is not there."""
        return max((cell_len("".join(piece for piece, _ in line.pieces)) for line in self.lines), default=0)

    def __rich_console__(self, console: Any, options: Any) -> Iterator[Segment | Text]:
        width = options.max_width
        # Console.print's own justify / overflow / no_wrap (the view never passes them) are left to rich.
        plain_options = width >= 1 and options.justify in (None, "default") and not options.no_wrap and options.overflow is None
        height = options.size.height
        if self.fit is None or not plain_options or not height:
            yield from self._segments(self.lines, console, options, plain_options)
            return
        if len(self.lines) <= height:  # each line takes a row at least: more lines than rows never fit
            drawn = list(self._segments(self.lines, console, options, True))
            # All Segments: plain options render every line to segments (see _by_rich).
            if sum(s.text.count("\n") for s in drawn if isinstance(s, Segment)) <= height:
                yield from drawn
                return
        yield from self._segments(self.fit(height, width), console, options, True)

    def _segments(self, lines: list[_Line], console: Any, options: Any, plain_options: bool) -> Iterator[Segment | Text]:
        width = options.max_width
        new_line = Segment.line()
        for line in lines:
            cut = self._cut(line, width) if plain_options else None
            if cut is None:
                yield from self._by_rich(line, console, options, plain_options)
                continue
            base = line.base
            for piece, style in cut:
                if piece:
                    yield Segment(piece, _style(base, style))
            yield new_line

    @staticmethod
    def _cut(line: _Line, width: int) -> list[Piece] | tuple[Piece, ...] | None:
        """The pieces of `line` as rich would draw them in `width` cells, or None where only rich can
        say (a line to wrap; control characters or tabs, which Text strips or expands)."""
        pieces = line.pieces
        if line.fill is not None:
            head = "".join([piece for piece, _ in pieces])
            used = cell_len(head)
            if not head.isprintable() or used > width:
                return None
            dashes = min(_RULE_CELLS, width - used)
            return pieces + ((line.fill[0] * dashes, line.fill[1]),) if dashes else pieces
        plain = "".join([piece for piece, _ in pieces])
        if not plain.isprintable():
            return None
        if cell_len(plain) <= width:
            return pieces
        if not line.no_wrap or line.overflow not in ("ellipsis", "crop"):
            return None  # rich wraps it
        # Text.truncate: the text set to width (width - 1 and "…"), each piece cut at the new length.
        kept = set_cell_size(plain, width - 1) + "…" if line.overflow == "ellipsis" else set_cell_size(plain, width)
        end, out = len(kept), []
        start = 0
        for piece, style in pieces:
            if start >= end:
                break
            stop = start + len(piece)
            out.append((kept[start:min(stop, end)], style))
            start = stop
        return out

    @staticmethod
    def _by_rich(line: _Line, console: Any, options: Any, cacheable: bool) -> Iterator[Segment | Text]:
        if not cacheable:
            yield line.to_text()
            return
        key = (line, options.max_width, console.tab_size)
        segments = _SLOW.get(key)
        if segments is None:
            segments = list(console.render(line.to_text(), options))
            if len(_SLOW) >= _SLOW_KEEP:
                _SLOW.clear()
            _SLOW[key] = segments
        yield from segments


# -- the blocks ------------------------------------------------------------------------------------

def _title(title: str, style: str) -> _Line:
    """A block's title line (not a bordered Panel: borders double the cost of a frame)."""
    return _Line(((title + " ", f"bold {style}"),), no_wrap=True, overflow="crop", fill=(_RULE, style))


def _diagnosis_line(d: Diagnosis) -> _Line:
    pieces: tuple[Piece, ...] = (("  → ", ""), (d.text, _STATE_STYLE.get(d.state, "")))
    if d.also:
        pieces += (("  (also: " + ", ".join(diagnose.LABELS[s] for s in d.also) + ")", "dim"),)
    return _Line(pieces, base="bold")


def _gpu_lines(view: GpuView, out: list[_Line]) -> None:
    s, f, e = view.sample, view.facts, view.extras
    mig = f"  MIG: {view.mig_instances} instance(s)" if view.mig_instances is not None else ""
    out.append(_title(f"GPU {view.index}  {view.name or 'unknown model'}" + (f"  {view.bus_id}" if view.bus_id else "") + mig,
                      "cyan"))
    if view.diagnosis.state == "lost":
        out.append(_row("", ("no readings: NVML can no longer reach this GPU", "red")))
    elif s is None:
        out.append(_row("", ("waiting for the first reading", "")))
    else:
        sm_ratio = view.sm_ratio
        sm = _num(s.sm_mhz, unit=" MHz") + (f" = {100 * sm_ratio:.0f}% of {f.clocks.max_sm_mhz} max" if sm_ratio else "")
        util = f"{_num(s.util_pct, unit='%'):>4} {_bar(s.util_pct)}"
        out.append(_row("util", (f"{util}   SM {sm}   mem clock {_num(s.mem_mhz, unit=' MHz')}", "")))
        power = _num(s.power_w, unit=" W")
        power_ratio = view.power_ratio
        if power_ratio is not None:
            power += f" = {100 * power_ratio:.0f}% of the {s.power_limit_w:.0f} W limit"
        if f.power.default_limit_w and s.power_limit_w and abs(f.power.default_limit_w - s.power_limit_w) > 1:
            power += f" (default {f.power.default_limit_w:.0f} W)"
        temp = _num(s.temp_c, unit=" C")
        margin = view.slowdown_margin_c
        if margin is not None:
            temp += f", {margin:.0f} C to slowdown"
        out.append(_row("power", (f"{power}   temp {temp}", "")))
        memory = f"{_gib(s.mem_used_mib)} of {_gib(f.memory_total_mib)}" if f.memory_total_mib else _gib(s.mem_used_mib)
        out.append(_row("memory", (f"{memory}   {_pcie_words(s, e)}{_nvlink_words(view)}", "")))
        out.append(_row("reasons", *_reasons_pieces(s.reasons, view.reasons)))
    out.append(_row("procs", *_processes_pieces(e)))
    out.append(_diagnosis_line(view.diagnosis))


def _pcie_words(s: Sample, e: GpuExtras) -> str:
    link = f"Gen{s.pcie_gen} x{s.pcie_width}" if s.pcie_gen and s.pcie_width else "link -"
    why = e.unavailable.get("pcie_tx") or e.unavailable.get("pcie_rx")
    if why:
        return f"PCIe {link} throughput n/a ({why})"
    return f"PCIe {link} tx {_bps(e.pcie_tx_kbs and e.pcie_tx_kbs * 1000)} rx {_bps(e.pcie_rx_kbs and e.pcie_rx_kbs * 1000)}"


def _nvlink_words(view: GpuView) -> str:
    """NVLink throughput, or why there is none: NVML cannot give it, or no link is active."""
    e, links = view.extras, view.facts.nvlinks
    if "nvlink" in e.unavailable:
        return f"   NVLink n/a ({e.unavailable['nvlink']})"
    if e.nvlink_tx_bps is not None:
        return f"   NVLink tx {_bps(e.nvlink_tx_bps)} rx {_bps(e.nvlink_rx_bps)}"
    if not any(link.active for link in links or []):
        return "   NVLink none active"  # the facts list no active link ([]: none at all)
    return "   NVLink tx - rx - (first rate in a second)"


def _reasons_pieces(mask: int | None, names: list[str] | None, with_mask: bool = True) -> tuple[Piece, ...]:
    if mask is None:
        return (("not reported", "dim"),)
    if not names:
        return (("none", "green"),)
    return ((f"0x{mask:x} = ", ""),) * with_mask + tuple(
        ((" | " if i else "") + name, "red" if name in _FAULT_REASONS else "yellow") for i, name in enumerate(names))


def _processes_pieces(e: GpuExtras) -> tuple[Piece, ...]:
    if e.processes is None:
        return (("not listed: " + e.unavailable.get("processes", "no reading yet"), "dim"),)
    if not e.processes:
        return (("none", "dim"),)
    pieces = []
    for i, p in enumerate(sorted(e.processes, key=lambda p: -(p.used_mib or 0))[:6]):
        who = (f"{p.pid} {p.user or '?'} {p.name or '?'} {_gib(p.used_mib)}" + ("" if p.visible else " (not visible here)")
               + (f" (host pid {p.host_pid})" if p.host_pid is not None else ""))
        pieces.append((("  ·  " if i else "") + who, "" if p.visible else "red"))
    if len(e.processes) > 6:
        pieces.append((f"  · +{len(e.processes) - 6} more", "dim"))
    return tuple(pieces)


def _host_lines(h: HostReading | None, hostname: str, out: list[_Line]) -> None:
    out.append(_title(f"host {hostname}", "blue"))
    if h is None:
        out.append(_row("", ("first reading in a second", "")))
        return
    out.append(_row("cpu", (f"{_num(h.cpu_pct, unit='%'):>4} {_bar(h.cpu_pct)} of {h.cpu_count} CPUs   "
                            f"steal {_num(h.steal_pct, '{:.1f}', '%')}   iowait {_num(h.iowait_pct, '{:.1f}', '%')}", "")))
    mem = f"{h.mem_used_bytes / 2**30:.1f} of {h.mem_total_bytes / 2**30:.1f} GiB" if h.mem_total_bytes and h.mem_used_bytes is not None else "-"
    out.append(_row("memory", (f"{mem}   disk read {_bps(h.disk_read_bps)} write {_bps(h.disk_write_bps)}   "
                               f"net rx {_bps(h.net_rx_bps)} tx {_bps(h.net_tx_bps)}", "")))
    if h.worker_list:
        listed = ", ".join(f"{w.pid} {w.name} {w.cpu_pct:.0f}%" for w in h.worker_list[:6])
        more = f", +{len(h.worker_list) - 6} more" if len(h.worker_list) > 6 else ""
        out.append(_row("workers", (f"{h.workers} busy, {h.workers_cpu_pct:.0f}% CPU each on average: {listed}{more}", "")))
    else:
        out.append(_row("workers", ("no DataLoader-like worker busy", "dim")))


def _shown_safely(line: _Line) -> _Line:
    """`line` with no piece that drives the terminal: a GPU's name, a hostname, a process's name
    come from the driver, a capture or another user, and may hold C1 controls (U+009B is a CSI),
    escape sequences or bidi overrides (U+202E); each becomes "?" (the pieces are Segments, drawn raw)."""
    if all(piece.isprintable() for piece, _ in line.pieces):
        return line
    return line._replace(pieces=tuple((_printable(piece), style) for piece, style in line.pieces))


def _printable(text: str) -> str:
    """A process's own words (its name, its arguments) on one row: control characters as "?"."""
    return text if text.isprintable() else "".join(ch if ch.isprintable() else "?" for ch in text)


def _job_lines(job: JobReading, d: Diagnosis | None, out: list[_Line]) -> None:
    out.append(_title(_printable(f"job {job.pid} {job.name or ''}"), "magenta"))
    if not job.alive:
        out.append(_row("", (f"process {job.pid} is not running", "dim")))
    else:
        out.append(_row("command", (_printable(job.cmdline or job.name or ""), "")))
        out.append(_row("tree", (f"{job.processes} process(es)   CPU {_num(job.cpu_pct, unit='%')}   read {_bps(job.read_bps)} "
                                 f"write {_bps(job.write_bps)}   GPUs {_job_gpus(job)}", "")))
    if d is not None:
        out.append(_diagnosis_line(d))


def _job_gpus(job: JobReading) -> str:
    if job.gpus:
        return ", ".join(map(str, job.gpus))
    if job.maybe_gpus:
        return f"maybe {', '.join(map(str, job.maybe_gpus))} (this container cannot see whose processes are on them)"
    return "none"


def _header(snap: Snapshot, interactive: bool) -> _Line:
    clock = time.strftime("%H:%M:%S", time.localtime(snap.t))
    head = (f"gpuvet watch · {snap.hostname} · {len(snap.gpus)} GPU(s) · every {snap.interval_s:g} s · "
            f"tick {snap.tick} · {clock}" + ("" if snap.source == "live" else f" · {snap.source}"), "")
    return _Line((head, ("   q quits", "dim")) if interactive else (head,), base="bold")


def _gpu_error_lines(snap: Snapshot, out: list[_Line]) -> None:
    if snap.gpu_error:
        words = "no GPU data: " if not snap.gpus else "some GPUs are not shown: "
        tail = "; the host part still works" if not snap.gpus else ""
        out.append(_title("GPUs", "yellow"))
        out.append(_Line(((f"  {words}{snap.gpu_error}{tail}", ""),)))


def render(snap: Snapshot, interactive: bool = True, screen: bool = False) -> _Frame:
    """The view of one snapshot. `screen`: drawn on a full screen (rich Live), so fitted to the
    console's height: a compact layout when the full blocks would not fit (see _compact)."""
    lines = [_header(snap, interactive)]
    if snap.job is not None:
        _job_lines(snap.job, snap.job_diagnosis, lines)
    for g in snap.gpus:
        _gpu_lines(g, lines)
    _gpu_error_lines(snap, lines)
    _host_lines(snap.host, snap.hostname, lines)
    return _Frame([_shown_safely(line) for line in lines],
                  fit=(lambda height, width: [_shown_safely(line) for line in _compact(snap, interactive, height, width)])
                  if screen else None)


# -- the compact layout: a screen too short for the full blocks ------------------------------------

def _one_row(line: _Line) -> _Line:
    """The line cut with "…" at the screen's edge instead of wrapped: exactly one row."""
    return line if line.fill is not None else line._replace(no_wrap=True, overflow="ellipsis")


_COMPACT_COLUMNS = f"{'':6}{'util':>5}{'SM/max':>10}{'power/limit':>13}{'temp':>6}{'margin':>8}  {'memory':<12}  "


def _compact_gpu(view: GpuView, inline: bool, numbers: bool = True) -> list[_Line]:
    """One row per GPU under _COMPACT_COLUMNS: utilization, SM clock % of max, power % of the limit,
    temperature and its margin to slowdown, memory, reasons; the diagnosis on the next row, or in
    place of the reasons when `inline` (it names the reasons that matter). Without `numbers` (a
    screen too narrow for numbers and diagnosis on one row) the row is the diagnosis alone."""
    s, f = view.sample, view.facts
    pieces: list[Piece] = [(f"GPU {view.index:<2}", "bold cyan")]
    if not numbers:
        d = view.diagnosis
        return [_Line(tuple(pieces) + ((" → ", "bold"), (d.text, "bold " + _STATE_STYLE.get(d.state, ""))),
                      no_wrap=True, overflow="ellipsis")]
    if s is None:
        pieces.append(("  waiting for the first reading", "dim"))
    else:
        sm = f"{100 * view.sm_ratio:.0f}%" if view.sm_ratio else _num(s.sm_mhz, unit=" MHz")
        power = f"{100 * view.power_ratio:.0f}%" if view.power_ratio is not None else _num(s.power_w, unit=" W")
        margin = view.slowdown_margin_c
        used = "-" if s.mem_used_mib is None else f"{s.mem_used_mib / 1024:.1f}"
        memory = f"{used}/{f.memory_total_mib / 1024:.0f} GiB" if f.memory_total_mib else _gib(s.mem_used_mib)
        pieces.append((f"{_num(s.util_pct, unit='%'):>5}{sm:>10}{power:>13}{_num(s.temp_c, unit=' C'):>6}"
                       f"{_num(margin, unit=' C'):>8}  {memory:<12}  ", ""))
        if not inline:
            pieces.extend(_reasons_pieces(s.reasons, view.reasons, with_mask=False))
    d = view.diagnosis
    if inline:
        pieces += [("→ ", "bold"), (d.text, "bold " + _STATE_STYLE.get(d.state, ""))]
        return [_Line(tuple(pieces), no_wrap=True, overflow="ellipsis")]
    return [_Line(tuple(pieces), no_wrap=True, overflow="ellipsis"), _one_row(_diagnosis_line(d))]


def _columns(inline: bool, numbers: bool = True) -> _Line:
    if not numbers:
        return _Line((("GPU   diagnosis (widen the window for the numbers)", "dim"),), no_wrap=True, overflow="ellipsis")
    return _Line(((_COMPACT_COLUMNS + ("diagnosis" if inline else "reasons"), "dim"),), no_wrap=True, overflow="ellipsis")


# An inline row's numbers take this many cells; narrower than this plus a readable diagnosis, the
# rows of a crowded screen hold the diagnosis alone (the numbers that matter are in its words).
_INLINE_MIN_WIDTH = len(_COMPACT_COLUMNS) + 30


def _more_gpus(hidden: list[GpuView]) -> _Line:
    counts: dict[str, int] = {}
    for view in hidden:
        counts[view.diagnosis.label] = counts.get(view.diagnosis.label, 0) + 1
    states = ", ".join(f"{label} ×{n}" for label, n in counts.items())
    return _Line(((f"  +{len(hidden)} more GPUs (enlarge the window): {states}", "yellow"),), no_wrap=True, overflow="ellipsis")


def _compact(snap: Snapshot, interactive: bool, height: int, width: int = 200) -> list[_Line]:
    """The view in `height` rows of `width` cells: the header, the job and host blocks and the
    GPUs' diagnoses always; the GPUs one or two rows each (one: numbers and diagnosis, or on a
    narrow screen the diagnosis alone); those that still do not fit (the least troubled first)
    counted, by diagnosis, on a "+N more GPUs" row."""
    head = [_one_row(_header(snap, interactive))]
    if snap.job is not None:
        _job_lines(snap.job, snap.job_diagnosis, head)
    tail: list[_Line] = []
    _gpu_error_lines(snap, tail)
    _host_lines(snap.host, snap.hostname, tail)
    head, tail = [_one_row(line) for line in head], [_one_row(line) for line in tail]
    if not snap.gpus:
        return head + tail
    head.append(_title("GPUs · compact: enlarge the window for the full view", "cyan"))
    room = height - len(head) - len(tail) - 1  # - the columns' row
    numbers = width >= _INLINE_MIN_WIDTH
    for inline in (False, True):
        rows = [line for view in snap.gpus for line in _compact_gpu(view, inline, numbers or not inline)]
        if len(rows) <= room:
            return head + [_columns(inline, numbers or not inline)] + rows + tail
    shown = sorted(snap.gpus, key=lambda v: (diagnose.SEVERITY.index(v.diagnosis.state), v.index))[:max(0, room - 1)]
    hidden = [v for v in snap.gpus if v not in shown]
    rows = [_columns(True, numbers)] + [line for view in sorted(shown, key=lambda v: v.index)
                                        for line in _compact_gpu(view, True, numbers)]
    return head + rows + [_more_gpus(hidden)] + tail
