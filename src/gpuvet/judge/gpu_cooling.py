"""gpu.fan_failure: does every fan of a GPU that has fans answer, and turn when the GPU is hot?

A failed fan shows as a reading NVML cannot take (nvidia-smi prints ERR! in its Fan column, or
'Unknown Error'); a fan stuck at 0% while the GPU is near its slowdown temperature has stopped.
At idle a GeForce fan at 0% is its zero-RPM mode, not a fault; a passively cooled datacenter GPU
reports no fan at all (the chassis's fans cool it), which is a skip that says so.
"""

from __future__ import annotations

from ..catalog import checked
from ..facts import Gpu
from ..record import Finding
from .common import FAIL, PASS, SKIP, Context, finding, subject, why_missing

# The checks this module judges, by their catalogue ids (catalog.checked refuses an id it lacks).
GPU_FAN_FAILURE = checked("gpu.fan_failure")

SOURCE = "NVML fan speed per fan (nvidia-smi 'Fan Speed'; ERR! or Unknown Error: the driver could not read the fan)"
# A fan at 0% this close to slowdown is not in its zero-RPM idle mode: it should be turning.
HOT_MARGIN_C = 10.0
_PASSIVE = ("not supported", "n/a", "not available", "not in the capture", "not reported")


def check_fan_failure(ctx: Context) -> list[Finding]:
    return [_fans(gpu) for gpu in ctx.machine.gpus]


def _fans(gpu: Gpu) -> Finding:
    s, fans, why = subject(gpu), gpu.thermal.fan_pct, why_missing(gpu, "thermal.fan_pct", "not reported")
    remedy = (f"confirm under load: `nvidia-smi -i {gpu.index} --query-gpu=fan.speed,temperature.gpu,clocks_event_reasons.active "
              "--format=csv -l 2`; a fan that fails stays failed: ask the provider to replace it, or for another GPU")
    if not fans:
        if fans is None and not any(word in why.lower() for word in _PASSIVE):  # the call itself failed
            return finding(GPU_FAN_FAILURE, s, FAIL, f"fan speed could not be read ({why}): a failed fan or its sensor",
                           measured=f"fan speed: {why}", expected="a speed in percent for every fan", source=SOURCE,
                           remedy=remedy)
        return finding(GPU_FAN_FAILURE, s, SKIP, f"no fan of its own reported ({why}): passively cooled by the chassis")
    listed = ", ".join("ERR!" if pct is None else f"{pct}%" for pct in fans)
    failed = [n for n, pct in enumerate(fans) if pct is None]
    if failed:
        return finding(GPU_FAN_FAILURE, s, FAIL,
                       f"fan {', '.join(map(str, failed))} of {len(fans)} could not be read (nvidia-smi shows ERR!): "
                       "a dead fan or tachometer lets the GPU overheat under load",
                       measured=f"fans: {listed} ({why})", expected="a speed in percent for every fan", source=SOURCE,
                       remedy=remedy)
    margin = _margin_c(gpu)
    stopped = [n for n, pct in enumerate(fans) if pct == 0]
    if stopped and margin is not None and margin < HOT_MARGIN_C:
        return finding(GPU_FAN_FAILURE, s, FAIL,
                       f"fan {', '.join(map(str, stopped))} at 0% while the GPU is {margin:.0f} C below slowdown: the fan has stopped",
                       measured=f"fans: {listed}; {margin:.0f} C below slowdown",
                       expected=f"fans turning within {HOT_MARGIN_C:g} C of slowdown", source=SOURCE, remedy=remedy)
    return finding(GPU_FAN_FAILURE, s, PASS, f"{len(fans)} fan(s) answering: {listed}",
                   measured=f"fans: {listed}", expected="a speed for every fan, and turning when the GPU is hot",
                   source=SOURCE)


def _margin_c(gpu: Gpu) -> float | None:
    t = gpu.thermal
    if t.slowdown_margin_c is not None:
        return t.slowdown_margin_c
    return t.slowdown_c - t.gpu_c if t.slowdown_c is not None and t.gpu_c is not None else None
