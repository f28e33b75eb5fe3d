"""The seeds' acceptance checklist, ticked from a run record.

The first seed ends with a table a person works through by hand before trusting a rented machine
(whole card? power cap? PCIe width? storage IO? RDMA? software stack? preemptible? backups?); the
second lists five "hidden parameters" no spec sheet shows. Each line here is ticked, crossed,
warned or left unknown from the findings that decide it, with the figure that decided it.

Pure functions of the record: nothing is measured or judged again here, so an old record shows
the same checklist it showed when it was made (apart from lines that need a check newer than the
record: those name the check it lacks).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

from ..facts import Gpu
from ..wording import NOT_IN_PLAY, subject_range
from ..specs.slowdowns import FAULTS, POWER_FAULTS, power_faults_under_load, short_load_words
from ..record import FAIL, MEASURED, PASS, SKIP, WARN, Finding, RunRecord

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
    ACCEPTANCE: "what a renter checks before trusting a rented machine with a long job: tick each",
    HIDDEN: "what the provider's spec sheet does not say, but your job feels",
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
    # only the item's "extra" figures (when the finding's words would repeat them), or only the
    # "required" checks' words (the checks that answer the line; the others could only cross it).
    passing_figure: str = "summary"
    keep: Callable[[RunRecord, Finding], bool] | None = None  # drop findings that do not bear on the item
    extra: Callable[[RunRecord], str] | None = None  # more figures from facts and measurements
    decide: Callable[[RunRecord, Item], Line] | None = None  # items whose figure needs more than the findings' words
    # Checks that must pass for a tick: where one was not judged (skipped: "cannot tell"), the line
    # is open with its words, however well the others did.
    required: tuple[str, ...] = ()
    # The line's state where its checks only measured, judging nothing (NVLink: "PCIe only: this
    # model has no NVLink" is a caveat for multi-GPU work); None: unknown, as a skip.
    measured_state: str | None = None


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
    return any(_names(c, f.check) for c in item.checks)


def _names(listed: str, check: str) -> bool:
    """Whether an item's entry ("gpu.pcie_link", or a family "storage.*") names the check."""
    return check == listed or (listed.endswith(".*") and check.startswith(listed[:-1]))


def _from_findings(record: RunRecord, item: Item) -> Line:
    found = [f for f in record.findings if _bears_on(item, f) and (item.keep is None or item.keep(record, f))]
    judged = [f for f in found if f.status in _SEVERITY]
    extra = item.extra(record) if item.extra else ""
    if not judged:
        measured = [f for f in found if f.status == MEASURED]
        if measured and item.measured_state:
            return Line(item, item.measured_state, _join(_figure(item, measured), extra), found)
        why = _skip_reasons(record, found) or f"not checked (run `{item.to_check}`)"
        first = [f for f in found if _names(item.checks[0], f.check)]
        if first and all(f.status == SKIP and NOT_IN_PLAY in f.summary for f in first):
            # The item's own check says the question does not arise here (one GPU: no NVLink to check).
            return Line(item, TICKED, _join(f"not applicable: {first[0].summary}", extra), found)
        return Line(item, UNKNOWN, _join(why, extra), found)
    worst = max(judged, key=lambda f: _SEVERITY[f.status]).status
    if worst == PASS and (open_ := _not_passed(item, record)):
        return Line(item, UNKNOWN, _join(open_, extra), found)
    deciding = sorted((f for f in judged if f.status == worst), key=lambda f: _rank_in(item, f))
    if worst == PASS and item.passing_figure == "required":
        deciding = [f for f in deciding if f.check in item.required] or deciding
    if worst == PASS and item.passing_figure == "extra" and extra:
        return Line(item, TICKED, extra, found)
    return Line(item, _STATE_OF[worst], _join(_figure(item, deciding), extra), found)


def _rank_in(item: Item, f: Finding) -> int:
    """Where the finding's check stands in the item's list: its words are shown in that order."""
    return next(i for i, c in enumerate(item.checks) if _names(c, f.check))


