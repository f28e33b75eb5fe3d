"""cpu.<benchmark>: benchmarks run with `--device cpu`. There is no reference figure for a CPU
here, so a measurement is "measured, not judged" with its figures, and a benchmark that cannot
run says why."""

from __future__ import annotations

from .. import catalog
from ..record import MEASURED, Finding
from .bench_common import measured
from .common import SKIP, Context, finding

# The GPU benchmarks reported as cpu.<benchmark> when `--device cpu` runs them on the CPU instead
# (the workload has checks of its own).
GPU_BENCHMARKS = tuple(c.benchmark for c in catalog.CHECKS if c.area == "cpu" and c.benchmark)


def check_cpu_benchmarks(ctx: Context) -> list[Finding]:
    if ctx.options.get("device") != "cpu":
        return []
    findings = []
    for bench in ctx.options.get("benchmarks") or []:
        if bench not in GPU_BENCHMARKS:
            continue  # host benchmarks and the workload have checks of their own
        figures = [m for m in ctx.measurements if m.name.startswith(f"{bench}.") and m.value is not None and m.unit]
        check = f"cpu.{bench}"
        if figures:
            text = ", ".join(f"{m.name.removeprefix(bench + '.')} {m.value:.4g} {m.unit}" for m in figures)
            findings.append(finding(check, "cpu", MEASURED, f"{text} (measured on the CPU; no reference to judge against)",
                                    measured=text))
            continue
        notes = measured(ctx, f"bench.{bench}")
        reason = notes[0].details.get("reason", "not measured") if notes else "not measured"
        findings.append(finding(check, "cpu", SKIP, reason))
    return findings
