"""A `gpuvet watch --log` file's lines (gpuvet.watch/1), as types the reader checks each line
against: a header per session, then one line per row or diagnosis change."""

from __future__ import annotations

from typing import Any, TypedDict

from .errors import RecordError
from .validate import check, free

WATCH_SCHEMA = "gpuvet.watch/1"


class WatchFacts(TypedDict, total=False):
    """What a header records of a GPU (watch.log.gpu_facts) or of the host (host_facts)."""

    name: str | None
    uuid: str | None
    bus_id: str | None
    memory_total_mib: int | None
    max_sm_mhz: int | None
    slowdown_c: float | None
    power_limit_w: float | None
    default_power_limit_w: float | None
    min_power_limit_w: float | None
    max_power_limit_w: float | None
    cpu_model: str | None
    cpu_logical_cores: int | None
    cpu_usable_cores: int | None
    memory_total_bytes: int | None
    hypervisor: str | None
    container: str | None
    cloud: str | None


class _SubjectBase(TypedDict):
    name: str  # "watch.telemetry", "watch.host", "watch.job"
    columns: list[str]


class WatchSubject(_SubjectBase, total=False):
    facts: WatchFacts  # read once at start
    gpu: str | None  # logs written before facts were: the GPU's name and uuid alone
    uuid: str | None
    pid: int | None  # the followed job


class _HeaderBase(TypedDict):
    schema: str
    kind: str  # "header"
    t0: float
    interval_s: float
    series: dict[str, WatchSubject]  # subject ("gpu0", "host", "job") -> its columns


class WatchHeader(_HeaderBase, total=False):
    gpuvet: str  # the version that wrote it
    hostname: str | None
    driver_version: str | None
    gpu_error: str | None  # why no GPU is watched
    source: str  # "live", or "replay: FILE" (GPUVET_NVML_REPLAY); logs before it was written: live
    note: str


class WatchDiagnosis(TypedDict):
    state: str
    text: str


class _LineBase(TypedDict):
    subject: str


class WatchLine(_LineBase, total=False):
    """A row (`row`: values in the header's columns) or a diagnosis change (`t`, `diagnosis`)."""

    row: list[float | str | bool | None]
    t: float
    diagnosis: WatchDiagnosis


def check_watch_line(obj: Any, where: str) -> dict[str, Any]:
    """One line of a watch log checked (RecordError names the line and the field)."""
    if not isinstance(obj, dict):
        raise RecordError(f"{where}: not a JSON object")
    if obj.get("kind") == "header":
        if obj.get("schema") != WATCH_SCHEMA:
            raise RecordError(f"{where}: a header of another schema ({str(obj.get('schema'))[:40]!r})")
        return check(obj, WatchHeader, where)
    if "row" in obj or "diagnosis" in obj:
        return check(obj, WatchLine, where)
    return free(obj, where)  # a line a newer gpuvet writes: kept, not read


def is_watch_header(obj: Any) -> bool:
    return isinstance(obj, dict) and obj.get("kind") == "header" and obj.get("schema") == WATCH_SCHEMA
