"""gpu.power_limit, gpu.throttle, gpu.temperature: is the GPU allowed to run at full speed?"""

from __future__ import annotations

from ..catalog import checked
from ..facts import Gpu
from ..record import Finding
from .common import FAIL, PASS, SKIP, WARN, Context, finding, subject, why_missing
from ..specs.reference import Reference

# The checks this module judges, by their catalogue ids (catalog.checked refuses an id it lacks).
GPU_POWER_LIMIT = checked("gpu.power_limit")
GPU_TEMPERATURE = checked("gpu.temperature")
GPU_THROTTLE = checked("gpu.throttle")

# A cap at or below this share of the default limit costs double-digit throughput (the seed:
# 320 W of 450 W made a run 15% slower); it must never pass.
CAP_FAIL_RATIO = 0.80
CAP_WARN_RATIO = 0.97


def check_power_limit(ctx: Context) -> list[Finding]:
    return [_power_limit(gpu, ctx.ref(gpu)) for gpu in ctx.machine.gpus]


def _power_limit(gpu: Gpu, ref: Reference | None) -> Finding:
    s, p = subject(gpu), gpu.power
    enforced = p.enforced_limit_w if p.enforced_limit_w is not None else p.limit_w
    if enforced is None:
        return finding(GPU_POWER_LIMIT, s, SKIP,
                       f"power limit not available: {why_missing(gpu, 'power.enforced_limit_w', 'not in the capture')}")
    default, source = p.default_limit_w, "the GPU's default power limit (NVML)"
    if default is None and ref is not None and ref.number("power_default_w"):
        default, source = ref.number("power_default_w"), ref.cite("power_default_w")
    if not default:
        return finding(GPU_POWER_LIMIT, s, SKIP, f"limit {enforced:.0f} W, but the default limit is unknown: no reference for {gpu.name}",
                       measured=f"{enforced:.0f} W")
    ratio = enforced / default
    allowed = _allowed_range(gpu)
    measured = f"enforced limit {enforced:.0f} W"
    expected = f"default {default:.0f} W{allowed}"
    if ratio >= CAP_WARN_RATIO:
        note = "raised above" if ratio > 1.03 else "at"
        finding_ = finding(GPU_POWER_LIMIT, s, PASS, f"{enforced:.0f} W, {note} the {default:.0f} W default",
                           measured=measured, expected=expected, source=source)
        return _below_reference(gpu, ref, default) or finding_
    status = FAIL if ratio <= CAP_FAIL_RATIO else WARN
    target = default if p.max_limit_w is None else min(default, p.max_limit_w)
    return finding(
        GPU_POWER_LIMIT, s, status,
        f"capped at {enforced:.0f} W = {100 * ratio:.0f}% of the {default:.0f} W default: clocks drop under full load",
        measured=measured, expected=expected, source=source,
        remedy=f"sudo nvidia-smi -i {gpu.index} -pl {target:.0f}  (needs root on the host; on a rented VM or container ask "
               f"the provider to restore the default limit)",
    )


def _allowed_range(gpu: Gpu) -> str:
    p = gpu.power
    if p.min_limit_w is not None and p.max_limit_w is not None:
        return f", settable {p.min_limit_w:.0f}-{p.max_limit_w:.0f} W"
    return ""


def _below_reference(gpu: Gpu, ref: Reference | None, default: float) -> Finding | None:
    """A board whose own default is well under the model's: a reduced-power variant or VBIOS."""
    ref_default = ref.number("power_default_w") if ref else None
    if ref is None or not ref_default or default >= 0.9 * ref_default:
        return None
    return finding(
        GPU_POWER_LIMIT, subject(gpu), WARN,
        f"this board's default limit is {default:.0f} W, {100 * default / ref_default:.0f}% of the {ref_default:.0f} W "
        f"usual for {gpu.name}: a reduced-power board or VBIOS",
        measured=f"default limit {default:.0f} W", expected=f"{ref_default:.0f} W",
        source=ref.cite("power_default_w"),
        remedy="ask the provider which board/VBIOS this is; compare `nvidia-smi -q -d POWER` on another node",
    )


# -- gpu.throttle -----------------------------------------------------------------------------