def _not_passed(item: Item, record: RunRecord) -> str:
    """Why a required check did not pass on every subject it judged: its words where it was
    skipped or only measured, or that it was not checked."""
    reasons = []
    for check in item.required:
        mine = [f for f in record.findings if f.check == check]
        if not mine:
            reasons.append(f"{check} not checked (run `{item.to_check}`)")
        elif open_ := [f for f in mine if f.status != PASS and f.status not in (WARN, FAIL)]:
            why = _figure(item, open_)
            reasons.append(why if "`" in why else f"{why}: run `{item.to_check}`")
    return "; ".join(reasons)


def _skip_reasons(record: RunRecord, found: list[Finding]) -> str:
    """Why the findings did not judge: each reason once. A machine whose GPUs could not be read
    gives that one reason in every GPU check ("no GPU facts: no NVIDIA driver", "no NVIDIA GPU: no
    NVIDIA driver"): said once."""
    root = (record.machine.gpu_error or "").split(":")[0]
    reasons: dict[str, str] = {}
    for f in found:
        if f.status in (SKIP, MEASURED):
            reasons.setdefault(root if root and root in f.summary else f.summary, f.summary)
    return "; ".join(reasons.values())


def _figure(item: Item, deciding: list[Finding]) -> str:
    """The first deciding finding's words, naming the subjects that share them; other subjects'
    words follow compactly, only where they differ from the first ("gpu1-5: 2.2 GiB")."""
    def text(f: Finding) -> str:
        if f.status == PASS and item.passing_figure == "measured" and f.evidence.measured:
            return f.evidence.measured
        return f.summary

    by_text: dict[str, list[str]] = {}
    for f in deciding:
        by_text.setdefault(text(f), []).append(f.subject)
    (first, same), *others = by_text.items()
    who = subject_range(list(dict.fromkeys(same)))
    prefix = f"{who}: " if len(set(same)) > 1 or who.startswith("gpu") else ""
    shown = [f"{subject_range(list(dict.fromkeys(subjects)))}: {_difference(first, other)}"
             for other, subjects in others[:MORE_SHOWN]]
    more = f" (+{len(others) - MORE_SHOWN} more)" if len(others) > MORE_SHOWN else ""
    return prefix + first + "".join(f"; {line}" for line in shown) + more


MORE_SHOWN = 3  # other subjects' differing words listed after the first finding's


def _difference(first: str, other: str) -> str:
    """The words of `other` that differ from `first`, a bare number with the word after it for
    sense ("2.2 GiB"); the whole text where most of it differs."""
    import difflib

    a, b = first.split(), other.split()
    parts = []
    for tag, _, _, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if tag in ("replace", "insert"):
            unit = j2 < len(b) and not re.search(r"[A-Za-z]", b[j2 - 1])  # "2.2" needs its "GiB"
            parts.append(" ".join(b[j1:j2 + 1] if unit else b[j1:j2]))
    changed = " … ".join(parts)
    readable = all(_whole_phrase(part) for part in parts)
    return changed if parts and readable and len(changed) < 0.6 * len(other) else other


def _whole_phrase(part: str) -> bool:
    """A fragment that reads on its own: brackets closed, not cut at a colon or semicolon ("58642)"
    or "1 inactive:;" are cut out of a sentence and mean nothing alone)."""
    return (part.count("(") == part.count(")") and part.count("[") == part.count("]")
            and not re.search(r"[:;,]$", part) and not re.match(r"^[:;,)\]]", part))


