"""Why is the job slow right now? Rules over a sliding window of live telemetry: one diagnosis per GPU.

`gpuvet watch` feeds them the samples of `telemetry.Sampler`, the host's CPU / steal / IO-wait
readings, who holds the GPU, and the GPU's facts read once at start. Pure functions: nothing here
reads the machine, so recorded series can be diagnosed anywhere (the tests do).

Each diagnosis has a stable `state` (a Prometheus label value; dashboards and alerts depend on it),
a one-line text that says what was seen, and the numbers behind it. When several rules match, the
first one in RULE_ORDER is the diagnosis and the others are listed in `also`: a platform fault
(heat, a power brake) explains a slow job before a starving input pipeline does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable

from ..catalog import checked
from ..facts import Gpu
from ..wording import DIAGNOSIS_LABELS
from ..record import MEASURED, Finding
from ..record.details import TelemetrySummary
from ..samples import Sample, summarize
from ..specs import reference
from .common import FAIL, NO_CONTEXT_MIB, PASS, SKIP, WARN, finding
from .gpu_power import CAP_WARN_RATIO
from .gpu_sustained import FAULTS as FAULT_LABELS  # short names of the slowdown reasons
from .gpu_sustained import CLOCK_HELD_RATIO, DECAY_WARN_PCT, FAULT_SHARE, HOT_MARGIN_C, rated_clock

# The checks this module judges, by their catalogue ids (catalog.checked refuses an id it lacks).
WATCH_DIAGNOSIS = checked("watch.diagnosis")
WATCH_GPUS = checked("watch.gpus")
WATCH_JOB = checked("watch.job")

WINDOW_S = 60.0  # "the last minute": smooths NVML's 1/6..1 s utilization periods, still recent
TREND_WINDOW_S = 600.0  # "slower and slower" compares the first and last fifth of 10 minutes
MIN_TREND_S = 120.0  # below this, a drift is noise (clocks settle, the job warms up)
SNAPSHOT_S = 5.0  # a window shorter than this is a snapshot, and its words say so

BUSY_UTIL_PCT = 90.0  # mean utilization of a GPU that is fed well
IDLE_SHARE_PCT = 25.0  # idle at least this share of the window: something upstream starves the GPU
NOTHING_RUNS_PCT = 1.0  # mean utilization below this and no process of yours: nothing runs
# Busy, SM clock under CLOCK_HELD_RATIO of max, power to spare: held back by a setting (the same
# ratio as the sustained-load check); at HOT_MARGIN_C from slowdown, clocks are being cut.
HELD_MIN_SPAN_S = 10.0  # a clock is read at an instant: "held" needs readings over this long, not a snapshot
AT_LIMIT_PCT = 90.0  # mean draw at >= 90% of the enforced limit: the limit binds
HIDDEN_MIB = 1024  # memory nobody you can see accounts for; idle drivers hold a few hundred MiB
NEIGHBOUR_UTIL_PCT = 10.0  # utilization on a GPU none of your processes holds
WORKER_BUSY_PCT = 80.0  # a worker process using >= 80% of a core runs flat out
CPU_BUSY_PCT = 90.0
STEAL_PCT = 10.0  # the hypervisor gives your vCPUs' time to others
IOWAIT_PCT = 10.0
TEMP_RISE_C = 5.0

_THERMAL = ("hw_thermal_slowdown", "sw_thermal_slowdown")
_HOST_CAUSES = ("cpu_steal", "input_bound", "io_bound")
_HW_CUT = ("hw_slowdown", "hw_power_brake_slowdown")

# state -> the words a person reads first. States are stable: they are Prometheus label values.
LABELS = DIAGNOSIS_LABELS
STATES: tuple[str, ...] = tuple(LABELS)
GPU_STATES: tuple[str, ...] = tuple(s for s in STATES if s not in ("no_gpu", "job_gone"))


@dataclass(frozen=True)
class Diagnosis:
    state: str
    detail: str  # what was seen, with numbers
    evidence: dict[str, Any] = field(default_factory=dict)
    also: tuple[str, ...] = ()  # other states whose rules matched too, most important first

    @property
    def label(self) -> str:
        return LABELS[self.state]

    @property
    def text(self) -> str:
        return f"{self.label}: {self.detail}"

    def to_dict(self) -> dict[str, Any]:
        return {"state": self.state, "text": self.text, "evidence": self.evidence, "also": list(self.also)}


@dataclass
class HostSample:
    """One reading of the host, as the rules need it (percentages over the time since the last one)."""

    t: float
    cpu_pct: float | None = None  # all CPUs together, % of their capacity
    steal_pct: float | None = None
    iowait_pct: float | None = None
    cpu_count: int | None = None
    workers: int = 0  # DataLoader-like worker processes (python children busy on CPU)
    workers_cpu_pct: float | None = None  # their mean CPU, % of one core each


@dataclass(frozen=True)
class GpuProcessSeen:
    """A process NVML lists on a GPU, as this session sees it."""

    pid: int
    used_mib: int | None = None
    visible: bool = True  # False: not in this machine's (container's) process table
    in_job: bool | None = None  # with --pid: part of the followed job's process tree
    name: str | None = None


# -- the window ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Ctx:
    gpu: Gpu
    recent: list[Sample]
    summary: TelemetrySummary  # samples.summarize(recent)
    trend: list[Sample]
    processes: list[GpuProcessSeen] | None
    host: dict | None  # _host_summary
    following_job: bool
    in_container: bool

    @property
    def util(self) -> float | None:
        return self.summary["util_pct"]["mean"]

    @property
    def idle_pct(self) -> float | None:
        return None if self.util is None else max(0.0, 100.0 - self.util)

    @property
    def sm_ratio(self) -> float | None:
        # Against the clock the GPU is rated to hold under load, not a GeForce card's NVML ceiling.
        sm, (top, _) = self.summary["sm_mhz"]["mean"], rated_clock(self.gpu, reference.match(self.gpu.name, self.gpu.memory_total_mib))
        return sm / top if sm is not None and top else None

    @property
    def shares(self) -> dict[str, float]:
        return self.summary["reasons"] or {}

    def last(self, field_name: str) -> Any:
        return next((getattr(s, field_name) for s in reversed(self.recent) if getattr(s, field_name) is not None), None)

    @property
    def span(self) -> str:
        """The time the window covers, in words: a snapshot (`watch --once`: two readings 0.5 s apart)
        must not read like a minute's diagnosis."""
        span_s = self.summary["duration_s"] or 0.0
        if len(self.recent) < 2:
            return "a single reading (a snapshot)"
        if span_s < SNAPSHOT_S:
            return f"a {span_s:.1f} s snapshot"
        return "the last minute" if span_s >= 50 else f"the last {span_s:.0f} s"

    @property
    def unmapped_in_container(self) -> bool:
        """NVML lists processes on the GPU and none of them is in this container's process table:
        NVML gives host pids, which a container with its own PID namespace cannot map. They may be
        the user's own, so they are not a neighbour."""
        return self.in_container and bool(self.processes) and not any(p.visible for p in self.processes or [])

    @property
    def yours(self) -> list[GpuProcessSeen]:
        """Processes on the GPU that are the user's: visible here, and in the job when one is followed."""
        return [p for p in self.processes or [] if p.visible and not (self.following_job and p.in_job is False)]