_FAULTS = {
    "hw_slowdown": "HW slowdown (clocks halved by hardware: overheating, power brake or power-supply fault)",
    "hw_thermal_slowdown": "HW thermal slowdown (the GPU is too hot)",
    "sw_thermal_slowdown": "SW thermal slowdown (the driver slows the GPU to cool it)",
    "hw_power_brake_slowdown": "HW power brake (the board's external power-brake signal: PSU or chassis limit)",
}


_NO_FAULT = "no HW slowdown, HW/SW thermal slowdown or power brake"
_REASONS_SOURCE = "NVML clock-event reasons (nvidia-smi 'Clocks Event Reasons')"


def check_throttle(ctx: Context) -> list[Finding]:
    return [_throttle(gpu) for gpu in ctx.machine.gpus]


def _throttle(gpu: Gpu) -> Finding:
    s, reasons = subject(gpu), gpu.clocks.event_reasons
    if reasons is None:
        return finding(GPU_THROTTLE, s, SKIP,
                       f"clock-event reasons not available: {why_missing(gpu, 'clocks.event_reasons', 'not in the capture')}")
    measured = "active: " + (", ".join(reasons) or "none")
    faults = [_FAULTS[r] for r in reasons if r in _FAULTS]
    clocks = _clock_text(gpu)
    if faults:
        c = gpu.clocks
        at_full = bool(c.sm_mhz and c.max_sm_mhz and c.sm_mhz >= 0.97 * c.max_sm_mhz)
        # A snapshot can flag a reason while the clock it read is still at max: say so, not "cut".
        head = "slowdown flagged in the snapshot: " if at_full else "clocks cut: "
        if at_full:
            clocks = f" (SM clock at its full {c.sm_mhz} MHz at that instant: watch it under load)"
        return finding(GPU_THROTTLE, s, FAIL, head + "; ".join(faults) + clocks,
                       measured=measured, expected=_NO_FAULT, source=_REASONS_SOURCE,
                       remedy=f"watch it under load: `nvidia-smi -i {gpu.index} -q -d PERFORMANCE,TEMPERATURE,POWER`; "
                              "check cooling and power cabling, or ask the provider for another GPU")
    if "applications_clocks_setting" in reasons and not _default_app_clocks(gpu):
        return finding(GPU_THROTTLE, s, WARN, "clocks held down by an application-clocks setting" + clocks,
                       measured=measured, expected="default application clocks", source=_REASONS_SOURCE,
                       remedy=f"sudo nvidia-smi -i {gpu.index} -rac  (reset application clocks)")
    if "sw_power_cap" in reasons:
        state = "idle" if gpu.pstate is not None and gpu.pstate >= 8 else "under load"
        note = ("the driver keeps this flag at idle; not a fault" if state == "idle"
                else "the GPU is at its power limit: normal under full load (see gpu.power_limit)")
        return finding(GPU_THROTTLE, s, PASS, f"SW power cap ({state}): {note}", measured=measured,
                       expected=_NO_FAULT, source=_REASONS_SOURCE)
    if "applications_clocks_setting" in reasons:
        c = gpu.clocks
        return finding(GPU_THROTTLE, s, PASS,
                       f"application clocks at the board's default ({c.applications_graphics_mhz} MHz): the flag reports "
                       "the default setting, not a cap" + clocks,
                       measured=f"{measured}; application clocks {c.applications_graphics_mhz} MHz, default "
                                f"{c.default_applications_graphics_mhz} MHz",
                       expected="default application clocks", source=_REASONS_SOURCE)
    if "gpu_idle" in reasons:
        return finding(GPU_THROTTLE, s, PASS, "idle; no slowdown active", measured=measured,
                       expected=_NO_FAULT, source=_REASONS_SOURCE)
    return finding(GPU_THROTTLE, s, PASS, "no clock-event reason active" + clocks, measured=measured,
                   expected=_NO_FAULT, source=_REASONS_SOURCE)


def _default_app_clocks(gpu: Gpu) -> bool:
    """Application clocks known to be at the board's default (Tesla K80: 562 = 562 MHz): the flag
    then reports the default setting, not a cap someone set, so there is nothing to reset."""
    c = gpu.clocks
    return c.applications_graphics_mhz is not None and c.applications_graphics_mhz == c.default_applications_graphics_mhz


def _clock_text(gpu: Gpu) -> str:
    c = gpu.clocks
    if c.sm_mhz and c.max_sm_mhz:
        return f" (SM {c.sm_mhz} of {c.max_sm_mhz} MHz)"
    return ""


