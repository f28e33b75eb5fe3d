"""The seeds' acceptance checklist, ticked from a run record.

The first seed ends with a table a person works through by hand before trusting a rented machine
(whole card? power cap? PCIe width? storage IO? RDMA? software stack? preemptible? backups?); the
second lists five "hidden parameters" no spec sheet shows. Each line here is ticked, crossed,
warned or left unknown from the findings that decide it, with the figure that decided it.

Pure functions of the record: nothing is measured or judged again here, so an old record shows
the same checklist it showed when it was made (apart from newer items it cannot answer).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

from ..facts import Gpu
from ..record import FAIL, PASS, SKIP, WARN, Finding, RunRecord

TICKED, CROSSED, WARNED, UNKNOWN = "ticked", "crossed", "warned", "unknown"
STATES = (TICKED, CROSSED, WARNED, UNKNOWN)
MARK = {TICKED: "✓", CROSSED: "✗", WARNED: "!", UNKNOWN: "?"}
WORD = {TICKED: "yes", CROSSED: "no", WARNED: "caveat", UNKNOWN: "unknown"}
_STATE_OF = {PASS: TICKED, WARN: WARNED, FAIL: CROSSED}
_SEVERITY = {FAIL: 2, WARN: 1, PASS: 0}

ACCEPTANCE, HIDDEN = "acceptance", "hidden"
GROUP_TITLES = {
    ACCEPTANCE: "Acceptance checklist",
    HIDDEN: "Hidden parameters",
}
GROUP_SOURCES = {
    ACCEPTANCE: "seed 1, table 4.2: tick each before trusting the machine",
    HIDDEN: "seed 2, section 5: what spec sheets do not say",
}


@dataclass(frozen=True)
class Item:
    key: str
    group: str
    title: str
    seed: str  # the seed's own words for the line, so a reader can find it there
    checks: tuple[str, ...]  # check ids; "storage.*" takes every check of that area
    to_check: str  # the command that answers it when the record cannot
    exclude: tuple[str, ...] = ()
    # What a pass shows: its "summary", its evidence ("measured": says "under load" / "at idle"),
    # or only the item's "extra" figures (when the finding's words would repeat them).
    passing_figure: str = "summary"
    keep: Callable[[RunRecord, Finding], bool] | None = None  # drop findings that do not bear on the item
    extra: Callable[[RunRecord], str] | None = None  # more figures from facts and measurements
    decide: Callable[[RunRecord, Item], Line] | None = None  # items not decided by findings


@dataclass
class Line:
    item: Item
    state: str
    figure: str  # the figure that decided it; for unknown, why
    findings: list[Finding] = field(default_factory=list)  # the findings that bear on it

    @property
    def mark(self) -> str:
        return MARK[self.state]


def checklist(record: RunRecord) -> list[Line]:
    """Every item of both tables, in the seeds' order."""
    return [(item.decide or _from_findings)(record, item) for item in ITEMS]


def grouped(lines: list[Line]) -> list[tuple[str, list[Line]]]:
    """[(group, lines)] in table order, for renderers."""
    return [(group, [line for line in lines if line.item.group == group]) for group in GROUP_TITLES]


# -- deciding an item from findings ----------------------------------------------------------------

def _bears_on(item: Item, f: Finding) -> bool:
    if f.check in item.exclude:
        return False
    return any(f.check == c or (c.endswith(".*") and f.check.startswith(c[:-1])) for c in item.checks)


def _from_findings(record: RunRecord, item: Item) -> Line:
    found = [f for f in record.findings if _bears_on(item, f) and (item.keep is None or item.keep(record, f))]
    judged = [f for f in found if f.status in _SEVERITY]
    extra = item.extra(record) if item.extra else ""
    if not judged:
        why = _skip_reasons(found) or f"not checked (run `{item.to_check}`)"
        return Line(item, UNKNOWN, _join(why, extra), found)
    worst = max(judged, key=lambda f: _SEVERITY[f.status]).status
    deciding = [f for f in judged if f.status == worst]
    if worst == PASS and item.passing_figure == "extra" and extra:
        return Line(item, TICKED, extra, found)
    return Line(item, _STATE_OF[worst], _join(_figure(item, deciding), extra), found)


def _skip_reasons(found: list[Finding]) -> str:
    reasons = list(dict.fromkeys(f.summary for f in found if f.status == SKIP))
    return "; ".join(reasons)