def recent(samples: list[Sample], window_s: float) -> list[Sample]:
    """The samples of the last `window_s` seconds (by their own clock, not the wall's)."""
    if not samples:
        return []
    start = samples[-1].t - window_s
    return [s for s in samples if s.t > start]  # 60 one-second samples span a minute


def _host_summary(host: list[HostSample]) -> dict | None:
    def mean(name: str) -> float | None:
        values = [getattr(h, name) for h in host if getattr(h, name) is not None]
        return sum(values) / len(values) if values else None

    if not host:
        return None
    with_workers = [h for h in host if h.workers]
    return {
        "cpu_pct": mean("cpu_pct"),
        "steal_pct": mean("steal_pct"),
        "iowait_pct": mean("iowait_pct"),
        "workers": max((h.workers for h in host), default=0),
        "workers_cpu_pct": (sum(h.workers_cpu_pct or 0.0 for h in with_workers) / len(with_workers)) if with_workers else None,
    }


def _r(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def _base_evidence(ctx: _Ctx) -> dict[str, Any]:
    s = ctx.summary
    return {
        "samples": s["count"],
        "span_s": s["duration_s"],
        "util_pct": _r(ctx.util),
        "sm_mhz": _r(s["sm_mhz"]["mean"], 0),
        "sm_pct_of_max": _r(None if ctx.sm_ratio is None else 100 * ctx.sm_ratio),
        "power_w": _r(s["power"]["mean_w"]),
        "power_pct_of_limit": _r(s["power"]["mean_pct_of_limit"]),
        "temp_c": ctx.last("temp_c"),
        "reasons": s["reasons"],
    }


def _clock_words(ctx: _Ctx) -> str:
    if ctx.sm_ratio is not None:
        return f"SM clock at {100 * ctx.sm_ratio:.0f}% of max"
    sm = ctx.summary["sm_mhz"]["mean"]
    return f"SM clock {sm:.0f} MHz" if sm is not None else "SM clock unknown"


def _load_words(ctx: _Ctx) -> str:
    """"util 100% but SM clock at 62% of max" when a busy GPU runs slow; plain numbers otherwise."""
    if ctx.util is None:
        return _clock_words(ctx)
    cut = ctx.util >= 50 and ctx.sm_ratio is not None and ctx.sm_ratio < 0.9
    return f"util {ctx.util:.0f}%{' but ' if cut else ', '}{_clock_words(ctx)}"


def _active(ctx: _Ctx, reasons: tuple[str, ...]) -> list[str]:
    return [r for r in reasons if (ctx.shares.get(r) or 0.0) > FAULT_SHARE]


def _reason_words(ctx: _Ctx, reasons: list[str]) -> str:
    parts = []
    for r in reasons:
        share = ctx.shares[r]
        parts.append(FAULT_LABELS[r] + ("" if share >= 0.95 else f" {100 * share:.0f}% of the time"))
    return " and ".join(parts) + " active"


def _margin_c(ctx: _Ctx) -> float | None:
    temp, slowdown = ctx.last("temp_c"), ctx.gpu.thermal.slowdown_c
    return slowdown - temp if temp is not None and slowdown is not None else None


# -- the rules, most important first ---------------------------------------------------------------

def _thermal(ctx: _Ctx) -> Diagnosis | None:
    reasons = _active(ctx, _THERMAL)
    margin = _margin_c(ctx)
    at_threshold = margin is not None and margin <= HOT_MARGIN_C
    if not reasons and not at_threshold:
        return None
    words = f"{_load_words(ctx)}, " + (_reason_words(ctx, reasons) if reasons else "at the slowdown temperature")
    temp = ctx.last("temp_c")
    if temp is not None:
        words += f" ({temp:.0f} C" + (f", {margin:.0f} C from slowdown)" if margin is not None else ")")
    return Diagnosis("thermal", words, {**_base_evidence(ctx), "slowdown_margin_c": margin})


def _hw_slowdown(ctx: _Ctx) -> Diagnosis | None:
    reasons = _active(ctx, _HW_CUT)
    if not reasons:
        return None
    words = f"{_load_words(ctx)}, {_reason_words(ctx, reasons)} (hardware: power supply, power brake or overheating board)"
    return Diagnosis("hw_slowdown", words, _base_evidence(ctx))


@dataclass
class _Sharing:
    """Who else is on a watched GPU: what its process list and memory say."""

    others: list[Any]  # other jobs' processes you can see (with --pid)
    others_mib: float
    unseen_mib: float | None  # memory no visible process accounts for (None: a visible one's is unknown)
    util_theirs: bool  # the GPU is busy and none of its work is yours

    @property
    def hidden(self) -> bool:
        return self.unseen_mib is not None and self.unseen_mib >= HIDDEN_MIB

    @property
    def shared(self) -> bool:
        return self.hidden or self.util_theirs or self.others_mib >= HIDDEN_MIB


def _sharing(ctx: _Ctx) -> _Sharing:
    yours, used = ctx.yours, ctx.last("mem_used_mib")
    processes = ctx.processes or []
    others = [p for p in processes if p.visible and p not in yours]
    visible_mib = [p.used_mib for p in processes if p.visible]
    known_mib = [mib for mib in visible_mib if mib is not None]
    unseen_mib = max(0, used - sum(known_mib)) if used is not None and len(known_mib) == len(visible_mib) else None
    # Utilization on a GPU that lists no process and holds too little memory for a CUDA context
    # is the driver waking it for each query (persistence mode off), not someone's kernel.
    no_context = not processes and used is not None and used < NO_CONTEXT_MIB
    util_theirs = not yours and not no_context and ctx.util is not None and ctx.util >= NEIGHBOUR_UTIL_PCT
    return _Sharing(others, sum(p.used_mib or 0 for p in others), unseen_mib, util_theirs)


def _neighbour(ctx: _Ctx) -> Diagnosis | None:
    if ctx.processes is None or ctx.unmapped_in_container:  # cannot tell whose they are
        return None
    sharing = _sharing(ctx)
    if not sharing.shared:
        return None
    evidence = {**_base_evidence(ctx), "unseen_mib": sharing.unseen_mib, "other_jobs_mib": sharing.others_mib,
                "your_processes": len(ctx.yours), "other_processes": len(sharing.others)}
    return Diagnosis("neighbour", _neighbour_words(ctx, sharing), evidence)


def _neighbour_words(ctx: _Ctx, sharing: _Sharing) -> str:
    parts = []
    if sharing.util_theirs:
        parts.append(f"{ctx.util:.0f}% utilization")
    if sharing.hidden and sharing.unseen_mib is not None:
        parts.append(f"{sharing.unseen_mib / 1024:.1f} GiB in use")
    words = " and ".join(parts)
    if words and (sharing.hidden or not sharing.others):
        words += " by processes you cannot see"
    if sharing.others:
        listed = ", ".join(f"{p.pid} {p.name or '?'}" for p in sharing.others[:3])
        outside = (f"{sharing.others_mib / 1024:.1f} GiB held by {len(sharing.others)} process(es) outside your job "
                   f"({listed})")
        words += ("; " if words else "") + outside
    return words


def _at_power_limit(ctx: _Ctx) -> bool:
    pct = ctx.summary["power"]["mean_pct_of_limit"]
    busy = ctx.util is not None and ctx.util >= 50  # the driver keeps sw_power_cap set at idle
    return (pct is not None and pct >= AT_LIMIT_PCT) or (busy and (ctx.shares.get("sw_power_cap") or 0) >= 0.5)


def _power_capped(ctx: _Ctx) -> Diagnosis | None:
    default = ctx.gpu.power.default_limit_w
    limit = ctx.last("power_limit_w") or ctx.gpu.power.enforced_limit_w
    power = ctx.summary["power"]["mean_w"]
    if not default or not limit or power is None or limit >= CAP_WARN_RATIO * default or not _at_power_limit(ctx):
        return None
    words = (f"holding {power:.0f} W = {100 * power / default:.0f}% of the {default:.0f} W default "
             f"(limit set to {limit:.0f} W); {_clock_words(ctx)}")
    return Diagnosis("power_capped", words, {**_base_evidence(ctx), "power_limit_w": limit, "default_limit_w": default})


def _clocks_held(ctx: _Ctx) -> Diagnosis | None:
    power_pct = ctx.summary["power"]["mean_pct_of_limit"]
    app_clocks = (ctx.shares.get("applications_clocks_setting") or 0) >= 0.5
    if ctx.util is None or ctx.util < BUSY_UTIL_PCT or ctx.sm_ratio is None or ctx.sm_ratio >= CLOCK_HELD_RATIO:
        return None
    if (ctx.summary["duration_s"] or 0.0) < HELD_MIN_SPAN_S:
        return None
    if _active(ctx, _THERMAL + _HW_CUT) or power_pct is None or power_pct >= AT_LIMIT_PCT:
        return None  # explained by a slowdown reason, or by the power limit
    cause = ("an application-clocks setting holds them (`nvidia-smi -rac` resets it)" if app_clocks
             else "no slowdown reason: application clocks, firmware or the platform hold them")
    words = f"util {ctx.util:.0f}% but {_clock_words(ctx)} while drawing {power_pct:.0f}% of the power limit; {cause}"
    return Diagnosis("clocks_held", words, _base_evidence(ctx))


def _starved(ctx: _Ctx) -> bool:
    """Idle a good share of the window while something of yours runs on it."""
    if ctx.idle_pct is None or ctx.idle_pct < IDLE_SHARE_PCT:
        return False
    return bool(ctx.yours) or (ctx.util or 0) >= NOTHING_RUNS_PCT


def _host_evidence(ctx: _Ctx) -> dict[str, Any]:
    h = ctx.host or {}
    return {**_base_evidence(ctx), "idle_pct": _r(ctx.idle_pct), **{k: _r(v) if isinstance(v, float) else v for k, v in h.items()}}


def _cpu_steal(ctx: _Ctx) -> Diagnosis | None:
    steal = (ctx.host or {}).get("steal_pct")
    if not _starved(ctx) or steal is None or steal < STEAL_PCT:
        return None
    words = f"GPU idle {ctx.idle_pct:.0f}% of {ctx.span} while the hypervisor takes {steal:.0f}% of CPU time (steal)"
    return Diagnosis("cpu_steal", words, _host_evidence(ctx))


def _input_bound(ctx: _Ctx) -> Diagnosis | None:
    h = ctx.host or {}
    if not _starved(ctx) or not h:
        return None
    workers, worker_cpu, cpu = h.get("workers") or 0, h.get("workers_cpu_pct"), h.get("cpu_pct")
    if workers and worker_cpu is not None and worker_cpu >= WORKER_BUSY_PCT:
        what = f"{workers} worker process{'es' if workers > 1 else ''} use {worker_cpu:.0f}% CPU{' each' if workers > 1 else ''}"
    elif cpu is not None and cpu >= CPU_BUSY_PCT:
        what = f"the CPUs are {cpu:.0f}% busy"
    else:
        return None
    return Diagnosis("input_bound", f"GPU idle {ctx.idle_pct:.0f}% of {ctx.span} while {what}", _host_evidence(ctx))


def _io_bound(ctx: _Ctx) -> Diagnosis | None:
    iowait = (ctx.host or {}).get("iowait_pct")
    if not _starved(ctx) or iowait is None or iowait < IOWAIT_PCT:
        return None
    words = f"GPU idle {ctx.idle_pct:.0f}% of {ctx.span} while the CPUs wait on storage {iowait:.0f}% of the time"
    return Diagnosis("io_bound", words, _host_evidence(ctx))


@dataclass(frozen=True)
class _Point:
    """A sample with the utilization and SM clock read: a point of the throughput trend."""

    t: float
    util_pct: int
    sm_mhz: int
    temp_c: float | None


def _fifths(points: list[_Point]) -> tuple[list[_Point], list[_Point]]:
    """The first and last fifth of the span; each holds at least its end point."""
    t0, t1 = points[0].t, points[-1].t
    fifth = (t1 - t0) / 5
    return [p for p in points if p.t <= t0 + fifth], [p for p in points if p.t >= t1 - fifth]


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _average(values: list[float]) -> float:
    """The mean of values that cannot be empty (a fifth of the trend)."""
    return sum(values) / len(values)


def _slowing(ctx: _Ctx) -> Diagnosis | None:
    """Throughput proxy (utilization x SM clock) falling over minutes: heat soak, a neighbour arriving."""
    trend = [_Point(s.t, s.util_pct, s.sm_mhz, s.temp_c) for s in ctx.trend if s.util_pct is not None and s.sm_mhz is not None]
    if len(trend) < 10 or trend[-1].t - trend[0].t < MIN_TREND_S:
        return None
    first, last = _fifths(trend)
    util_first, util_last = _average([s.util_pct for s in first]), _average([s.util_pct for s in last])
    if not util_first or util_first < 50:  # it was not doing much to begin with
        return None
    proxy_first = _average([s.util_pct * s.sm_mhz for s in first])
    proxy_last = _average([s.util_pct * s.sm_mhz for s in last])
    drop = 100.0 * (1.0 - proxy_last / proxy_first) if proxy_first else 0.0
    if drop < DECAY_WARN_PCT:
        return None
    minutes = (trend[-1].t - trend[0].t) / 60
    temps_first = _mean([s.temp_c for s in first if s.temp_c is not None])
    temps_last = _mean([s.temp_c for s in last if s.temp_c is not None])
    rise = temps_last - temps_first if temps_first is not None and temps_last is not None else None
    sm_change = 100.0 * (_average([s.sm_mhz for s in last]) / _average([s.sm_mhz for s in first]) - 1.0)
    util_change = 100.0 * (util_last / util_first - 1.0)
    words = f"throughput proxy (utilization x SM clock) down {drop:.0f}% over {minutes:.0f} min"
    if rise is not None and rise >= TEMP_RISE_C:
        words += f" while temperature rose {rise:.0f} C"
    words += f" (SM clock {sm_change:+.0f}%, utilization {util_change:+.0f}%)"
    evidence = {**_base_evidence(ctx), "trend_s": round(trend[-1].t - trend[0].t, 1), "drop_pct": _r(drop),
                "temp_rise_c": _r(rise), "sm_change_pct": _r(sm_change), "util_change_pct": _r(util_change)}
    return Diagnosis("slowing", words, evidence)


def _underused(ctx: _Ctx) -> Diagnosis | None:
    if not _starved(ctx):
        return None
    words = f"GPU idle {ctx.idle_pct:.0f}% of {ctx.span}"
    h = ctx.host
    if h is not None:
        cpu = h.get("cpu_pct")
        busy = f"CPU {cpu:.0f}%" if cpu is not None else "CPU unknown"
        workers = h.get("workers") or 0
        busy += f", {workers} worker process{'es' if workers != 1 else ''}"
        words += (f"; the host is not the bottleneck ({busy}): the job waits on something else "
                  "(network, synchronisation, small batches)")
    return Diagnosis("underused", words, _host_evidence(ctx))


def _idle(ctx: _Ctx) -> Diagnosis | None:
    if ctx.util is None or ctx.util >= NOTHING_RUNS_PCT or ctx.yours:
        return None
    used = ctx.last("mem_used_mib")
    memory = f", {used / 1024:.1f} GiB used" if used is not None else ""
    return Diagnosis("idle", f"nothing runs on it ({ctx.util:.0f}% utilization{memory})", _base_evidence(ctx))


def _ok(ctx: _Ctx) -> Diagnosis:
    s = ctx.summary
    parts = []
    if ctx.util is not None:
        parts.append(f"{ctx.util:.0f}% busy")
    if s["sm_mhz"]["mean"] is not None:
        parts.append(f"SM {s['sm_mhz']['mean']:.0f} MHz" + (f" = {100 * ctx.sm_ratio:.0f}% of max" if ctx.sm_ratio else ""))
    power, pct = s["power"]["mean_w"], s["power"]["mean_pct_of_limit"]
    if power is not None:
        parts.append(f"{power:.0f} W" + (f" = {pct:.0f}% of the limit" if pct is not None else ""))
    temp, margin = ctx.last("temp_c"), _margin_c(ctx)
    if temp is not None:
        parts.append(f"{temp:.0f} C" + (f" ({margin:.0f} C below slowdown)" if margin is not None else ""))
    words = ", ".join(parts) or "no reading says otherwise"
    if _at_power_limit(ctx):
        words += "; at its power limit, normal under full load"
    return Diagnosis("ok", words, _base_evidence(ctx))


Rule = Callable[[_Ctx], "Diagnosis | None"]
RULE_ORDER: tuple[tuple[str, Rule], ...] = (
    ("thermal", _thermal),
    ("hw_slowdown", _hw_slowdown),
    ("neighbour", _neighbour),
    ("power_capped", _power_capped),
    ("clocks_held", _clocks_held),
    ("cpu_steal", _cpu_steal),
    ("input_bound", _input_bound),
    ("io_bound", _io_bound),
    ("slowing", _slowing),
    ("underused", _underused),
    ("idle", _idle),
)
# Most to least important, for picking one line out of several GPUs' (a job on many GPUs).
SEVERITY: tuple[str, ...] = ("lost", "job_gone",) + tuple(name for name, _ in RULE_ORDER) + ("no_gpu", "no_data", "ok")


UNMAPPED_WORDS = "processes NVML lists are not visible in this container (PID namespace): they may be yours"
LOST_CHECK = "check `nvidia-smi`, `dmesg | grep -i xid`; the job on it has failed or will"


def lost_words(reason: str) -> str:
    """A GPU NVML can no longer read, in words: what happened and what to look at."""
    if "GPU is lost" in reason:
        return f"GPU fell off the bus ({reason}): {LOST_CHECK}"
    return f"NVML can no longer read the GPU ({reason}): {LOST_CHECK}"


def diagnose_gpu(
    samples: list[Sample],
    gpu: Gpu,
    processes: list[GpuProcessSeen] | None = None,
    host: list[HostSample] | None = None,
    following_job: bool = False,
    in_container: bool = False,
    window_s: float = WINDOW_S,
    trend: list[Sample] | None = None,
    lost: str | None = None,
) -> Diagnosis:
    """One GPU's diagnosis from its samples (oldest first), the processes NVML lists on it now (None:
    NVML cannot list them), and the host's samples. `trend`: samples for the 10-minute trend when the
    caller keeps them apart (thinned to one a second); by default the last TREND_WINDOW_S of `samples`.
    `lost`: why NVML can no longer read the GPU (telemetry.gpu_gone_reason); it overrides the rest,
    whose samples predate it."""
    if lost:
        return Diagnosis("lost", lost_words(lost), {"nvml_error": lost})
    window = recent(samples, window_s)
    summary = summarize(window)
    if not window or (summary["util_pct"]["mean"] is None and summary["power"]["mean_w"] is None
                      and summary["sm_mhz"]["mean"] is None):
        return Diagnosis("no_data", "no reading of this GPU yet" if not window else "NVML gives no utilization, clock or power",
                         {"samples": len(window)})
    host_window = [h for h in host or [] if h.t >= window[-1].t - window_s]
    ctx = _Ctx(gpu=gpu, recent=window, summary=summary, trend=recent(samples if trend is None else trend, TREND_WINDOW_S),
               processes=processes, host=_host_summary(host_window), following_job=following_job,
               in_container=in_container)
    found = [d for _, rule in RULE_ORDER if (d := rule(ctx)) is not None]
    if any(d.state in _HOST_CAUSES for d in found):  # "underused" means: no host cause found
        found = [d for d in found if d.state != "underused"]
    main = found[0] if found else _ok(ctx)
    detail, evidence = main.detail, main.evidence
    if ctx.unmapped_in_container:
        detail += f"; {UNMAPPED_WORDS}"
        evidence = {**evidence, "unmapped_processes": len(ctx.processes or [])}
    return Diagnosis(main.state, detail, evidence, tuple(d.state for d in found[1:]))


def diagnose_job(alive: bool, gpu_diagnoses: dict[int, Diagnosis], processes_listed: bool = True,
                 maybe_diagnoses: dict[int, Diagnosis] | None = None) -> Diagnosis:
    """The followed job's line: the most important diagnosis among the GPUs it holds.

    `maybe_diagnoses`: in a container, the GPUs whose processes NVML lists but this container cannot
    map to its own (PID namespace); when none of the job's processes is seen on a GPU, they may be
    the job's, and its line is theirs, saying so (not "holds no GPU")."""
    if not alive:
        return Diagnosis("job_gone", "the process has exited")
    if not gpu_diagnoses and maybe_diagnoses:
        index, worst = _worst(maybe_diagnoses)
        which = (f"GPU {index}" if len(maybe_diagnoses) == 1
                 else f"GPUs {', '.join(map(str, sorted(maybe_diagnoses)))} (the worst: GPU {index})")
        detail = worst.detail if UNMAPPED_WORDS in worst.detail else f"{worst.detail}; {UNMAPPED_WORDS}"
        return Diagnosis(worst.state, f"maybe {which}: {detail}",
                         {"gpu": index, "maybe_gpus": sorted(maybe_diagnoses), **worst.evidence},
                         _other_states(maybe_diagnoses, index, worst))
    if not gpu_diagnoses:
        why = ("none of its processes holds a GPU" if processes_listed
               else "NVML does not list GPU processes here, so which GPU it uses is unknown")
        return Diagnosis("no_gpu", why)
    index, worst = _worst(gpu_diagnoses)
    return Diagnosis(worst.state, f"GPU {index}: {worst.detail}", {"gpu": index, **worst.evidence},
                     _other_states(gpu_diagnoses, index, worst))


def _worst(diagnoses: dict[int, Diagnosis]) -> tuple[int, Diagnosis]:
    return min(diagnoses.items(), key=lambda item: (SEVERITY.index(item[1].state), item[0]))


def _other_states(diagnoses: dict[int, Diagnosis], index: int, worst: Diagnosis) -> tuple[str, ...]:
    return tuple(sorted({d.state for i, d in diagnoses.items()
                         if i != index and d.state not in (worst.state, "ok", "no_data")}, key=SEVERITY.index))


# -- a watch log's diagnosis changes as findings ---------------------------------------------------

# What to run when a GPU spent time in a state: the command that confirms the cause (or fixes it).
WATCH_REMEDIES = {
    "lost": "`nvidia-smi` (the GPU missing or \"Unknown Error\"), `dmesg | grep -i xid` (Xid 79: fallen off the bus); "
            "a GPU that falls off the bus needs a reset or a reboot, and a repeat is the provider's to fix",
    "thermal": "watch clocks and temperature under load: `nvidia-smi -q -d PERFORMANCE,TEMPERATURE`; check airflow and fans "
               "with the provider",
    "hw_slowdown": "`nvidia-smi -q -d PERFORMANCE` names the reason; a power brake or HW slowdown is the host's power "
                   "supply or board: ask the provider",
    "neighbour": "`nvidia-smi --query-compute-apps=pid,used_memory --format=csv` lists what holds the GPU; another "
                 "tenant's process is the provider's to explain",
    "power_capped": "`nvidia-smi -q -d POWER` shows the limit; `sudo nvidia-smi -pl <default W>` restores it where allowed",
    "clocks_held": "`nvidia-smi -q -d CLOCK` shows application clocks; `sudo nvidia-smi -rac` resets them",
    "cpu_steal": "`vmstat 1` (the st column) confirms it; a dedicated-CPU instance or another host avoids it",
    "input_bound": "more DataLoader workers (num_workers), pinned memory, or preprocessing off the training path",
    "io_bound": "`iostat -x 1` shows the busy device; stage the data on local NVMe or in memory",
    "slowing": "`gpuvet run --soak 10` measures the same decay under a known load",
    "underused": "profile a step (torch.profiler) to see what the GPU waits on: synchronisation, small batches, network",
}
WATCH_SOURCE = "gpuvet watch's diagnosis rules (gpuvet/judge/diagnose.py), one diagnosis per GPU each second"
_NOT_A_PROBLEM = ("ok", "idle", "no_data", "job_gone", "no_gpu")


def _minutes(seconds: float) -> str:
    if seconds < 10:
        return f"{seconds:.1f} s"
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def state_durations(sessions: list[tuple[list[tuple[float, str, str]], float]]) -> dict[str, tuple[float, float, str]]:
    """Seconds in each state from a log's diagnosis changes: per session, (changes [(t, state, text)]
    in time order, the session's end t); a state lasts until the next change or the end.
    -> {state: (seconds, first t, first text)}; the first t counts from its session's start."""
    found: dict[str, tuple[float, float, str]] = {}
    for changes, end_t in sessions:
        for (t, state, text), following in zip(changes, list(changes[1:]) + [(end_t, None, None)]):
            seconds = max(0.0, following[0] - t)
            before = found.get(state)
            found[state] = (seconds, t, text) if before is None else (before[0] + seconds, before[1], before[2])
    return found


def watch_findings(subject: str, sessions: list[tuple[list[tuple[float, str, str]], float]],
                   t0: float | None = None) -> list[Finding]:
    """A watched GPU's time in each state as findings: a WARN per troubled state ("power-capped 35% of
    the watched time"), FAIL for heat or a hardware slowdown over FAULT_SHARE of it and for a GPU
    lost at any time; PASS when it never left ok / idle. Time before the first diagnosis (no_data) is not counted.
    `t0`: when a log of one session began (epoch seconds), so a state is placed on the clock ("first
    at 2026-12-04 03:00:12 UTC (+10800 s)"): a job that turned slow at 3 a.m. is found at 3 a.m."""
    durations = state_durations(sessions)
    watched = sum(seconds for state, (seconds, _, _) in durations.items() if state != "no_data")
    if watched <= 0 and "lost" not in durations:
        return []
    out = []
    for state in SEVERITY:
        # A GPU lost as the log ends has no time in that state yet, and is the worst news of all.
        if state in _NOT_A_PROBLEM or state not in durations or (durations[state][0] <= 0 and state != "lost"):
            continue
        seconds, first_t, text = durations[state]
        share = seconds / watched if watched > 0 else 1.0
        status = FAIL if state == "lost" or (state in ("thermal", "hw_slowdown") and share > FAULT_SHARE) else WARN
        at = _on_the_clock(t0, first_t)
        summary = (f"the GPU was lost at {at} (NVML could no longer read it)" if state == "lost" else
                   f"{LABELS[state]} {100 * share:.0f}% of the watched time ({_minutes(seconds)} of {_minutes(watched)})")
        out.append(finding(
            f"watch.{state}", subject, status, summary,
            measured=f"{_minutes(seconds)} of {_minutes(watched)} watched; first at {at}: {text}",
            expected="ok (or idle) for the whole watch", source=WATCH_SOURCE, remedy=WATCH_REMEDIES.get(state)))
    if not out:
        calm = [LABELS[s] for s in ("ok", "idle") if s in durations]
        out.append(finding(WATCH_DIAGNOSIS, subject, PASS,
                           f"{' or '.join(calm) or 'ok'} for all {_minutes(watched)} watched",
                           measured=f"{_minutes(watched)} watched", expected="ok (or idle) for the whole watch",
                           source=WATCH_SOURCE))
    return out


def _on_the_clock(t0: float | None, offset_s: float) -> str:
    """"2026-12-04 03:00:12 UTC (+10800 s)" where the session's start is known, else "+10800 s"."""
    if not isinstance(t0, (int, float)) or not math.isfinite(t0 + offset_s) or not 0 < t0 + offset_s < 32503680000:
        return f"+{offset_s:.0f} s"
    when = datetime.fromtimestamp(t0 + offset_s, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    return f"{when} UTC (+{offset_s:.0f} s)"


# -- a watch log's followed job and what was not watched --------------------------------------------

JOB_SOURCE = "gpuvet watch --pid: the job's process tree in /proc (CPU ticks, IO counters), once a second"


def _rate_words(bps: float) -> str:
    for unit, size in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if bps >= size:
            return f"{bps / size:.1f} {unit}"
    return f"{bps:.0f} B/s"


def watch_job_finding(pid: Any, sessions: list[tuple[list[str], list[list[Any]]]]) -> Finding | None:
    """The followed job's CPU and storage IO over a watch log, as one line beside its GPUs' findings:
    `sessions` are (columns, rows) of its "watch.job" series (log.JOB_COLUMNS). None without rows.
    Measured, not judged: no threshold applies (the GPUs' diagnoses say whether the job was held back)."""
    values = [dict(zip(columns, row)) for columns, rows in sessions for row in rows]
    if not values:
        return None

    def numbers(name: str) -> list[float]:
        return [float(v[name]) for v in values if isinstance(v.get(name), (int, float)) and not isinstance(v.get(name), bool)]

    cpu, read, write = numbers("cpu_pct"), numbers("read_bps"), numbers("write_bps")
    gpus = sorted({g for v in values for g in str(v.get("gpus") or "").split(",") if g.strip()}, key=lambda g: (len(g), g))
    parts = [f"CPU {sum(cpu) / len(cpu):.0f}% of one core on average (peak {max(cpu):.0f}%)" if cpu else "CPU not read"]
    if read or write:
        parts.append(f"storage read {_rate_words(sum(read) / len(read)) if read else '?'} and write "
                     f"{_rate_words(sum(write) / len(write)) if write else '?'} on average")
    else:
        parts.append("storage IO not readable (no permission for /proc/<pid>/io)")
    parts.append(f"on GPU {', '.join(gpus)}" if gpus else "on no GPU its processes were seen on")
    gone = next((v for v in values if v.get("alive") is False), None)
    if gone is not None:
        parts.append(f"exited at +{float(gone.get('t') or 0):.0f} s")
    processes = [int(n) for n in numbers("processes")]
    measured = (f"{len(values)} readings" + (f"; up to {max(processes)} processes in its tree" if processes else "")
                + (f"; CPU {min(cpu):.0f}..{max(cpu):.0f}% of one core" if cpu else ""))
    return finding(WATCH_JOB, f"job {pid}", MEASURED, "; ".join(parts), measured=measured, source=JOB_SOURCE)


def watch_without_gpus(reason: str | None) -> Finding:
    """A watch log that holds no GPU: a SKIP that says why, not a pass."""
    why = reason or "the log names no GPU"
    return finding(WATCH_GPUS, "host", SKIP, f"no GPU was watched: {why}", measured=f"0 GPUs in the log; {why}",
                   expected="the GPUs of the watched machine", source="the log's header (gpu_error: why NVML gave no GPU)",
                   remedy="`nvidia-smi` on the machine says whether the driver sees a GPU; `gpuvet run --quick` reads "
                          "the facts and says why NVML cannot start")
