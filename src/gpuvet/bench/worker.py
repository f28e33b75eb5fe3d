"""The benchmark worker: a child process that imports torch once and runs benchmark jobs.

Benchmarks run here, not in gpuvet's own process, so that a hung GPU, a CUDA error that poisons
the context, or a crash in a library can be ended by killing this process, and the report still
comes out. The protocol is one JSON object per line:

    parent -> worker   {"id": 1, "module": "gemm", "device": "cuda:0", "subject": "gpu0",
                        "budget_s": 20, "params": {...}}
                       {"id": 2, "parallel": [job, job, ...]}   (one thread per job, e.g. per GPU)
    worker -> parent   {"ready": true, "torch": "2.7.0", "cuda": true, "devices": [...]}
                       {"id": 2, "part": 1, "subject": "gpu1", "progress": "pcie.h2d_pinned"}
                       {"id": 2, "part": 1, "result": {"ok": true, "measurements": [...], "series": [...]}}
                       {"id": 2, "part": 0, "result": {"ok": false, "skip": "why"}}   (or "error")
                       {"id": 2, "done": true}

`part` is the job's place in its group (0 for a job sent alone). Each job's result is sent as soon
as it finishes, so when one GPU hangs the parent knows which jobs did not finish and keeps the
figures of those that did; `done` closes the group.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import threading
import traceback
from typing import Any, TextIO

from .. import catalog
from .common import STUCK_ON_GPU, BenchContext, Budget, OutOfTime, Skip
from .leftovers import exit_on_sigterm

MODULES = catalog.GPU_BENCHMARKS  # each a module of this package


def _devices(torch: Any) -> list[dict[str, Any]]:
    """CUDA devices with their PCI bus id, so the parent can map them to NVML's GPUs."""
    if not torch.cuda.is_available():
        return []
    devices = []
    for ordinal in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(ordinal)
        bus = None
        if hasattr(props, "pci_bus_id"):
            bus = f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
        uuid = str(getattr(props, "uuid", "") or "") or None  # older torch has no bus id; the uuid maps too
        devices.append({"ordinal": ordinal, "name": props.name, "bus_id": bus, "uuid": uuid,
                        "capability": f"{props.major}.{props.minor}", "memory_bytes": props.total_memory})
    return devices


def run_job(job: dict[str, Any], emit, group_id: Any = None, part: int = 0) -> dict[str, Any]:
    """One benchmark: its measurements, or why it skipped or failed. Never raises. Its progress
    lines carry the group's id and the job's part, so the parent can show and attribute them."""
    name = job.get("module")
    if name not in MODULES:
        return {"ok": False, "error": f"unknown benchmark {name!r}"}
    tag = {"id": job.get("id") if group_id is None else group_id, "part": part, "subject": job.get("subject")}
    ctx = BenchContext(
        device=job.get("device", "cpu"),
        subject=job.get("subject", "cpu"),
        budget=Budget(float(job.get("budget_s", 10))),
        params=dict(job.get("params") or {}),
        progress=lambda message: emit({**tag, "progress": message}),
    )
    try:
        module = importlib.import_module(f"gpuvet.bench.{name}")
        measurements = module.run(ctx)
        return {"ok": True, "measurements": measurements, "series": ctx.series}
    except Skip as why:
        return {"ok": False, "skip": str(why)}
    except OutOfTime as why:
        return {"ok": False, "error": f"out of time: {why}"}
    except Exception as err:  # a failing benchmark is a finding, not a crash of the worker
        traceback.print_exc(file=sys.stderr)
        return {"ok": False, "error": f"{type(err).__name__}: {err}"}


def run_parallel(jobs: list[dict[str, Any]], emit, group_id: Any = None) -> list[dict[str, Any]]:
    """Jobs side by side, one thread each (one per GPU): CUDA work on different GPUs overlaps.
    Each job's result is sent as it finishes."""
    results: list[dict[str, Any]] = [{} for _ in jobs]

    def one(i: int) -> None:
        results[i] = run_job(jobs[i], emit, group_id, i)
        emit({"id": group_id, "part": i, "result": results[i]})

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def serve(requests: TextIO, replies: TextIO) -> None:
    lock = threading.Lock()

    def emit(message: dict[str, Any]) -> None:
        with lock:
            replies.write(json.dumps(message, default=_jsonable) + "\n")
            replies.flush()

    try:
        import torch
    except Exception as err:
        emit({"ready": False, "error": f"import torch failed: {type(err).__name__}: {err}"})
        return
    emit({"ready": True, "torch": torch.__version__, "cuda": torch.cuda.is_available(), "devices": _devices(torch)})
    for line in requests:
        if not line.strip():
            continue
        job = json.loads(line)
        run_parallel(job["parallel"] if "parallel" in job else [job], emit, job.get("id"))
        if STUCK_ON_GPU:  # a GPU's streams wait behind a copy that never ends: nothing more can run here
            print("a GPU copy is stuck: the worker exits so that gpuvet can start a fresh one", file=sys.stderr)
            sys.stderr.flush()
            os._exit(3)  # not a clean exit: freeing the stuck buffers would wait for ever
        _release_cached_memory(torch)
        emit({"id": job.get("id"), "done": True})


def _release_cached_memory(torch: Any) -> None:
    """Give the GPUs back the memory the jobs' tensors left in torch's cache, once every thread of
    the group is done (empty_cache empties every GPU's cache, so no job does it while others run):
    the next benchmark sizes itself from free memory, and all-reduce ranks and fresh processes need it."""
    try:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()
    except Exception:  # a sick GPU: the next job will say so
        traceback.print_exc(file=sys.stderr)


def _jsonable(value: Any) -> Any:
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)


def main() -> None:
    # gpuvet stops a worker with SIGTERM, then SIGKILL a second later: the benchmarks' scratch
    # (all-reduce's folder, the workload's checkpoint) goes in between, not left behind.
    exit_on_sigterm()
    # Protocol lines go to the real stdout; anything else printed, by Python or by a C library
    # writing to fd 1 (NCCL does), goes to stderr instead.
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    serve(sys.stdin, replies)


if __name__ == "__main__":
    main()
