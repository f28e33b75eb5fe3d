"""A run's figures as a comparison reads them: which quantities it shows and prices, each one's
value per run and per machine, and the workload shape that decides whether tokens/s compare.

Pure: run records in, numbers out.
"""

from __future__ import annotations

import re
import statistics
from collections import Counter

from ..facts import Machine
from ..record import RunRecord
from .shapes import Figure, MachineRate

TOKENS = "workload.tokens_per_s"
SUSTAINED = "sustained.tflops"
GEMM_BF16 = "gemm.bf16"
STEP_TIME = "workload.step_time_ms"

# The figures a listing shows for every run: (measurement name, short label, unit).
KEY_FIGURES = (
    (GEMM_BF16, "bf16 GEMM", "TFLOPS"),
    (SUSTAINED, "sustained", "TFLOPS"),
    ("membw.copy", "mem copy", "GB/s"),
    ("pcie.h2d_pinned", "H2D", "GB/s"),
    (TOKENS, "workload", "tokens/s"),
)

# What "one unit of work" is priced in, in the order the ranking prefers them: the real training
# loop says most about a training job, the sustained load next, a short GEMM least.
COST_BASES = (
    (TOKENS, "usd_per_million_tokens", "USD per million training tokens", 3600 / 1e6),
    (SUSTAINED, "usd_per_pflop_hour_sustained", "USD per PFLOP-hour (sustained)", 1 / 1000),
    (GEMM_BF16, "usd_per_pflop_hour_bf16", "USD per PFLOP-hour (bf16 GEMM)", 1 / 1000),
)
JOB_METRICS = (TOKENS, SUSTAINED, GEMM_BF16)
SLOWEST_SUFFIX = "_slowest_gpu"  # the cost row of a data-parallel job, paced by the slowest GPU

# More figures for one machine over time (`gpuvet history --machine`): what moves with the time
# of day on a shared host (storage, network, CPU steal, the CPU's feed rate) next to the GPU's.
STEAL = "host.steal_pct"  # from the host facts, not a measurement
TREND_FIGURES = KEY_FIGURES + (
    ("disk.seq_read", "disk seq read", "MB/s"),
    ("disk.rand_read_iops", "disk random read", "IOPS"),
    ("net.loopback_throughput", "net loopback", "Gbit/s"),
    ("net.tcp_throughput", "net node-to-node", "Gbit/s"),
    ("cpu.feed_rate", "CPU feed", "samples/s"),
    (STEAL, "CPU steal", "%"),
)

# The workload's tokens/s (and what follows from it) only compare between runs of one shape.
SHAPE_DEPENDENT = {TOKENS, STEP_TIME, "usd_per_million_tokens"}

LOWER_IS_BETTER_UNITS = {"ms", "us", "µs", "s", "count"}
# Signed figures whose size, not sign, is bad: a throughput that fell 5% or rose 5% over a
# sustained load is equally unsteady (the CPU's warm-up shows as a large negative decay).
CLOSER_TO_ZERO_NAMES = {"sustained.decay_pct"}
LOWER_IS_BETTER_NAMES = CLOSER_TO_ZERO_NAMES | {STEAL}


# -- one run's figures ------------------------------------------------------------------------

def run_figures(record: RunRecord) -> dict[tuple[str, str], Figure]:
    """Every measured quantity of a run, keyed by (name, unit). Measurements without a value or
    unit (notes of skipped benchmarks) are left out, as the terminal report does."""
    values: dict[tuple[str, str], list[float]] = {}
    subjects: dict[tuple[str, str], list[str]] = {}
    for m in record.measurements:
        if m.value is None or not m.unit:
            continue
        values.setdefault((m.name, m.unit), []).append(float(m.value))
        subjects.setdefault((m.name, m.unit), []).append(m.subject)
    return {key: Figure(key[0], key[1], statistics.median(v), list(dict.fromkeys(subjects[key])))
            for key, v in values.items()}