def _figure(item: Item, deciding: list[Finding]) -> str:
    """The first deciding finding's words, naming the subjects that share them."""
    def text(f: Finding) -> str:
        if f.status == PASS and item.passing_figure == "measured" and f.evidence.measured:
            return f.evidence.measured
        return f.summary

    first = text(deciding[0])
    same = [f.subject for f in deciding if text(f) == first]
    rest = len(deciding) - len(same)
    who = subject_range(list(dict.fromkeys(same)))
    prefix = f"{who}: " if len(set(same)) > 1 or who.startswith("gpu") else ""
    return prefix + first + (f" (+{rest} more)" if rest else "")


def _join(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def subject_range(subjects: list[str]) -> str:
    """["gpu0", "gpu1", "gpu2"] -> "gpu0-2"; ["gpu0", "gpu2", "gpu3"] -> "gpu0,2,3"."""
    if len(subjects) == 1:
        return subjects[0]
    numbers = [re.fullmatch(r"gpu(\d+)", s) for s in subjects]
    if subjects and all(numbers):
        idx = sorted(int(m.group(1)) for m in numbers)
        if idx == list(range(idx[0], idx[-1] + 1)):
            return f"gpu{idx[0]}-{idx[-1]}"
        return "gpu" + ",".join(str(i) for i in idx)
    return ",".join(dict.fromkeys(subjects))


# -- items with their own figures ------------------------------------------------------------------

def _telemetry(record: RunRecord) -> dict[str, dict]:
    """Sustained-load telemetry summaries per GPU (the benchmark's `sustained.telemetry` entries)."""
    return {m.subject: m.details for m in record.measurements if m.name == "sustained.telemetry" and m.details}


def _power_under_load(record: RunRecord) -> str:
    """What the GPUs drew under the sustained load: the seed's test is full-load power near the default."""
    draws = []  # (share of the limit, subject, watts)
    for subject, details in _telemetry(record).items():
        power = details.get("power") or {}
        if power.get("mean_w") is not None and power.get("mean_pct_of_limit") is not None:
            draws.append((power["mean_pct_of_limit"], subject, power["mean_w"]))
    if not draws:
        return ""
    low, high = min(draws), max(draws)
    if len(draws) == 1:
        return f"under sustained load {low[1]} drew {low[2]:.0f} W = {low[0]:.0f}% of its limit"
    return (f"under sustained load the GPUs drew {low[0]:.0f}-{high[0]:.0f}% of their limit "
            f"(lowest {low[1]}: {low[2]:.0f} W)")


_POWER_REASONS = {"hw_power_brake_slowdown", "hw_slowdown", "sw_power_cap"}


def _power_related(record: RunRecord, f: Finding) -> bool:
    """For the power wall: throttle findings count only where a power reason was active."""
    if f.check != "gpu.throttle":
        return True
    gpu = _gpu(record, f.subject)
    return gpu is not None and bool(_POWER_REASONS & set(gpu.clocks.event_reasons or []))


def _power_range(record: RunRecord) -> str:
    """Enforced limit against the default and what may be set: the wall, and how far it could move."""
    walls = []
    for gpu in record.machine.gpus:
        p = gpu.power
        enforced = p.enforced_limit_w if p.enforced_limit_w is not None else p.limit_w
        if enforced is None:
            continue
        text = f"{enforced:.0f} W"
        if p.default_limit_w:
            text += f" of {p.default_limit_w:.0f} W default"
        if p.max_limit_w:
            text += f", settable to {p.max_limit_w:.0f} W"
        walls.append((f"gpu{gpu.index}", text))
    if not walls:
        return ""
    texts = list(dict.fromkeys(t for _, t in walls))
    if len(texts) == 1:
        return f"limit {texts[0]}" + ("" if len(walls) == 1 else f" on all {len(walls)} GPUs")
    return "limits " + ", ".join(f"{s} {t}" for s, t in walls[:4]) + (" ..." if len(walls) > 4 else "")


def _gpu(record: RunRecord, subject: str) -> Gpu | None:
    return next((g for g in record.machine.gpus if f"gpu{g.index}" == subject), None)


_DRIVER_SOURCES, _HOST_SOURCES = ("nvml", "nvidia-smi"), ("sysfs", "lspci")
_VIEWS_DIFFER = "max link differs between views: "


def _pcie_views(record: RunRecord) -> str:
    """The link as the NVIDIA driver sees it next to the host's view (lspci/sysfs): the seed's
    cloud showed x16 in lspci and Max Link Width x8 in `nvidia-smi -q`."""
    disagree, shown = [], []
    for gpu in record.machine.gpus:
        driver = next((r for r in gpu.pcie.readings if r.source in _DRIVER_SOURCES and r.max_width), None)
        host = next((r for r in gpu.pcie.readings if r.source in _HOST_SOURCES and r.max_width), None)
        if driver and host and (driver.max_width, driver.max_gen) != (host.max_width, host.max_gen):
            disagree.append(f"gpu{gpu.index} driver Gen{driver.max_gen} x{driver.max_width}, "
                            f"{host.source} Gen{host.max_gen} x{host.max_width}")
        elif driver and host and not shown:
            shown.append(f"driver and {host.source} agree (max Gen{driver.max_gen} x{driver.max_width})")
    if disagree:
        return _VIEWS_DIFFER + "; ".join(disagree)
    return shown[0] if shown else ""


def _pcie_driver_view(record: RunRecord, item: Item) -> Line:
    line = _from_findings(record, item)  # its extra figure is _pcie_views
    if _VIEWS_DIFFER in line.figure and line.state in (TICKED, UNKNOWN):
        # The judge rates the best reading; two views that disagree are the seed's virtualised
        # link, worth a look even when the reading it chose is fine.
        line.state = WARNED
    return line


def _preemptible(record: RunRecord, item: Item) -> Line:
    stated = _yes_no(record.options.get("preemptible"))
    if stated is True:
        return Line(item, WARNED, "preemptible (as you stated): it can be reclaimed at any time; make the job resumable "
                                  "and keep checkpoints on persistent storage")
    if stated is False:
        return Line(item, TICKED, "not preemptible (as you stated)")
    return Line(item, UNKNOWN, "not visible from inside the machine: see the billing page or instance type, "
                               f"then tell gpuvet ({item.to_check})")


def _yes_no(value: object) -> bool | None:
    if isinstance(value, bool) or value is None:
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "y", "spot", "preemptible", "interruptible"):
        return True
    if text in ("0", "false", "no", "n", "on-demand", "ondemand", "reserved"):
        return False
    return None


