"""The measuring steps of benchmarks/gpu_validation.sh, each a subcommand that prints one JSON
line (the shell keeps it in the work folder), and the summary that holds every figure against its
absolute target. Plain torch and the standard library only: these are the peers gpuvet's own
figures are compared with, so they share none of its code.

    python benchmarks/gpu_validation_steps.py gemm-peers | copies | context | gil | summary WORK_DIR
"""

from __future__ import annotations

import csv
import json
import os
import statistics
import subprocess
import sys
import threading
from datetime import datetime
from pathlib import Path

# mamf-finder's published best shapes for the H200 (stas00 ml-engineering MAMF tables: bf16
# "H200 is the same" as H100 SXM's 2048x2048x13312, 794.5; fp8 1280x4096x12032, 1453.4) and the
# seeds' 4096^3 / an 8192^3 square for reference.
PEER_SHAPES = {"bf16": [(2048, 2048, 13312), (8192, 8192, 8192), (4096, 4096, 4096)],
               "fp8": [(1280, 4096, 12032), (8192, 8192, 8192)]}
MAMF_WARMUP, MAMF_ITERS = 50, 100  # mamf-finder: mean of 100 iterations after 50 warm-up ones
FLUSH_BYTES = 256 << 20


def emit(result: dict) -> None:
    print(json.dumps(result))


# -- plain-torch GEMM, mamf-finder's method ---------------------------------------------------------

def gemm_peers() -> None:
    import torch

    results = {}
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    for dtype, shapes in PEER_SHAPES.items():
        for m, n, k in shapes:
            try:
                results[f"{dtype} {m}x{n}x{k}"] = _mamf(torch, dtype, m, n, k, flush)
            except Exception as error:  # an fp8 this torch cannot run is a line, not the end
                results[f"{dtype} {m}x{n}x{k}"] = {"error": f"{type(error).__name__}: {error}"[:200]}
    emit({"step": "gemm-peers", "method": f"mean of {MAMF_ITERS} after {MAMF_WARMUP} warm-up, L2 flushed before each "
                                          "(mamf-finder v2); fp8: torch._scaled_mm, e4m3 in, e4m3 out", "shapes": results})


def _mamf(torch, dtype: str, m: int, n: int, k: int, flush) -> dict:
    if dtype == "fp8":
        a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
        one = torch.ones((), device="cuda")

        def call():
            return torch._scaled_mm(a, b.t(), one, one, out_dtype=torch.float8_e4m3fn)
    else:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)

        def call():
            return a @ b.t()
    for _ in range(MAMF_WARMUP):
        call()
    times = []
    for _ in range(MAMF_ITERS):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1000)
    rates = [2 * m * n * k / t / 1e12 for t in times]
    return {"mean_tflops": round(statistics.mean(rates), 1), "median_tflops": round(statistics.median(rates), 1)}


# -- device copy and pinned host copies from the near and the far NUMA node -------------------------