# -- gpu.temperature --------------------------------------------------------------------------

_MARGIN_SOURCE = "this GPU's slowdown threshold (NVML / `nvidia-smi -q -d TEMPERATURE`)"
_IDLE_RULE_SOURCE = "gpuvet rule of thumb: NVIDIA GPUs slow down near 85-97 C, so an idle GPU at 70 C has little headroom"


def check_temperature(ctx: Context) -> list[Finding]:
    return [_temperature_reading(gpu) for gpu in ctx.machine.gpus]


def _temperature_reading(gpu: Gpu) -> Finding:
    s, t = subject(gpu), gpu.thermal
    threshold_c, threshold_words, source = slowdown_threshold(gpu)
    margin = t.slowdown_margin_c
    if margin is None and t.gpu_c is not None:
        margin = threshold_c - t.gpu_c
    if margin is None:  # neither the temperature nor the margin to slowdown
        return finding(GPU_TEMPERATURE, s, SKIP, f"temperature not available: {why_missing(gpu, 'thermal.gpu_c', 'not in the capture')}")
    now = f"{t.gpu_c:.0f} C" if t.gpu_c is not None else "temperature hidden"
    threshold = f" (slowdown {threshold_words if t.slowdown_c is None else 'at ' + threshold_words})"
    headroom = f"at least 10 C below the slowdown threshold of {threshold_words}"
    remedy = f"watch it under load: `nvidia-smi -i {gpu.index} --query-gpu=temperature.gpu,clocks.sm,power.draw --format=csv -l 2`"
    measured = f"{now}, {margin:.0f} C below slowdown{threshold}"
    if margin <= 3:
        return finding(GPU_TEMPERATURE, s, FAIL, f"{now}: at the slowdown threshold, clocks are being cut",
                       measured=measured, expected=headroom, source=source,
                       remedy=remedy + "; check fans and airflow, or ask for another node")
    if margin < 10:
        return finding(GPU_TEMPERATURE, s, WARN, f"{now}: only {margin:.0f} C below slowdown{threshold}",
                       measured=measured, expected=headroom, source=source, remedy=remedy)
    idle = gpu.pstate is not None and gpu.pstate >= 8
    if idle and t.gpu_c is not None and t.gpu_c >= 70:
        return finding(GPU_TEMPERATURE, s, WARN, f"{now} while idle (P{gpu.pstate}): poor cooling, expect throttling under load",
                       measured=now, expected="well under 70 C at idle", source=_IDLE_RULE_SOURCE, remedy=remedy)
    return finding(GPU_TEMPERATURE, s, PASS, f"{now}, {margin:.0f} C below slowdown" + ("" if t.slowdown_c is not None
                   or t.slowdown_margin_c is not None else f" ({threshold_words})"),
                   measured=measured, expected=headroom, source=source)


# No slowdown threshold reported (a CSV, dmon, the default table): the lowest one among the real
# captures in tests/fixtures (V100, A100, K80 report 87 C; others 88-101 C), so a GPU is never
# judged cooler than it may be.
DEFAULT_SLOWDOWN_C = 87.0
_DEFAULT_SLOWDOWN_SOURCE = ("slowdown threshold not reported: gpuvet assumes 87 C, the lowest 'GPU Slowdown Temp' of the "
                            "nvidia-smi reports it was tested on (V100, A100, K80; others 88-101 C)")


def slowdown_threshold(gpu: Gpu) -> tuple[float, str, str]:
    """The temperature at which this GPU slows itself down, in words, and where that comes from:
    reported; estimated from the T.Limit margin (recent drivers on H100/H200); else the default."""
    t = gpu.thermal
    if t.slowdown_c is not None:
        return t.slowdown_c, f"{t.slowdown_c:.0f} C", _MARGIN_SOURCE
    if t.gpu_c is not None and t.slowdown_margin_c is not None:
        estimate = t.gpu_c + t.slowdown_margin_c
        return estimate, (f"about {estimate:.0f} C: {t.gpu_c:.0f} C when the facts were read "
                          f"+ the {t.slowdown_margin_c:.0f} C margin to slowdown the driver reported (T.Limit)"), _MARGIN_SOURCE
    return DEFAULT_SLOWDOWN_C, f"{DEFAULT_SLOWDOWN_C:.0f} C assumed: not reported", _DEFAULT_SLOWDOWN_SOURCE