ITEMS: tuple[Item, ...] = (
    Item("whole_card", ACCEPTANCE, "Whole GPU, not shared", "GPU是否独占整卡",
         ("gpu.isolation",), "gpuvet run"),
    Item("power_limit", ACCEPTANCE, "Power limit at the default", "是否有人为功耗限制",
         ("gpu.power_limit",), "gpuvet run", extra=_power_under_load),
    Item("pcie_link", ACCEPTANCE, "PCIe width and generation under load", "PCIe链路宽度",
         ("gpu.pcie_link", "gpu.pcie_bandwidth"), "gpuvet bench pcie", passing_figure="measured"),
    Item("storage_io", ACCEPTANCE, "Local disk and shared storage IO", "本地盘与共享存储IO",
         ("storage.*",), "gpuvet run", exclude=("storage.workdir",)),
    Item("rdma", ACCEPTANCE, "RDMA for multi-node training", "网络是否支持RDMA",
         ("net.rdma",), "gpuvet run"),
    Item("software_stack", ACCEPTANCE, "Software stack versions match", "镜像软件栈版本",
         ("stack.*",), "gpuvet run"),
    Item("preemptible", ACCEPTANCE, "Not preemptible", "实例是否可被抢占",
         (), "`gpuvet run --preemptible` or `--on-demand`", decide=_preemptible),
    Item("checkpoints", ACCEPTANCE, "Checkpoints on persistent storage", "数据备份方式",
         ("storage.workdir", "workload.checkpoint", "workload.resume"), "gpuvet run"),
    Item("pcie_driver_view", HIDDEN, "PCIe width as the driver sees it", "PCIe带宽可见性",
         ("gpu.pcie_link",), "gpuvet run", passing_figure="measured", extra=_pcie_views, decide=_pcie_driver_view),
    Item("power_wall", HIDDEN, "Power wall", "GPU功耗墙",
         ("gpu.power_limit", "gpu.throttle"), "gpuvet run", passing_figure="extra", keep=_power_related, extra=_power_range),
    Item("nvlink", HIDDEN, "NVLink between the GPUs", "NVLink互联",
         ("gpu.nvlink", "gpu.p2p", "gpu.allreduce"), "gpuvet bench p2p allreduce"),
    Item("context_init", HIDDEN, "CUDA context start-up time", "CUDA Context初始化延迟",
         ("gpu.context_init",), "gpuvet bench latency"),
    Item("tcp_latency", HIDDEN, "TCP stack latency", "TCP网络栈延迟",
         ("net.loopback",), "gpuvet run"),
)
