"""The live view: a Snapshot drawn with rich (GPU, host and job blocks, one diagnosis line each)."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Group
from rich.text import Text

from ..judge import diagnose
from ..judge.diagnose import Diagnosis
from .snapshot import GpuExtras, GpuView, HostReading, JobReading, Snapshot

_FAULT_REASONS = {"hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown", "hw_power_brake_slowdown"}


_STATE_STYLE = {"ok": "green", "idle": "dim", "no_data": "dim", "underused": "yellow", "input_bound": "yellow",
                "io_bound": "yellow", "cpu_steal": "yellow", "slowing": "yellow", "clocks_held": "yellow",
                "power_capped": "red", "neighbour": "red", "thermal": "red", "hw_slowdown": "red",
                "no_gpu": "yellow", "job_gone": "dim"}


def _num(value: float | None, fmt: str = "{:.0f}", unit: str = "") -> str:
    return "-" if value is None else fmt.format(value) + unit


def _gib(mib: float | None) -> str:
    return "-" if mib is None else f"{mib / 1024:.1f} GiB"


def _bps(value: float | None) -> str:
    if value is None:
        return "-"
    for unit, size in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if value >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value:.0f} B/s"


def _bar(pct: float | None, width: int = 10) -> str:
    if pct is None:
        return " " * width
    filled = max(0, min(width, round(pct / 100 * width)))
    return "█" * filled + "·" * (width - filled)


def _diagnosis_text(d: Diagnosis) -> Text:
    text = Text("  → ", style="bold")
    text.append(d.text, style=_STATE_STYLE.get(d.state, ""))
    if d.also:
        text.append("  (also: " + ", ".join(diagnose.LABELS[s] for s in d.also) + ")", style="dim")
    return text


def _rows(rows: list[tuple[str, str | Text]]) -> Text:
    """Label + value lines. Plain Text, not a rich Table: a table's layout pass costs ~10x more, and
    the view is drawn every tick."""
    out = Text(no_wrap=True, overflow="ellipsis")  # wrapping is most of a frame's cost
    for i, (label, value) in enumerate(rows):
        out.append(("\n" if i else "") + f"  {label:<8} ", style="bold")
        out.append(value)
    return out


def _block(title: str, style: str, *body: Text) -> Group:
    """A titled block. A title line, not a bordered Panel: borders double the cost of a frame."""
    line = Text(no_wrap=True, overflow="crop")  # the dashes run to the screen's edge and are cut there
    line.append(title + " ", style=f"bold {style}")
    line.append("─" * 300, style=style)
    return Group(line, *body)


def _gpu_block(view: GpuView) -> Group:
    s, f, e = view.sample, view.facts, view.extras
    rows: list[tuple[str, str | Text]] = []
    if s is None:
        rows.append(("", "waiting for the first reading"))
    else:
        sm = _num(s.sm_mhz, unit=" MHz") + (f" = {100 * view.sm_ratio:.0f}% of {f.clocks.max_sm_mhz} max" if view.sm_ratio else "")
        util = f"{_num(s.util_pct, unit='%'):>4} {_bar(s.util_pct)}"
        rows.append(("util", f"{util}   SM {sm}   mem clock {_num(s.mem_mhz, unit=' MHz')}"))
        power = _num(s.power_w, unit=" W")
        if view.power_ratio is not None:
            power += f" = {100 * view.power_ratio:.0f}% of the {s.power_limit_w:.0f} W limit"
        if f.power.default_limit_w and s.power_limit_w and abs(f.power.default_limit_w - s.power_limit_w) > 1:
            power += f" (default {f.power.default_limit_w:.0f} W)"
        temp = _num(s.temp_c, unit=" C")
        if view.slowdown_margin_c is not None:
            temp += f", {view.slowdown_margin_c:.0f} C to slowdown"
        rows.append(("power", f"{power}   temp {temp}"))
        memory = f"{_gib(s.mem_used_mib)} of {_gib(f.memory_total_mib)}" if f.memory_total_mib else _gib(s.mem_used_mib)
        link = f"Gen{s.pcie_gen} x{s.pcie_width}" if s.pcie_gen and s.pcie_width else "link -"
        pcie = f"PCIe {link} tx {_bps(e.pcie_tx_kbs and e.pcie_tx_kbs * 1000)} rx {_bps(e.pcie_rx_kbs and e.pcie_rx_kbs * 1000)}"
        nvlink = f"   NVLink tx {_bps(e.nvlink_tx_bps)} rx {_bps(e.nvlink_rx_bps)}" if e.nvlink_tx_bps is not None else ""
        rows.append(("memory", f"{memory}   {pcie}{nvlink}"))
        rows.append(("reasons", _reasons_text(s.reasons, view.reasons)))
    rows.append(("procs", _processes_text(e)))
    title = f"GPU {view.index}  {view.name or 'unknown model'}" + (f"  {view.bus_id}" if view.bus_id else "")
    return _block(title, "cyan", _rows(rows), _diagnosis_text(view.diagnosis))


def _reasons_text(mask: int | None, names: list[str] | None) -> Text:
    if mask is None:
        return Text("not reported", style="dim")
    if not names:
        return Text("none", style="green")
    text = Text(f"0x{mask:x} = ")
    for i, name in enumerate(names):
        text.append((" | " if i else "") + name, style="red" if name in _FAULT_REASONS else "yellow")
    return text


def _processes_text(e: GpuExtras) -> Text:
    if e.processes is None:
        return Text("not listed: " + e.unavailable.get("processes", "no reading yet"), style="dim")
    if not e.processes:
        return Text("none", style="dim")
    text = Text()
    for i, p in enumerate(sorted(e.processes, key=lambda p: -(p.used_mib or 0))[:6]):
        style = "" if p.visible else "red"
        who = f"{p.pid} {p.user or '?'} {p.name or '?'} {_gib(p.used_mib)}" + ("" if p.visible else " (not visible here)")
        text.append(("  ·  " if i else "") + who, style=style)
    if len(e.processes) > 6:
        text.append(f"  · +{len(e.processes) - 6} more", style="dim")
    return text


def _host_block(h: HostReading | None, hostname: str) -> Group:
    rows: list[tuple[str, str | Text]] = []
    if h is None:
        rows.append(("", "first reading in a second"))
    else:
        rows.append(("cpu", f"{_num(h.cpu_pct, unit='%'):>4} {_bar(h.cpu_pct)} of {h.cpu_count} CPUs   "
                            f"steal {_num(h.steal_pct, '{:.1f}', '%')}   iowait {_num(h.iowait_pct, '{:.1f}', '%')}"))
        mem = f"{h.mem_used_bytes / 2**30:.1f} of {h.mem_total_bytes / 2**30:.1f} GiB" if h.mem_total_bytes else "-"
        rows.append(("memory", f"{mem}   disk read {_bps(h.disk_read_bps)} write {_bps(h.disk_write_bps)}   "
                               f"net rx {_bps(h.net_rx_bps)} tx {_bps(h.net_tx_bps)}"))
        if h.worker_list:
            listed = ", ".join(f"{w.pid} {w.name} {w.cpu_pct:.0f}%" for w in h.worker_list[:6])
            more = f", +{len(h.worker_list) - 6} more" if len(h.worker_list) > 6 else ""
            rows.append(("workers", f"{h.workers} busy, {h.workers_cpu_pct:.0f}% CPU each on average: {listed}{more}"))
        else:
            rows.append(("workers", Text("no DataLoader-like worker busy", style="dim")))
    return _block(f"host {hostname}", "blue", _rows(rows))


def _job_block(job: JobReading, d: Diagnosis | None) -> Group:
    if not job.alive:
        rows: list[tuple[str, str | Text]] = [("", Text(f"process {job.pid} is not running", style="dim"))]
    else:
        rows = [("command", job.cmdline or job.name or ""),
                ("tree", f"{job.processes} process(es)   CPU {_num(job.cpu_pct, unit='%')}   read {_bps(job.read_bps)} "
                         f"write {_bps(job.write_bps)}   GPUs {', '.join(map(str, job.gpus)) or 'none'}")]
    body = [_rows(rows)] + ([_diagnosis_text(d)] if d is not None else [])
    return _block(f"job {job.pid} {job.name or ''}", "magenta", *body)


def render(snap: Snapshot, interactive: bool = True) -> Group:
    clock = time.strftime("%H:%M:%S", time.localtime(snap.t))
    head = Text(f"gpuvet watch · {snap.hostname} · {len(snap.gpus)} GPU(s) · every {snap.interval_s:g} s · "
                f"tick {snap.tick} · {clock}", style="bold")
    if interactive:
        head.append("   q quits", style="dim")
    parts: list[Any] = [head]
    if snap.job is not None:
        parts.append(_job_block(snap.job, snap.job_diagnosis))
    parts.extend(_gpu_block(g) for g in snap.gpus)
    if snap.gpu_error:
        words = "no GPU data: " if not snap.gpus else "some GPUs are not shown: "
        tail = "; the host part still works" if not snap.gpus else ""
        parts.append(_block("GPUs", "yellow", Text(f"  {words}{snap.gpu_error}{tail}")))
    parts.append(_host_block(snap.host, snap.hostname))
    return Group(*parts)
