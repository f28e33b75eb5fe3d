"""gpu.sustained: does the GPU hold its speed under minutes of full load, and if not, why?

Evidence comes from the benchmark's throughput per window and the NVML telemetry sampled while
it ran (power, SM clock, temperature, clock-event reasons as combined flags).
"""

from __future__ import annotations

from ..catalog import checked
from ..facts import Gpu
from ..record import Finding
from ..specs.reference import Reference
from .bench_common import against_box, box_median, not_measured, one, planned, worst
from .common import FAIL, PASS, WARN, Context, finding, subject
from .gpu_power import slowdown_threshold
from ..specs.slowdowns import (FAULT_SHARE, FAULTS, HEAT_SOAK_S, POWER_FAULTS,  # noqa: F401 (the checklist reads them from specs)
                                 power_faults_under_load, short_load_words)

# The checks this module judges, by their catalogue ids (catalog.checked refuses an id it lacks).
GPU_SUSTAINED = checked("gpu.sustained")

DECAY_WARN_PCT, DECAY_FAIL_PCT = 7.0, 15.0
_STEADY = (f"steady throughput (decay under {DECAY_WARN_PCT:g}% first to last fifth), clocks near max, "
           "no thermal or power-brake slowdown")
CLOCK_HELD_RATIO = 0.85  # busy, SM clock under 85% of max: held back (watch's diagnosis uses the same)
HOT_MARGIN_C = 3.0  # this close to the slowdown threshold, clocks are being cut
HOT_WARN_MARGIN_C = 8.0
# Reasons NVML gives for clocks below max that are settings or limits rather than faults: what
# each means, and the command that shows or clears it ({i}: the GPU's index).
_HOLDS = {
    "applications_clocks_setting": ("application clocks are set below max",
                                    "`sudo nvidia-smi -i {i} -rac` resets them"),
    "sw_power_cap": ("the driver capped power (SW power cap)",
                     "compare the enforced and default power limits: `nvidia-smi -i {i} -q -d POWER`"),
    "sync_boost": ("sync boost holds it to the slowest GPU of its sync group",
                   "`nvidia-smi -i {i} -q -d PERFORMANCE` shows the group"),
    "display_clock_setting": ("a display clock setting", "`nvidia-smi -i {i} -q -d CLOCK`"),
    "gpu_idle": ("the GPU reported itself idle: the load did not keep it busy", "rerun `gpuvet bench sustained`"),
}


def check_sustained(ctx: Context) -> list[Finding]:
    if not planned(ctx, "sustained"):
        return []
    median = box_median(ctx, "sustained.tflops")
    return [_sustained(ctx, gpu, median) for gpu in ctx.machine.gpus]


def _sustained(ctx: Context, gpu: Gpu, median: float | None) -> Finding:
    s = subject(gpu)
    rate, decay = one(ctx, "sustained.tflops", s), one(ctx, "sustained.decay_pct", s)
    if rate is None:
        return not_measured(ctx, "sustained", GPU_SUSTAINED, s)
    telemetry = next((m.details for m in ctx.measurements if m.name == "sustained.telemetry" and m.subject == s), {})
    problems: list[tuple[str, str]] = _wrong_products(rate.details.get("check"))
    if decay is not None and decay.value >= DECAY_WARN_PCT:
        problems.append((FAIL if decay.value >= DECAY_FAIL_PCT else WARN,
                         f"throughput fell {decay.value:.0f}% from the first to the last fifth"))
    problems += _reasons(telemetry)
    problems += _clocks(gpu, ctx.ref(gpu), telemetry)
    problems += _heat(gpu, telemetry)
    box, box_words = against_box(rate.value, median, 0.95, 0.90)
    if box:
        problems.append((box, f"{rate.value:.1f} TFLOPS is {box_words}"))
    measured = _evidence(rate, decay, telemetry)
    duration = rate.details.get("duration_s")
    if not problems:
        return finding(GPU_SUSTAINED, s, PASS, f"held {rate.value:.1f} TFLOPS for {duration} s" + _power_words(telemetry)
                       + short_load_words(duration), measured=measured, expected=_STEADY,
                       source=f"the benchmark's throughput windows and NVML telemetry sampled {_sampling(telemetry)}")
    status = worst(*(st for st, _ in problems))
    remedy = (f"run longer to confirm: `gpuvet run --soak 10`; watch `nvidia-smi -i {gpu.index} -q -d PERFORMANCE,TEMPERATURE`; "
              "check cooling and airflow, or ask for another node")
    if any("wrong results" in text for _, text in problems):
        remedy = (f"stop using GPU {gpu.index}: `sudo dmesg | grep -i xid`; `nvidia-smi -q -i {gpu.index} -d ECC`; "
                  "if a rerun of `gpuvet bench sustained` repeats it, ask the provider to replace the GPU")
    return finding(GPU_SUSTAINED, s, status, "; ".join(text for _, text in problems), measured=measured,
                   expected=_STEADY,
                   source=f"NVML telemetry sampled {_sampling(telemetry)} during the load",
                   remedy=remedy)


