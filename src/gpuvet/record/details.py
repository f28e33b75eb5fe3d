"""The details of the benchmarks' measurements that the judge and the report compute with.

A measurement's `details` are free-form (each benchmark keeps what explains its figure), but the
keys below are read as numbers, flags or names by the rules: a record with a list where a
`read_mb_s` belongs would crash a rule. Each benchmark's type lists them (every key optional: a
benchmark that failed keeps only why), the loader checks them, and the schema documents them.
Keys not listed stay free.
"""

from __future__ import annotations

from typing import Any, TypedDict


class BenchNote(TypedDict, total=False):
    """`bench.*`: why a benchmark did not give its figure."""

    outcome: str  # "skipped", "failed", "aborted"
    reason: str
    stage: str
    error: str
    nodes: list[str]  # cluster: the nodes that stopped it
    behind: dict[str, Any]
    others_reached: str | None


class PowerSummary(TypedDict, total=False):
    mean_w: float | None
    max_w: float | None
    mean_pct_of_limit: float | None


class ClockSummary(TypedDict, total=False):
    mean: float | None
    min: float | None
    max: float | None


class TelemetrySummary(TypedDict, total=False):
    """`sustained.telemetry`: samples.summarize() of the NVML samples taken under load."""

    count: int
    duration_s: float | None
    interval_s: float | None
    power: PowerSummary
    sm_mhz: ClockSummary
    temp_c: dict[str, float | None]
    util_pct: dict[str, float | None]
    reasons: dict[str, float] | None  # clock-event reason -> share of samples
    violation_s: dict[str, float | None]
    pcie: dict[str, int | None]


class SustainedRate(TypedDict, total=False):
    """`sustained.*`: the sustained load's throughput."""

    dtype: str
    duration_s: float | None
    first_fifth: float | None
    last_fifth: float | None
    windows: int
    min: float | None
    max: float | None
    how: str


class DiskDetails(TypedDict, total=False):
    """`disk.*`: a storage test."""

    path: str
    kind: str | None  # "nvme", "network", ...
    model: str | None
    engine: str | None
    fs_type: str | None
    mount_point: str | None
    read_mb_s: float | None
    file_bytes: int | None
    p50_us: float | None
    p99_us: float | None
    cache_dropped: bool | None


class NetDetails(TypedDict, total=False):
    """`net.*`: TCP latency and throughput."""

    engine: str | None
    p99_us: float | None
    round_trips: int | None
    streams: int | None
    interface: str | None
    source_address: str | None


class WorkloadDetails(TypedDict, total=False):
    """`workload.*`: the small training run and its checkpoint."""

    p10: float | None
    p90: float | None
    peak_tflops: float | None
    path: str
    reason: str
    stage: str
    checksum_match: bool | None


class P2pDetails(TypedDict, total=False):
    """`p2p.*`: GPU-to-GPU copies."""

    src: int
    dst: int
    peer_access: bool | None
    failed_pairs: list[Any]


class P2pMatrixDetails(TypedDict, total=False):
    """`p2p.matrix`: every pair at once, rows the source GPU, columns the destination."""

    gpus: list[int]
    peer_access: list[list[bool | None]]  # None: the same GPU, or the pair was not measured
    failed_pairs: list[Any]


# Measurement name prefix -> its details' type; the first that matches wins.
DETAILS: tuple[tuple[str, Any], ...] = (
    ("bench.", BenchNote),
    ("sustained.telemetry", TelemetrySummary),
    ("sustained.", SustainedRate),
    ("disk.", DiskDetails),
    ("net.", NetDetails),
    ("workload.", WorkloadDetails),
    ("p2p.matrix", P2pMatrixDetails),
    ("p2p.", P2pDetails),
)


def details_type(name: Any) -> Any:
    """The TypedDict a measurement's details are checked against, by its name; None: free-form."""
    if not isinstance(name, str):
        return None
    return next((shape for prefix, shape in DETAILS if name.startswith(prefix)), None)
