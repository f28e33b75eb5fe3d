"""gpu.trend: a monitoring loop a user captured (`nvidia-smi --query-gpu=... --format=csv -l 5`,
`-lms`, `nvidia-smi dmon`) judged as a time series, the way the sustained-load and watch rules
judge gpuvet's own telemetry: heat climbing toward the slowdown threshold, the clock falling
under load, power held at the limit with clocks below max, a GPU idle between busy samples.

The seeds tell a renter to run exactly these loops; read as snapshots they said "PASS" for a GPU
heating from 62 to 87 C while its clock fell.
"""

from __future__ import annotations

from ..catalog import checked
from ..facts import Gpu
from ..record import MEASURED, Finding
from ..specs import reference
from ..specs.reference import Reference
from .bench_common import worst
from .common import FAIL, PASS, WARN, Context, finding, subject
from .diagnose import AT_LIMIT_PCT, IDLE_SHARE_PCT, TEMP_RISE_C
from .gpu_identity import matches_expectation
from .gpu_sustained import CLOCK_HELD_RATIO, DECAY_FAIL_PCT, DECAY_WARN_PCT, heat_problems, rated_clock

# The checks this module judges, by their catalogue ids (catalog.checked refuses an id it lacks).
GPU_TREND = checked("gpu.trend")

BUSY_PCT = 50.0  # a sample this busy (utilization, or power as a share of the limit) is "under load"
_SOURCE = ("gpuvet's sustained-load and watch rules (judge/gpu_sustained.py, judge/diagnose.py) applied to the "
           "capture's samples: clock drop >= 7% WARN, >= 15% FAIL; heat rise >= 5 C; power >= 90% of the limit with "
           "SM clock < 85% of max; idle >= 25% of samples")
_EXPECTED = "temperature steady and below slowdown, clocks held under load, no power-limit hold"
# Power held this steady (max-min within 8% of the mean) this far under the model's default limit,
# with the clock below the model's boost, is a lower limit holding the GPU: the first document's
# node B "stuck at about 320 W" on a 450 W card, 15% slower.
PLATEAU_SPREAD = 0.08
PLATEAU_BELOW_DEFAULT = 0.90
# Rows of several GPUs in one loop (a query without index on a multi-GPU machine) alternate: each
# GPU's rows agree within 5% while the GPUs differ by 10% or more.
INTERLEAVE_WITHIN = 0.05
INTERLEAVE_BETWEEN = 0.10
_MAX_INTERLEAVED = 8


def check_trend(ctx: Context) -> list[Finding]:
    loops = [m for m in ctx.measurements if m.name == "capture.telemetry"]
    gpus = {subject(g): g for g in ctx.machine.gpus}
    return [_trend(m.subject, m.details, gpus.get(m.subject) or Gpu(index=_index(m.subject)), ctx) for m in loops]


def _index(subject_name: str) -> int:
    digits = subject_name[3:]
    return int(digits) if digits.isdigit() else 0


def _trend(s: str, loop: dict, gpu: Gpu, ctx: Context) -> Finding:
    columns = list(loop.get("columns") or [])
    samples = [dict(zip(columns, row)) for row in loop.get("rows") or [] if len(row) == len(columns)]
    span = _span(samples, bool(loop.get("timed")))
    if len(samples) < 2:
        return finding(GPU_TREND, s, MEASURED, f"one sample in {loop.get('source')}: no trend to judge",
                       measured=_evidence(samples, span), source=loop.get("source"))
    interleaved = _interleaved(samples)
    if interleaved:
        return finding(GPU_TREND, s, WARN, f"{interleaved} ({span}): not one GPU's trend, so not judged as one",
                       measured=_evidence(samples, span), expected="one GPU's rows, told apart by an index column",
                       source=loop.get("source"),
                       remedy="capture the loop with the GPU named: `nvidia-smi --query-gpu=index,timestamp,temperature.gpu,"
                              "power.draw,power.limit,clocks.sm,clocks.max.sm,utilization.gpu --format=csv -l 5` "
                              "(or `-i 0` for one GPU)")
    ref = _reference(gpu, ctx)
    limit, limit_words = _power_limit(gpu, samples, ref)
    top, top_words = _max_clock(gpu, ref)
    loaded = _loaded(samples, limit, top)
    problems: list[tuple[str, str]] = []
    problems += _heat(gpu, samples)
    problems += _clock_fall(loaded)
    problems += _power_held(loaded, limit, limit_words, top, top_words)
    if not _values(samples, "power_limit_w") and not gpu.power.enforced_limit_w:
        problems += _power_plateau(loaded, limit, limit_words, top, top_words)
    problems += _idle_between(samples)
    measured = _evidence(samples, span)
    if problems:
        return finding(GPU_TREND, s, worst(*(st for st, _ in problems)), "; ".join(w for _, w in problems) + f" ({span})",
                       measured=measured, expected=_EXPECTED, source=_SOURCE,
                       remedy=f"confirm under a known load: `gpuvet run --soak 10`, or watch `nvidia-smi -i {gpu.index} -q -d "
                              "PERFORMANCE,TEMPERATURE` while it runs; check cooling, airflow and the power limit")
    if not loaded:
        return finding(GPU_TREND, s, MEASURED, f"idle through all {len(samples)} samples ({span}): nothing under load to judge",
                       measured=measured, expected="samples taken under load (utilization or power >= 50%)",
                       source=loop.get("source"),
                       remedy=f"capture the loop while your job runs: `nvidia-smi -i {gpu.index} --query-gpu=index,timestamp,"
                              "utilization.gpu,temperature.gpu,power.draw,power.limit,clocks.sm,clocks.max.sm --format=csv -l 5`")
    if limit is None or top is None:
        # Steady, but against nothing: a GPU held flat under a lowered limit looks just like this.
        return finding(GPU_TREND, s, MEASURED,
                       f"steady over {len(samples)} samples ({span}); the power wall is not judged: the loop names no model "
                       "and no limit", measured=measured, expected=_EXPECTED, source=_SOURCE,
                       remedy="give the model (`gpuvet inspect LOOP --expect \"RTX 4090\"`) or the machine's `nvidia-smi -q` "
                              "beside the loop, or add power.limit,clocks.max.sm to the query")
    return finding(GPU_TREND, s, PASS, f"held steady under load over {len(loaded)} of {len(samples)} samples ({span})",
                   measured=measured, expected=_EXPECTED, source=_SOURCE)