def _wrong_products(check: object) -> list[tuple[str, str]]:
    """Products that changed under load, though their inputs did not: silent corruption, often
    only once the card is hot (gpu-burn's check)."""
    if not isinstance(check, dict):
        return []
    wrong, checked = check.get("windows_wrong"), check.get("windows_checked")
    if not isinstance(wrong, int) or isinstance(wrong, bool) or wrong <= 0:
        return []
    when = check.get("first_wrong_at_s")
    at = f", first {when:g} s into the load" if isinstance(when, (int, float)) else ""
    return [(FAIL, f"wrong results under load: {wrong} of {checked} checked products differed from the first{at} "
                   "(silent data corruption; the inputs never change, a healthy GPU repeats its product)")]






def _reasons(telemetry: dict) -> list[tuple[str, str]]:
    shares = telemetry.get("reasons") or {}
    bad = [(name, share) for name, share in shares.items() if name in FAULTS and share and share > FAULT_SHARE]
    return [(FAIL, f"{FAULTS[name]} during {100 * share:.0f}% of the load") for name, share in bad]


def rated_clock(gpu: Gpu, ref: Reference | None) -> tuple[float | None, str]:
    """The SM clock a GPU under load should hold, and what it is: the model's boost clock where it
    is below NVML's max (GeForce cards report an overclocking ceiling: 3105 MHz on an RTX 4090
    rated 2520), else NVML's max."""
    top = gpu.clocks.max_sm_mhz
    boost = ref.number("boost_clock_mhz") if ref else None
    if ref is not None and boost and (not top or boost < top):
        ceiling = f"; NVML's max {top} MHz is a ceiling, not a rating" if top else ""
        return boost, f"the {boost:g} MHz boost clock of the {ref.id} (reference{ceiling})"
    return (float(top), f"the {top} MHz max") if top else (None, "")


def _clocks(gpu: Gpu, ref: Reference | None, telemetry: dict) -> list[tuple[str, str]]:
    """Clocks well below the rated clock under load: power-limited (normal at the limit), or held back by something else."""
    sm = (telemetry.get("sm_mhz") or {}).get("mean")
    top, rated = rated_clock(gpu, ref)
    power_pct = _power_pct(telemetry)
    if not sm or not top or sm >= CLOCK_HELD_RATIO * top:
        return []
    shares = telemetry.get("reasons")
    if any(((shares or {}).get(r) or 0) > FAULT_SHARE for r in FAULTS):
        return []  # already explained by the slowdown reason
    held = {name: share for name, share in (shares or {}).items() if share and share > FAULT_SHARE}
    if power_pct is not None and power_pct >= 90 and set(held) <= {"sw_power_cap"}:
        return []  # at the power limit: the limit itself is judged by gpu.power_limit
    clock = f"SM clock {sm:.0f} MHz under load, {100 * sm / top:.0f}% of {rated}"
    if held:
        return [(WARN, f"{clock}, with NVML reporting " + "; ".join(_hold_words(name, share, gpu.index) for name, share in held.items()))]
    if power_pct is None:
        return []
    if shares is None:
        return [(WARN, f"{clock} while drawing only {power_pct:.0f}% of the power limit; NVML's clock-event reasons "
                       f"were not read: see `nvidia-smi -i {gpu.index} -q -d PERFORMANCE` while it runs")]
    return [(WARN, f"{clock} while drawing only {power_pct:.0f}% of the power limit, with no clock-event reason: "
                   "something else holds it back (PSU, firmware): watch `nvidia-smi -i "
                   f"{gpu.index} -q -d PERFORMANCE,CLOCK` while it runs")]


