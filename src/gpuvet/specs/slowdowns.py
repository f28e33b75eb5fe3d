"""Which clock-event reasons are faults under a sustained load, how long one must last to count,
and how long a load must run to heat-soak a GPU: what the sustained load's judge and the report's
checklist (its power wall) both read, kept below both."""

from __future__ import annotations

FAULT_SHARE = 0.05  # a slowdown reason active in more than 5% of the samples is not a blip
# A load shorter than this does not heat-soak a GPU (heatsink, coolant and room air take minutes to
# settle): it proves the GPU holds its speed while the load ran, not over a long job.
HEAT_SOAK_S = 600.0
FAULTS = {
    "hw_slowdown": "HW slowdown",
    "hw_thermal_slowdown": "HW thermal slowdown",
    "sw_thermal_slowdown": "SW thermal slowdown",
    "hw_power_brake_slowdown": "HW power brake",
}
# Of those, the ones that are power, not heat (the checklist's power wall); the SW power cap is the
# GPU at its limit, normal under full load.
POWER_FAULTS = ("hw_power_brake_slowdown", "hw_slowdown")


def short_load_words(duration_s: object) -> str:
    """What a load too short to heat-soak the GPU could not prove, and how to prove it."""
    if not isinstance(duration_s, (int, float)) or duration_s >= HEAT_SOAK_S:
        return ""
    return (f"; {duration_s:g} s does not heat-soak a GPU: thermal and power stability over a long job needs "
            f"`gpuvet run --soak {HEAT_SOAK_S / 60:g}`")


def power_faults_under_load(telemetry: dict) -> list[str]:
    """ "HW power brake during 56% of the load": the power faults a sustained load's telemetry saw
    for longer than a blip."""
    shares = telemetry.get("reasons") or {}
    return [f"{FAULTS[name]} during {100 * shares[name]:.0f}% of the load" for name in POWER_FAULTS
            if (shares.get(name) or 0) > FAULT_SHARE]