def _join(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


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


def _power_related(record: RunRecord, f: Finding) -> bool:
    """For the power wall: throttle and sustained-load findings count only where power was the reason."""
    if f.check == "gpu.throttle":
        reasons = set(_snapshot_reasons(record, f.subject))
        return bool(reasons & set(POWER_FAULTS)) or (f.status == PASS and "sw_power_cap" in reasons)
    if f.check == "gpu.sustained":
        return f.status == PASS or bool(_brakes_under_load(record, f.subject))
    return True


def _snapshot_reasons(record: RunRecord, subject: str) -> list[str]:
    gpu = _gpu(record, subject)
    return (gpu.clocks.event_reasons or []) if gpu else []


def _brakes_under_load(record: RunRecord, subject: str) -> list[str]:
    """ "HW power brake during 56% of the load": power faults the sustained-load telemetry saw (as gpu.sustained counts them)."""
    return power_faults_under_load(_telemetry(record).get(subject) or {})


def _power_wall_text(record: RunRecord, f: Finding) -> str:
    """The power part of a finding: what a brake cost under load, or what the snapshot flagged."""
    if f.check == "gpu.sustained":
        power = (_telemetry(record).get(f.subject) or {}).get("power") or {}
        drew = (f" at {power['mean_w']:.0f} W ({power['mean_pct_of_limit']:.0f}% of its limit)"
                if power.get("mean_w") is not None and power.get("mean_pct_of_limit") is not None else "")
        return "; ".join(_brakes_under_load(record, f.subject)) + drew
    if f.check == "gpu.throttle":
        names = [FAULTS[name] for name in POWER_FAULTS if name in _snapshot_reasons(record, f.subject)]
        gpu = _gpu(record, f.subject)
        sm, top = (gpu.clocks.sm_mhz, gpu.clocks.max_sm_mhz) if gpu else (None, None)
        if sm and top and sm >= top:
            # The flag and the clock were read at one instant: a clock at its max beside a brake
            # flag is a brake that comes and goes, which only a reading under load can size.
            clock = f" (SM clock at its full {top} MHz then: watch it under load)"
        else:
            clock = f" (SM {sm} of {top} MHz)" if sm and top else ""
        return f"{' and '.join(names)} flagged in the snapshot{clock}"
    return f.summary


def _power_wall(record: RunRecord, item: Item) -> Line:
    """Ticked only where the power limit was read (a `-q -d PERFORMANCE` report alone has none);
    every state shows the performance state with the clocks, the seeds' first look at the wall."""
    return _with_pstates(record, _power_wall_line(record, item))


def _with_pstates(record: RunRecord, line: Line) -> Line:
    states = _pstates(record)
    return Line(line.item, line.state, _join(line.figure, states), line.findings) if states else line


def _pstates(record: RunRecord) -> str:
    """ "P2 at SM 2520-2640 of 3105 MHz: gpu1,4; P8 at SM 210 of 3105 MHz: gpu0,2-3,5-7": the
    performance state each GPU was read in, with its SM clocks against the most they reach (a P0 GPU
    under load whose clock does not rise is held back by the power limit)."""
    groups: dict[int, list[Gpu]] = {}
    for gpu in record.machine.gpus:
        if gpu.pstate is not None:
            groups.setdefault(gpu.pstate, []).append(gpu)
    parts = []
    for pstate, gpus in sorted(groups.items()):
        clocks = sorted({g.clocks.sm_mhz for g in gpus if g.clocks.sm_mhz})
        tops = sorted({g.clocks.max_sm_mhz for g in gpus if g.clocks.max_sm_mhz})
        at = ""
        if clocks and tops:
            span = f"{clocks[0]}" if len(clocks) == 1 else f"{clocks[0]}-{clocks[-1]}"
            at = f" at SM {span} of {tops[-1]} MHz"
        parts.append(f"P{pstate}{at}: {subject_range([f'gpu{g.index}' for g in gpus])}")
    return "performance state " + "; ".join(parts) if parts else ""


def _power_wall_line(record: RunRecord, item: Item) -> Line:
    line = _from_findings(record, item)
    if line.state == TICKED:  # what a short load proved, and what it could not
        return Line(item, line.state, _join(line.figure, _short_load(record, line.findings)), line.findings)
    if line.state not in (CROSSED, WARNED):
        return line
    worst = CROSSED if line.state == CROSSED else WARNED
    deciding = [f for f in line.findings if _STATE_OF.get(f.status) == worst]
    deciding.sort(key=lambda f: f.check != "gpu.sustained")  # under load first, then the snapshot
    texts: dict[str, list[str]] = {}
    for f in deciding:
        texts.setdefault(_power_wall_text(record, f), []).append(f.subject)
    shown = [f"{subject_range(list(dict.fromkeys(who)))}: {text}" for text, who in list(texts.items())[:2]]
    more = f" (+{len(texts) - 2} more)" if len(texts) > 2 else ""
    return Line(item, line.state, _join("; ".join(shown) + more, _power_range(record)), line.findings)


def _short_load(record: RunRecord, findings: list[Finding]) -> str:
    """What the sustained load could not prove when it was too short to heat-soak the GPUs (the
    judge's own words, from the load's duration)."""
    passed = {f.subject for f in findings if f.check == "gpu.sustained" and f.status == PASS}
    durations = [m.details.get("duration_s") for m in record.measurements
                 if m.name == "sustained.tflops" and m.subject in passed and m.details]
    shortest = min((d for d in durations if isinstance(d, (int, float))), default=None)
    return short_load_words(shortest).removeprefix("; ") if shortest is not None else ""


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


# -- storage ---------------------------------------------------------------------------------------

def _storage_io(record: RunRecord, item: Item) -> Line:
    """Local disk and shared storage: the line as its findings have it (storage.shared says whether
    shared storage was among the tested paths), naming the paths that were tested."""
    line = _from_findings(record, item)
    tested = list(dict.fromkeys(f.subject for f in line.findings if f.status in _SEVERITY))
    if not tested or line.state == UNKNOWN:
        return line
    where = f"tested {', '.join(tested)}"
    return Line(item, line.state, _join(where, line.figure) if line.state == TICKED else _join(line.figure, where), line.findings)


ITEMS: tuple[Item, ...] = (
    Item("whole_card", ACCEPTANCE, "Whole GPU, not shared", "GPU是否独占整卡",
         ("gpu.isolation",), "gpuvet run"),
    Item("power_limit", ACCEPTANCE, "Power limit at the default", "是否有人为功耗限制",
         ("gpu.power_limit",), "gpuvet run", extra=_power_under_load),
    Item("pcie_link", ACCEPTANCE, "PCIe width and generation under load", "PCIe链路宽度",
         ("gpu.pcie_under_load", "gpu.pcie_link", "gpu.pcie_bandwidth"), "gpuvet bench pcie", passing_figure="required",
         required=("gpu.pcie_under_load",)),
    Item("storage_io", ACCEPTANCE, "Local disk and shared storage IO", "本地盘与共享存储IO",
         ("storage.*",), "gpuvet run", exclude=("storage.workdir", "storage.persistence", "storage.shared"),
         required=("storage.shared",), decide=_storage_io),
    Item("rdma", ACCEPTANCE, "RDMA for multi-node training", "网络是否支持RDMA",
         ("net.rdma",), "gpuvet run"),
    Item("software_stack", ACCEPTANCE, "Software stack versions match", "镜像软件栈版本",
         ("stack.*",), "gpuvet run"),
    Item("preemptible", ACCEPTANCE, "Not preemptible", "实例是否可被抢占",
         ("host.preemptible",), "gpuvet run --preemptible"),
    Item("checkpoints", ACCEPTANCE, "Checkpoints on persistent storage", "数据备份方式",
         ("storage.persistence", "storage.workdir", "workload.checkpoint", "workload.resume"), "gpuvet run",
         required=("storage.persistence",)),
    Item("pcie_driver_view", HIDDEN, "PCIe width as the driver sees it", "PCIe带宽可见性",
         ("gpu.pcie_driver_view", "gpu.pcie_link"), "gpuvet run", passing_figure="required", required=("gpu.pcie_driver_view",)),
    Item("power_wall", HIDDEN, "Power wall", "GPU功耗墙",
         ("gpu.power_limit", "gpu.throttle", "gpu.sustained"), "gpuvet run", passing_figure="extra", keep=_power_related,
         extra=_power_range, decide=_power_wall, required=("gpu.power_limit",)),
    Item("nvlink", HIDDEN, "NVLink between the GPUs", "NVLink互联",
         ("gpu.nvlink", "gpu.p2p", "gpu.allreduce"), "gpuvet bench p2p allreduce", measured_state=WARNED),
    # The first document's 8-core RTX 4090 instance was the starved one: CPU per GPU is on its list.
    Item("cpu", HIDDEN, "CPU cores to feed each GPU", "CPU核数", ("host.cpu", "host.cpu_feed"), "gpuvet run"),
    Item("context_init", HIDDEN, "CUDA context start-up time", "CUDA Context初始化延迟",
         ("gpu.context_init",), "gpuvet bench latency"),
    Item("tcp_latency", HIDDEN, "TCP stack latency", "TCP网络栈延迟",
         ("net.loopback",), "gpuvet run"),
)