def _span(samples: list[dict], timed: bool) -> str:
    if timed and samples:
        return f"{samples[-1]['t'] - samples[0]['t']:.0f} s"
    return f"{len(samples)} samples, interval not in the capture"


def _values(samples: list[dict], key: str) -> list[float]:
    return [s[key] for s in samples if isinstance(s.get(key), (int, float))]


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _fifths(values: list[float]) -> tuple[float | None, float | None]:
    """Mean of the first and of the last fifth (at least one sample each)."""
    if len(values) < 2:
        return None, None
    n = max(1, len(values) // 5)
    return _mean(values[:n]), _mean(values[-n:])


def _reference(gpu: Gpu, ctx: Context) -> Reference | None:
    """The model's reference row: by the GPU's name (another capture of the machine gives it), else
    by `--expect` when it names one model only (a three-column loop names no GPU)."""
    ref = ctx.ref(gpu)
    expect = (ctx.options.get("expect") or "").strip()
    if ref is not None or not expect or gpu.name:
        return ref
    fits = [r for r in reference.all_references()
            if matches_expectation(expect, Gpu(index=gpu.index, name=r.name,
                                               memory_total_mib=_int(r.number("nvidia_smi_memory_total_mib"))))]
    return fits[0] if len(fits) == 1 else None


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


def _power_limit(gpu: Gpu, samples: list[dict], ref: Reference | None) -> tuple[float | None, str]:
    in_loop = _values(samples, "power_limit_w")
    if in_loop:
        return max(in_loop), "the enforced limit in the capture"
    if gpu.power.enforced_limit_w:
        return gpu.power.enforced_limit_w, "the enforced limit the report gives"
    default = ref.number("power_default_w") if ref else None
    if ref and default:
        return default, f"{ref.id}'s default limit ({ref.cite('power_default_w')})"
    return None, ""


def _max_clock(gpu: Gpu, ref: Reference | None) -> tuple[float | None, str]:
    """The clock a loaded GPU should hold: the model's boost clock where NVML's max is only a
    GeForce card's overclocking ceiling (3105 MHz on an RTX 4090 rated 2520), as the sustained
    load judges it."""
    top, words = rated_clock(gpu, ref)
    if top:
        return top, words
    boost = ref.number("boost_clock_mhz") if ref else None
    if ref and boost:
        return boost, f"{ref.id}'s boost clock ({ref.cite('boost_clock_mhz')})"
    return None, ""


def _loaded(samples: list[dict], limit: float | None, top: float | None) -> list[dict]:
    """The samples taken under load: by utilization when the loop has it, else by power against
    the limit, else by clock against max; all of them when none of these can tell."""
    if _values(samples, "util_pct"):
        return [s for s in samples if (s.get("util_pct") or 0) >= BUSY_PCT]
    if limit and _values(samples, "power_w"):
        return [s for s in samples if (s.get("power_w") or 0) >= BUSY_PCT / 100 * limit]
    if top and _values(samples, "sm_mhz"):
        return [s for s in samples if (s.get("sm_mhz") or 0) >= BUSY_PCT / 100 * top]
    return samples


def _heat(gpu: Gpu, samples: list[dict]) -> list[tuple[str, str]]:
    temps = _values(samples, "temp_c")
    if not temps:
        return []
    problems = heat_problems(gpu, max(temps))
    first, last = _fifths(temps)
    if first is not None and last is not None and last - first >= TEMP_RISE_C:
        problems.append((WARN, f"heating: {temps[0]:.0f} -> {temps[-1]:.0f} C (max {max(temps):.0f} C)"))
    return problems


def _clock_fall(loaded: list[dict]) -> list[tuple[str, str]]:
    clocks = _values(loaded, "sm_mhz")
    first, last = _fifths(clocks)
    if not first or last is None:
        return []
    drop = 100.0 * (1.0 - last / first)
    if drop < DECAY_WARN_PCT:
        return []
    return [(FAIL if drop >= DECAY_FAIL_PCT else WARN,
             f"SM clock fell {drop:.0f}% under load (first to last fifth): {clocks[0]:.0f} -> {clocks[-1]:.0f} MHz")]


def _power_held(loaded: list[dict], limit: float | None, limit_words: str, top: float | None,
                top_words: str) -> list[tuple[str, str]]:
    power, sm = _mean(_values(loaded, "power_w")), _mean(_values(loaded, "sm_mhz"))
    if power is None or sm is None or not limit or not top:
        return []
    if 100.0 * power / limit < AT_LIMIT_PCT or sm >= CLOCK_HELD_RATIO * top:
        return []
    return [(WARN, f"held at the power limit: {power:.0f} W of {limit:.0f} W ({limit_words}) with the SM clock at "
                   f"{sm:.0f} MHz = {100 * sm / top:.0f}% of {top:.0f} MHz ({top_words}); compare the limit with the "
                   "default: `nvidia-smi -q -d POWER`")]


def _power_plateau(loaded: list[dict], default: float | None, default_words: str, top: float | None,
                   top_words: str) -> list[tuple[str, str]]:
    """Power held flat well under the model's default limit with the clock below its boost: a lower
    limit than the model's holds the GPU (the loop shows no limit column to say which)."""
    power = _values(loaded, "power_w")
    sm = _mean(_values(loaded, "sm_mhz"))
    mean = _mean(power)
    if len(power) < 3 or mean is None or not default or not top or sm is None:
        return []
    if (max(power) - min(power)) > PLATEAU_SPREAD * mean or mean >= PLATEAU_BELOW_DEFAULT * default or sm >= top:
        return []
    short = (default_words.split(" (")[0], top_words.split(" (")[0])  # the cited sources are in the evidence
    return [(WARN, f"power held at {min(power):.0f}-{max(power):.0f} W under load, {100 * mean / default:.0f}% of "
                   f"{default:.0f} W ({short[0]}), with the SM clock at {sm:.0f} MHz, below {top:.0f} MHz ({short[1]}): "
                   "a power limit below the model's default (the power wall); `nvidia-smi -q -d POWER` shows the enforced one")]


def _interleaved(samples: list[dict]) -> str | None:
    """ "rows of 2 GPUs interleaved (SM clock 2745 / 2235 MHz alternating)": the smallest k for which
    every k-th row agrees (within 5%) while the k series differ (10% or more)."""
    for key, unit in (("sm_mhz", "MHz"), ("power_w", "W")):
        values = _values(samples, key)
        if len(values) != len(samples):
            continue
        for k in range(2, _MAX_INTERLEAVED + 1):
            if len(values) < 2 * k:
                break
            series = [values[i::k] for i in range(k)]
            means = [sum(x) / len(x) for x in series]
            if min(means) <= 0:
                break
            agree = all(max(x) - min(x) <= INTERLEAVE_WITHIN * m for x, m in zip(series, means))
            if agree and max(means) - min(means) >= INTERLEAVE_BETWEEN * max(means):
                shown = " / ".join(f"{m:.0f}" for m in means)
                label = "SM clock" if key == "sm_mhz" else "power"
                return f"rows of {k} GPUs interleaved ({label} {shown} {unit} alternating): the query names no GPU"
    return None


def _idle_between(samples: list[dict]) -> list[tuple[str, str]]:
    """Busy samples with idle ones among them: the GPU waits on input (watch's "underused")."""
    util = _values(samples, "util_pct")
    if not util or max(util) < BUSY_PCT:
        return []
    first_busy = next(i for i, u in enumerate(util) if u >= BUSY_PCT)
    last_busy = len(util) - 1 - next(i for i, u in enumerate(reversed(util)) if u >= BUSY_PCT)
    between = util[first_busy:last_busy + 1]
    idle = 100.0 * sum(1 for u in between if u < BUSY_PCT) / len(between)
    if idle < IDLE_SHARE_PCT:
        return []
    return [(WARN, f"idle in {idle:.0f}% of the samples between busy ones: the job waits on input, the CPU or the network")]


def _evidence(samples: list[dict], span: str) -> str:
    parts = [f"{len(samples)} samples ({span})"]
    for key, label, unit in (("temp_c", "temperature", "C"), ("sm_mhz", "SM clock", "MHz"), ("power_w", "power", "W"),
                             ("util_pct", "utilization", "%")):
        values = _values(samples, key)
        if values:
            parts.append(f"{label} {values[0]:.0f} -> {values[-1]:.0f} {unit} (min {min(values):.0f}, max {max(values):.0f})")
    return "; ".join(parts)