def _hold_words(name: str, share: float, index: int) -> str:
    what, how = _HOLDS.get(name, (f"clock-event reason {name}", "`nvidia-smi -i {i} -q -d PERFORMANCE`"))
    return f"{name} during {100 * share:.0f}% of the load ({what}: {how.format(i=index)})"


def _sampling(telemetry: dict) -> str:
    """How often telemetry was read, from the samples themselves (the sampler can fall behind)."""
    count, duration = telemetry.get("count"), telemetry.get("duration_s")
    interval = duration / (count - 1) if count and count > 1 and duration else telemetry.get("interval_s")
    if not interval:
        return "(interval not recorded)"
    return f"every {interval:.2g} s ({1 / interval:.2g} Hz)"


def _heat(gpu: Gpu, telemetry: dict) -> list[tuple[str, str]]:
    hottest = (telemetry.get("temp_c") or {}).get("max")
    return heat_problems(gpu, hottest)


def heat_problems(gpu: Gpu, hottest: float | None) -> list[tuple[str, str]]:
    """The hottest reading under load against the slowdown threshold (reported, or assumed)."""
    if hottest is None:
        return []
    slowdown, how, _source = slowdown_threshold(gpu)
    margin = slowdown - hottest
    if margin <= HOT_MARGIN_C:
        return [(FAIL, f"reached {hottest:.0f} C, {_degrees_from(margin)} slowdown ({how})")]
    if margin < HOT_WARN_MARGIN_C:
        return [(WARN, f"reached {hottest:.0f} C, only {margin:.0f} C from slowdown ({how})")]
    return []


def _degrees_from(margin: float) -> str:
    return f"{-margin:.0f} C past" if margin < 0 else f"{margin:.0f} C from"


def _power_pct(telemetry: dict) -> float | None:
    """Mean power as a share of the limit: from the energy counter where the run read it (exact),
    else the mean of NVML's power readings."""
    energy = telemetry.get("energy_mean_pct_of_limit")
    if isinstance(energy, (int, float)) and not isinstance(energy, bool):
        return float(energy)
    return (telemetry.get("power") or {}).get("mean_pct_of_limit")


def _power_words(telemetry: dict) -> str:
    power = telemetry.get("power") or {}
    sm = telemetry.get("sm_mhz") or {}
    hottest = (telemetry.get("temp_c") or {}).get("max")
    parts = []
    energy_w, pct = telemetry.get("energy_mean_w"), _power_pct(telemetry)
    if isinstance(energy_w, (int, float)) and not isinstance(energy_w, bool):
        parts.append(f"{energy_w:.0f} W from the energy counter" + (f" ({pct:.0f}% of limit)" if pct else ""))
    elif power.get("mean_w") is not None:
        parts.append(f"{power['mean_w']:.0f} W" + (f" ({power['mean_pct_of_limit']:.0f}% of limit)" if power.get("mean_pct_of_limit") else ""))
    if sm.get("mean") is not None:
        parts.append(f"SM {sm['mean']:.0f} MHz")
    if hottest is not None:
        parts.append(f"max {hottest:.0f} C")
    return (": " + ", ".join(parts)) if parts else ""


def _evidence(rate, decay, telemetry: dict) -> str:
    text = (f"{rate.value:.1f} TFLOPS median ({rate.details.get('dtype')}, {rate.details.get('duration_s')} s), "
            f"first fifth {rate.details.get('first_fifth')}, last fifth {rate.details.get('last_fifth')}")
    if decay is not None:
        text += f", decay {decay.value:.1f}%"
    return text + _power_words(telemetry)