def copies() -> None:
    import torch

    n = 1 << 30
    src = torch.ones(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    device_copy = _timed(torch, lambda: dst.copy_(src), 2 * n, 50)
    near, far = _numa_cpus(os.environ.get("GPU0_BUS"))  # nvidia-smi's "00000000:1B:00.0", set by the shell
    host = {}
    for where, cpus in (("near", near), ("far", far)):
        if not cpus:
            host[where] = {"skipped": "no CPU list for this NUMA node"}
            continue
        previous = os.sched_getaffinity(0)
        os.sched_setaffinity(0, cpus)
        try:
            pinned = torch.empty(256 << 20, dtype=torch.uint8).fill_(1).pin_memory()  # first touch by a bound thread
            gpu = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
            host[where] = {"cpus": f"{cpus[0]}-{cpus[-1]}",
                           "h2d_gbs": _timed(torch, lambda g=gpu, h=pinned: g.copy_(h, non_blocking=True), 256 << 20, 30),
                           "d2h_gbs": _timed(torch, lambda g=gpu, h=pinned: h.copy_(g, non_blocking=True), 256 << 20, 30)}
        finally:
            os.sched_setaffinity(0, previous)
    emit({"step": "copies", "device_copy_gbs_read_plus_write": device_copy, "pinned_host": host})


def _timed(torch, copy, nbytes: int, repeats: int) -> float:
    copy()
    torch.cuda.synchronize()
    rates = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        copy()
        end.record()
        end.synchronize()
        rates.append(nbytes / (start.elapsed_time(end) / 1000) / 1e9)
    return round(statistics.median(rates), 2)


def _cpu_list(text: str) -> list[int]:
    cpus = []
    for part in text.strip().split(","):
        low, _, high = part.partition("-")
        if low.isdigit():
            cpus += range(int(low), int(high or low) + 1)
    return cpus


def _numa_cpus(bus: str | None) -> tuple[list[int], list[int]]:
    """CPUs of the GPU's own NUMA node (sysfs local_cpulist) and of another node, both cut to what
    this process may use."""
    allowed = os.sched_getaffinity(0)
    devices = Path("/sys/bus/pci/devices")
    near: list[int] = []
    for device in devices.glob("*"):
        vendor = (device / "vendor").read_text().strip() if (device / "vendor").exists() else ""
        if vendor == "0x10de" and (not bus or device.name.lower()[-7:] == bus.lower()[-7:]):
            near = _cpu_list((device / "local_cpulist").read_text()) if (device / "local_cpulist").exists() else []
            if near:
                break
    near = [c for c in near if c in allowed]
    far: list[int] = []
    for node in sorted(Path("/sys/devices/system/node").glob("node[0-9]*")):
        cpus = [c for c in _cpu_list((node / "cpulist").read_text()) if c in allowed and c not in near]
        if cpus:
            far = cpus
            break
    return near, far


# -- context start-up, with and without another process holding the GPU -----------------------------

FIRST_CALL = ("import time, torch; t = time.perf_counter(); torch.zeros(1, device='cuda'); torch.cuda.synchronize(); "
              "print(round((time.perf_counter() - t) * 1000, 1))")


def context() -> None:
    alone = [_fresh_process_ms() for _ in range(5)]
    holder = subprocess.Popen([sys.executable, "-c", "import torch, sys; torch.zeros(1, device='cuda'); "
                               "print('held', flush=True); sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    holder.stdout.readline()  # the holder has its context
    try:
        held = [_fresh_process_ms() for _ in range(5)]
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    emit({"step": "context", "first_call_ms_no_other_process": alone, "first_call_ms_while_another_holds_it": held,
          "note": "the first value of the first list is the cold start gpuvet's seeds warn about (persistence off, vGPU)"})


def _fresh_process_ms() -> float | None:
    done = subprocess.run([sys.executable, "-c", FIRST_CALL], capture_output=True, text=True, timeout=60)
    try:
        return float(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None


# -- the GIL check of gpuvet's timing loop -----------------------------------------------------------

def gil() -> None:
    """gpuvet's own time_each on the H100/H200 bf16 best shape (~141 us a call), alone and with
    seven busy Python threads (the other GPUs' timers of an 8-GPU box): the medians must agree."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from gpuvet.bench.common import time_each

    a = torch.randn(2048, 13312, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(2048, 13312, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(2048, 2048, device="cuda", dtype=torch.bfloat16)

    def call():
        torch.mm(a, b.t(), out=out)
    for _ in range(20):
        call()
    alone = statistics.median(time_each("cuda:0", call, 400))
    stop = threading.Event()

    def busy():
        while not stop.is_set():
            sum(range(2000))
    threads = [threading.Thread(target=busy) for _ in range(7)]
    for t in threads:
        t.start()
    try:
        contended = statistics.median(time_each("cuda:0", call, 400))
    finally:
        stop.set()
        for t in threads:
            t.join()
    emit({"step": "gil", "alone_us": round(alone * 1e6, 1), "with_7_busy_threads_us": round(contended * 1e6, 1),
          "ratio": round(contended / alone, 3)})


# -- the summary -------------------------------------------------------------------------------------

def summary(work: Path) -> None:
    record = _json(work / "run.json") or {}
    steps = {name: _last_json(work / f"{name}.json") for name in ("gemm-peers", "copies", "context", "gil")}
    print("== every gpu.* finding of the default run, against its absolute target")
    for f in record.get("findings", []):
        if f.get("check", "").startswith("gpu."):
            e = f.get("evidence") or {}
            print(f"{f['status'].upper():8} {f['check']}[{f['subject']}]: {f['summary']}"
                  + (f" | expected {e['expected']}" if e.get("expected") else ""))
    measured = {m["name"]: m for m in record.get("measurements", []) if m.get("subject") == "gpu0" and m.get("value") is not None}
    print("== peers")
    peers = (steps["gemm-peers"] or {}).get("shapes", {})
    for dtype in ("bf16", "fp8"):
        ours = measured.get(f"gemm.{dtype}")
        best = max((v.get("mean_tflops") or 0 for k, v in peers.items() if k.startswith(dtype)), default=0)
        if ours and best:
            share = ours["value"] / best
            print(f"gemm.{dtype}: gpuvet {ours['value']:.1f} vs plain torch (mamf-finder's method) {best:.1f} TFLOPS "
                  f"= {100 * share:.1f}% (target >= 95%) {'PASS' if share >= 0.95 else 'FAIL'}")
        else:
            print(f"gemm.{dtype}: OPEN (gpuvet {ours['value'] if ours else None}, peer {best or None})")
    for key, value in peers.items():
        print(f"  peer {key}: {value}")
    copies_step = steps["copies"] or {}
    plain, ours = copies_step.get("device_copy_gbs_read_plus_write"), measured.get("membw.copy")
    if plain and ours:
        print(f"membw.copy: gpuvet {ours['value']:.0f} vs plain torch {plain:.0f} GB/s = {100 * ours['value'] / plain:.1f}% "
              f"(target >= 95%) {'PASS' if ours['value'] >= 0.95 * plain else 'FAIL'}")
    near = (copies_step.get("pinned_host") or {}).get("near") or {}
    for name, key in (("pcie.h2d_pinned", "h2d_gbs"), ("pcie.d2h_pinned", "d2h_gbs")):
        if name in measured and near.get(key):
            share = measured[name]["value"] / near[key]
            print(f"{name}: gpuvet {measured[name]['value']:.1f} vs plain torch from the near node {near[key]:.1f} GB/s "
                  f"= {100 * share:.1f}% (target >= 95%) {'PASS' if share >= 0.95 else 'FAIL'}")
    print(f"  pinned host copies by NUMA node: {copies_step.get('pinned_host')}")
    context_step = steps["context"] or {}
    if context_step:
        alone, held = context_step.get("first_call_ms_no_other_process"), context_step.get("first_call_ms_while_another_holds_it")
        print(f"context start-up ms: alone {alone}; while another process holds the GPU {held}; "
              f"gpuvet latency.context_init {(measured.get('latency.context_init') or {}).get('value')}")
    gil_step = steps["gil"] or {}
    if gil_step:
        ratio = gil_step.get("ratio") or 0
        print(f"timing loop with 7 busy threads: {gil_step.get('with_7_busy_threads_us')} us vs alone {gil_step.get('alone_us')} us "
              f"= x{ratio} (target within 5%) {'PASS' if 0.95 <= ratio <= 1.05 else 'FAIL'}")
    _logger_vs_telemetry(work, record)


def _logger_vs_telemetry(work: Path, record: dict) -> None:
    """Mean power and SM clock of gpu0 under gpuvet's telemetry series and under the independent
    `nvidia-smi -lms` logger, over the same span of time: they must agree within 5%."""
    log = work / "smi-log.csv"
    if not log.exists():
        print("nvidia-smi logger: OPEN (no log)")
        return
    rows = []
    for row in csv.reader(log.read_text(errors="replace").splitlines()):
        try:
            when = datetime.strptime(row[0].strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()
            rows.append((int(row[1]), when, float(row[2]), float(row[3])))
        except (ValueError, IndexError):
            continue
    for series in record.get("series", []):
        columns = series.get("columns") or []
        if series.get("subject") != "gpu0" or "power_w" not in columns or not series.get("rows") or series.get("t0") is None:
            continue
        p, c = columns.index("power_w"), columns.index("sm_mhz")
        start, end = series["t0"], series["t0"] + series["rows"][-1][0]
        ours_p = [r[p] for r in series["rows"] if r[p] is not None]
        ours_c = [r[c] for r in series["rows"] if r[c] is not None]
        theirs = [(w, mhz) for index, t, w, mhz in rows if index == 0 and start <= t <= end]
        if not ours_p or not theirs:
            continue
        mp, tp = statistics.mean(ours_p), statistics.mean(w for w, _ in theirs)
        mc, tc = statistics.mean(ours_c), statistics.mean(mhz for _, mhz in theirs)
        ok = abs(mp - tp) <= 0.05 * tp and abs(mc - tc) <= 0.05 * tc
        print(f"{series['name']}: gpuvet {mp:.0f} W {mc:.0f} MHz vs nvidia-smi -lms {tp:.0f} W {tc:.0f} MHz over "
              f"{end - start:.0f} s (target within 5%) {'PASS' if ok else 'FAIL'}")


def _json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _last_json(path: Path) -> dict | None:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            return json.loads(line)
        except ValueError:
            continue
    return None


if __name__ == "__main__":
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    steps = {"gemm-peers": gemm_peers, "copies": copies, "context": context, "gil": gil}
    if command == "summary":
        summary(Path(sys.argv[2]))
    elif command in steps:
        steps[command]()
    else:
        sys.exit(__doc__)
