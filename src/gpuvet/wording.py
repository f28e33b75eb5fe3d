"""Words and formats that both the judge and the reports use, kept below both (a report reads them
here, never from judge/): the range of GPUs a finding covers, a window's duration, what a skip says
when a check is not in play, and the short name of each watch diagnosis. Imports nothing of gpuvet."""

from __future__ import annotations

import re

# What a skip says when the check has nothing to judge on this machine by its make-up ("one GPU:
# NVLink not in play"): the question does not arise, which the checklist shows as not applicable.
NOT_IN_PLAY = "not in play"


def subject_range(subjects: list[str]) -> str:
    """["gpu0", "gpu1", "gpu2"] -> "gpu0-2"; ["gpu0", "gpu2", "gpu3"] -> "gpu0,2,3"."""
    if len(subjects) == 1:
        return subjects[0]
    numbers = [m for m in (re.fullmatch(r"gpu(\d+)", s) for s in subjects) if m]
    if subjects and len(numbers) == len(subjects):
        idx = sorted(int(m.group(1)) for m in numbers)
        if idx[-1] - idx[0] + 1 == len(set(idx)) == len(idx):  # consecutive; never sized by an index's value
            return f"gpu{idx[0]}-{idx[-1]}"
        return "gpu" + ",".join(str(i) for i in idx)
    return ",".join(dict.fromkeys(subjects))


def duration_text(seconds: float) -> str:
    """7200 -> "2 h", 5400 -> "90 min", 86400 -> "1 d" (a window as a user gives it)."""
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g} {unit}"
    return f"{seconds:g} s"


DIAGNOSIS_LABELS = {
    "lost": "lost",  # NVML can no longer read the GPU: fell off the bus, needs a reset, driver gone
    "ok": "ok",
    "idle": "idle",
    "no_data": "no data",
    "thermal": "thermal",
    "hw_slowdown": "clocks cut",
    "neighbour": "neighbour",
    "power_capped": "power-capped",
    "clocks_held": "clocks held",
    "cpu_steal": "CPU steal",
    "input_bound": "input-bound",
    "io_bound": "IO-bound",
    "slowing": "slower and slower",
    "underused": "underused",
    "no_gpu": "no GPU",  # a followed job that holds none (or none this container can tell)
    "job_gone": "job ended",
}
