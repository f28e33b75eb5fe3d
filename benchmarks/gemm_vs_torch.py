"""gpuvet's GEMM figure against the best plain torch.mm rate found in the same process.

Target (issue 3): gpuvet's figure, found in its budget (8 s on the CPU, 20 s on a GPU for all
dtypes), is at least 95% of the best rate a longer plain sweep over many shapes finds. On the
CPU this compares fp32; with a GPU also bf16 (about 790 TFLOPS has been seen on an H200) and fp8
where gpuvet measured it. Both sides report the median per-call rate of a shape; on a GPU both
time each call with CUDA events after flushing the L2 cache. Prints figures, not pass/fail.

    .venv/bin/python benchmarks/gemm_vs_torch.py [--device cpu|cuda|all] [--seconds-per-shape S] [--rounds N]
                                                 [--cuda-dtypes bf16,fp8,fp32]

The CPU figures are only as steady as the machine: the load average is printed before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import torch  # noqa: E402

from gpuvet.bench import gemm  # noqa: E402
from gpuvet.bench.common import BenchContext, Budget, free_memory_bytes  # noqa: E402

try:  # the budgets `gpuvet run` gives the benchmark
    from gpuvet.bench.plan import BUDGET_S, CPU_BUDGET_S
except ImportError:
    BUDGET_S, CPU_BUDGET_S = {"gemm": gemm.SUGGESTED_BUDGET_S["cuda"]}, {"gemm": gemm.SUGGESTED_BUDGET_S["cpu"]}

TARGET = 0.95
FLUSH_BYTES = 256 * 2**20


def cpu_reference_shapes() -> list[tuple[int, int, int]]:
    squares = [(s, s, s) for s in range(256, 4096 + 1, 256)]
    long_k = [(m, m, m * f) for m in (512, 1024, 2048) for f in (2, 4)]
    return squares + long_k


def cuda_reference_shapes(device: str) -> list[tuple[int, int, int]]:
    squares = [(s, s, s) for s in range(1024, 20480 + 1, 1024)]
    long_k = [(m, m, k) for m in (2048, 4096, 6144, 8192) for k in (8192, 16384, 32768)]
    sm_count = torch.cuda.get_device_properties(device).multi_processor_count
    waves = [(s.m, s.n, k) for k in (8192, 16384, 32768) for s in gemm.wave_filling_shapes(sm_count, k)]
    return squares + long_k + waves


def plain_operands(dtype: str, m: int, n: int, k: int, device: str):
    """A call computing a @ b.T the plain way, for `dtype`."""
    if dtype == "fp8":
        a = torch.randn(m, k, dtype=torch.bfloat16, device=device).to(torch.float8_e4m3fn)
        b = torch.randn(n, k, dtype=torch.bfloat16, device=device).to(torch.float8_e4m3fn)
        one = torch.ones((), dtype=torch.float32, device=device)
        out = torch.empty(m, n, dtype=torch.bfloat16, device=device)
        return lambda: torch._scaled_mm(a, b.t(), one, one, out_dtype=torch.bfloat16, out=out)
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    a = torch.randn(m, k, dtype=torch_dtype, device=device)
    b = torch.randn(n, k, dtype=torch_dtype, device=device)
    out = torch.empty(m, n, dtype=torch_dtype, device=device)
    return lambda: torch.mm(a, b.t(), out=out)


def per_call_seconds(call, device: str, seconds: float, flush) -> list[float] | None:
    """Warm up for a fifth of `seconds`, then time calls one by one for the rest (at least 3).
    None if one call takes longer than `seconds`: too slow to matter."""
    cuda = device.startswith("cuda")

    def synchronize():
        if cuda:
            torch.cuda.synchronize(device)

    t0 = time.perf_counter()
    call()  # the library picks its kernel
    synchronize()
    end_warm_up = time.perf_counter() + seconds / 5
    while True:
        t1 = time.perf_counter()
        call()
        synchronize()
        one_call = time.perf_counter() - t1
        if one_call > seconds or time.perf_counter() - t0 > 3 * seconds:
            return None
        if time.perf_counter() >= end_warm_up:
            break
    times, deadline = [], time.perf_counter() + seconds * 4 / 5
    batch = max(1, min(50, int(0.1 / max(one_call, 1e-6))))  # calls queued between synchronisations
    while len(times) < 3 or time.perf_counter() < deadline:
        if cuda:
            events = []
            for _ in range(batch):
                flush()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                call()
                end.record()
                events.append((start, end))
            torch.cuda.synchronize(device)
            times += [start.elapsed_time(end) / 1000 for start, end in events]
        else:
            t1 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t1)
    return times


def reference_sweep(dtype: str, device: str, shapes, seconds_per_shape: float) -> tuple[list, list]:
    """(median TFLOPS, shape) for every shape that fits in a quarter of free memory, best first; then
    the best three timed three times longer (one noisy short median must not set the bar)."""
    flush_buffer = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=device) if device.startswith("cuda") else None
    flush = flush_buffer.zero_ if flush_buffer is not None else None
    limit = free_memory_bytes(device) // 4

    def median_rate(shape, seconds):
        m, n, k = shape
        call = plain_operands(dtype, m, n, k, device)
        times = per_call_seconds(call, device, seconds, flush)
        del call
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
        return statistics.median(2 * m * n * k / t / 1e12 for t in times) if times else None

    fitting = [s for s in shapes if gemm.BufferSizes().including(gemm.Shape(*s)).bytes(dtype) <= limit]
    swept = sorted(((rate, s) for s in fitting if (rate := median_rate(s, seconds_per_shape))), reverse=True)
    confirmed = sorted(((rate, s) for _, s in swept[:3] if (rate := median_rate(s, 3 * seconds_per_shape))), reverse=True)
    return swept, confirmed


def run_gpuvet(device: str, subject: str, seconds: float) -> tuple[dict, float]:
    start = time.monotonic()
    measurements = gemm.run(BenchContext(device=device, subject=subject, budget=Budget(seconds)))
    return {m["name"]: m for m in measurements}, time.monotonic() - start


def shape_text(shape) -> str:
    return "x".join(str(x) for x in shape)


def compare(dtype: str, device: str, gpuvet_by_name: dict, seconds_per_shape: float, shapes) -> float | None:
    measured = gpuvet_by_name.get(f"gemm.{dtype}")
    if measured is None:
        print(f"  {dtype}: not measured by gpuvet here")
        return None
    start = time.monotonic()
    if dtype == "fp32":
        saved = gemm.cublas_fp32_setting()
        gemm.set_cublas_tf32(False)
    try:
        swept, confirmed = reference_sweep(dtype, device, shapes, seconds_per_shape)
    finally:
        if dtype == "fp32":
            gemm.restore_cublas_fp32(saved)
    best, best_shape = max(confirmed or swept[:1])
    d = measured["details"]
    ratio = measured["value"] / best
    print(f"  {dtype}: gpuvet {measured['value']:.4g} TFLOPS at {shape_text(d['shape'])} ({d['iterations']} calls, "
          f"spread {d['summary']['spread_pct']:.0f}%, check {'ok' if d['check']['ok'] else 'FAILED'})")
    print(f"  {dtype}: torch.mm sweep of {len(swept)} shapes in {time.monotonic() - start:.0f} s, best medians: "
          + ", ".join(f"{shape_text(s)} {r:.4g}" for r, s in swept[:5]))
    print(f"  {dtype}: best three timed longer: " + ", ".join(f"{shape_text(s)} {r:.4g}" for r, s in confirmed))
    print(f"  {dtype}: ratio {ratio:.3f} to the best timed longer, {measured['value'] / swept[0][0]:.3f} to the best "
          f"short median (target >= {TARGET})")
    return ratio


def load_average() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", choices=("cpu", "cuda", "all"), default="all")
    parser.add_argument("--seconds-per-shape", type=float, default=None,
                        help="reference sweep time per shape (default 1.5 s on the CPU, 0.5 s on a GPU)")
    parser.add_argument("--rounds", type=int, default=1, help="CPU: gpuvet and the sweep, this many times in turn")
    parser.add_argument("--cuda-dtypes", default="bf16,fp8,fp32", help="GPU: the dtypes to sweep for reference")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, {os.cpu_count()} CPUs, "
          f"load average {load_average()}")
    if args.device in ("cpu", "all"):
        budget = CPU_BUDGET_S["gemm"]
        ratios = []
        for round_number in range(1, args.rounds + 1):
            by_name, elapsed = run_gpuvet("cpu", "cpu", budget)
            print(f"cpu, round {round_number}: gpuvet gemm ran {elapsed:.1f} s (budget {budget:g} s), "
                  f"scouted {len(by_name['gemm.fp32']['details']['shapes_tried'])} shapes")
            ratios.append(compare("fp32", "cpu", by_name, args.seconds_per_shape or 1.5, cpu_reference_shapes()))
            print(f"  load average {load_average()}")
        if len(ratios) > 1:
            print(f"cpu: median ratio over {len(ratios)} rounds {statistics.median(ratios):.3f}")
    if args.device in ("cuda", "all"):
        if not torch.cuda.is_available():
            print("cuda: no GPU here")
            return
        device = "cuda:0"
        budget = BUDGET_S["gemm"]
        by_name, elapsed = run_gpuvet(device, "gpu0", budget)
        print(f"cuda ({torch.cuda.get_device_name(device)}): gpuvet gemm ran {elapsed:.1f} s (budget {budget:g} s), "
              f"check failures {by_name['gemm.check_failures']['value']}")
        for name, m in by_name.items():
            if m["unit"] == "TFLOPS":
                print(f"  {name}: {m['value']:.1f} TFLOPS at {shape_text(m['details']['shape'])}, "
                      f"wall {m['details']['wall_s']:.1f} s, shapes scouted {len(m['details']['shapes_tried'])}")
        shapes = cuda_reference_shapes(device)
        for dtype in args.cuda_dtypes.split(","):
            compare(dtype.strip(), device, by_name, args.seconds_per_shape or 0.5, shapes)


if __name__ == "__main__":
    main()