def key_figures(record: RunRecord) -> dict[str, float]:
    """The KEY_FIGURES a run has, by name (median over GPUs)."""
    figures = run_figures(record)
    return {name: figures[(name, unit)].value for name, _, unit in KEY_FIGURES if (name, unit) in figures}


def trend_values(record: RunRecord) -> dict[str, float]:
    """The TREND_FIGURES a run has, by name: measurements (median over subjects) and the CPU
    steal its host facts measured."""
    figures = run_figures(record)
    values = {name: figures[(name, unit)].value for name, _, unit in TREND_FIGURES if (name, unit) in figures}
    host = record.machine.host
    if host is not None and host.steal_pct is not None:
        values[STEAL] = float(host.steal_pct)
    return values


def gpu_summary(machine: Machine) -> str:
    """"8 x NVIDIA H100 80GB HBM3"; a CPU-only machine says so."""
    if not machine.gpus:
        cpu = machine.host.cpu_model if machine.host and machine.host.cpu_model else "unknown CPU"
        return f"no GPU ({cpu})"
    names = Counter(g.name or "unknown GPU" for g in machine.gpus)
    return ", ".join(f"{n} x {name}" for name, n in names.items())


def _per_subject(record: RunRecord, name: str, unit: str) -> dict[str, float]:
    """A figure's value per subject (the median where a subject measured it more than once)."""
    values: dict[str, list[float]] = {}
    for m in record.measurements:
        if m.name == name and m.unit == unit and m.value is not None:
            values.setdefault(m.subject, []).append(float(m.value))
    return {subject: statistics.median(v) for subject, v in values.items()}


def machine_rates(record: RunRecord, name: str, unit: str) -> MachineRate | None:
    """The whole machine's throughput for a figure (None: not measured). A cpu or machine figure
    already is the machine's."""
    per_subject = _per_subject(record, name, unit)
    gpu_values = [v for s, v in per_subject.items() if re.fullmatch(r"gpu\d+", s)]
    if not gpu_values:
        value = statistics.median(per_subject.values()) if per_subject else 0.0
        return MachineRate(value, value, None) if value > 0 else None
    units = max(len(gpu_values), len(record.machine.gpus))
    missing = units - len(gpu_values)
    median = statistics.median(gpu_values)
    total = sum(gpu_values) + missing * median
    if total <= 0:
        return None
    note = (f"{name}: measured on {len(gpu_values)} of {units} GPUs; the others are assumed to match their median"
            if missing else None)
    return MachineRate(total, min(gpu_values) * units, note)


def machine_rate(record: RunRecord, name: str, unit: str) -> tuple[float | None, str | None]:
    """The whole machine's throughput for a per-GPU figure: the sum over its GPUs (None: not measured)."""
    rate = machine_rates(record, name, unit)
    return (rate.total, rate.note) if rate else (None, None)


def lower_is_better(name: str, unit: str) -> bool:
    return unit in LOWER_IS_BETTER_UNITS or name in LOWER_IS_BETTER_NAMES


def unit_of(metric: str) -> str:
    return {TOKENS: "tokens/s", SUSTAINED: "TFLOPS", GEMM_BF16: "TFLOPS"}[metric]


def workload_shape(record: RunRecord) -> str | None:
    """The reference workload's shape as one comparable text ("d_model 768 x 12 layers, ..."), from
    the details of its tokens/s; None where the run has no workload figure or no shape."""
    shapes = []
    for m in record.measurements:
        if m.name != TOKENS or m.value is None:
            continue
        shape = m.details.get("shape") if isinstance(m.details.get("shape"), dict) else {}
        if not shape:
            continue
        parts = [f"d_model {shape.get('d_model')} x {shape.get('layers')} layers", f"{shape.get('heads')} heads",
                 f"seq {shape.get('seq_len')}", f"batch {shape.get('batch')}", f"vocab {shape.get('vocab')}"]
        shapes.append(", ".join(parts) + f", {m.details.get('dtype', 'dtype unknown')}")
    return shapes[0] if len(set(shapes)) == 1 else ("; ".join(dict.fromkeys(shapes)) or None)
