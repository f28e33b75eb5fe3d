"""A `gpuvet watch --log` file's lines (gpuvet.watch/1), as types the reader checks each line
against: a header per session, then one line per row or diagnosis change."""

from __future__ import annotations

import io
import json
from typing import Any, TypedDict

from ..untrusted_text import clean_strings
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


# -- reading a log: the one reader (watch's report, runner's record of a log, record.load) -------

def _lines(data: bytes, notes: list[str] | None) -> list[dict[str, Any]]:
    """The log's JSON lines. A line cut off where a session ends (the last line of the file, or the
    one before a new session's header: a watch killed mid-write, or one still writing) is skipped,
    with a note; a broken line anywhere else raises ValueError."""
    # bytes: a line cut inside a character is still counted right
    lines = [(number, line) for number, line in enumerate(io.BytesIO(data), 1) if line.strip()]
    objects: list[dict[str, Any]] = []
    for i, (number, line) in enumerate(lines):
        try:
            obj = json.loads(line.decode("utf-8", errors="replace"))
        except RecursionError:
            raise RecordError(f"line {number}: nested too deeply to be a watch log line") from None
        except ValueError as err:
            following = lines[i + 1][1] if i + 1 < len(lines) else None
            if following is not None and not starts_session(following):
                raise ValueError(f"line {number}: {err}") from None
            where = "the last line" if following is None else f"line {number} (the end of a session)"
            if notes is not None:
                cut = len(line.rstrip(b"\r\n"))
                notes.append(f"{where} was cut off: {cut} bytes skipped "
                             "(a watch stopped mid-write, or one still writing)")
            continue
        # Types checked (RecordError names the line and field); a log may come from elsewhere:
        # no escape sequences shown.
        objects.append(clean_strings(check_watch_line(obj, f"line {number}")))
    return objects


def starts_session(line: bytes) -> bool:
    """Whether a log line is a session's header (its kind; its schema is checked when it is read)."""
    try:
        obj = json.loads(line.decode("utf-8", errors="replace"))
    except (ValueError, RecursionError):
        return False
    return isinstance(obj, dict) and obj.get("kind") == "header"


def read_log(path: str, notes: list[str] | None = None) -> list[dict[str, Any]]:
    """The watch log at `path` as series (parse_log)."""
    with open(path, "rb") as f:
        return parse_log(f.read(), notes)


def parse_log(data: bytes, notes: list[str] | None = None) -> list[dict[str, Any]]:
    """A watch log's bytes -> series like telemetry.to_series makes ({"name", "subject", "interval_s", "t0",
    "columns", "rows"}), one per subject and session, plus a "watch.diagnosis" series (t, state, text).
    A GPU's series also holds the facts its header gave ("facts": gpu_facts(), or its name and uuid
    in logs written before the facts were). A line cut off at the end of a session is skipped and
    `notes` (when given) says so; a broken line elsewhere raises ValueError."""
    series: list[dict[str, Any]] = []
    session: dict[str, dict[str, Any]] = {}
    for obj in _lines(data, notes):
        if obj.get("kind") == "header":
            session = {}
            for subject, spec in obj["series"].items():
                session[subject] = {"name": spec["name"], "subject": subject, "interval_s": obj["interval_s"],
                                    "t0": obj["t0"], "columns": spec["columns"], "rows": []}
                if spec.get("facts") or spec.get("gpu"):  # older logs: the name alone
                    session[subject]["facts"] = spec.get("facts") or {"name": spec.get("gpu"), "uuid": spec.get("uuid")}
                if spec.get("pid") is not None:  # the followed job's
                    session[subject]["pid"] = spec["pid"]
                series.append(session[subject])
            continue
        subject = obj.get("subject")
        if "row" in obj and subject in session:
            session[subject]["rows"].append(obj["row"])
        elif "diagnosis" in obj:
            if not isinstance(obj.get("t"), (int, float)):  # NaN (read as None) or no time: not placeable
                if notes is not None:
                    notes.append(f"a diagnosis of {str(subject)[:40]} without a time was skipped")
                continue
            key = f"{subject}.diagnosis"
            if key not in session:
                any_series = next(iter(session.values()), {"t0": None, "interval_s": None})
                session[key] = {"name": "watch.diagnosis", "subject": subject, "interval_s": any_series["interval_s"],
                                "t0": any_series["t0"], "columns": ["t", "state", "text"], "rows": []}
                series.append(session[key])
            d = obj["diagnosis"]
            session[key]["rows"].append([obj["t"], d["state"], d["text"]])
    return series
