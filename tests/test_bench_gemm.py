"""B1 GEMM benchmark on the CPU build of torch: the contract, the sweep, the timing, the check."""

from __future__ import annotations

import json
import math
import statistics
import threading
import time

import pytest

torch = pytest.importorskip("torch")

from gpuvet.bench import gemm  # noqa: E402
from gpuvet.bench.common import BenchContext, Budget, OutOfTime, Skip  # noqa: E402
from gpuvet.bench.gemm import Shape  # noqa: E402

SMALL_SHAPES = [[256, 256, 512], [384, 384, 512], [256, 256, 1024]]


def run_cpu(seconds: float, **params):
    ctx = BenchContext(device="cpu", subject="cpu", budget=Budget(seconds), params=params)
    start = time.monotonic()
    measurements = gemm.run(ctx)
    return {m["name"]: m for m in measurements}, time.monotonic() - start


def flip_bit(ops, row: int, col: int, bit: int = 30) -> None:
    """A silent data corruption: one bit of one fp32 element (bit 30 is the exponent's top bit)."""
    ops.out.view(torch.int32)[row, col] ^= 1 << bit


# ---------------------------------------------------------------- the contract on the CPU


def test_cpu_run_measures_fp32_with_the_default_shapes():
    by_name, elapsed = run_cpu(2.0)
    assert list(by_name) == ["gemm.fp32", "gemm.check_failures"]
    m = by_name["gemm.fp32"]
    assert (m["unit"], m["subject"]) == ("TFLOPS", "cpu")
    assert m["value"] > 0
    d = m["details"]
    assert {"shape", "dtype", "iterations", "summary", "shapes_tried", "finalists", "check", "skipped_dtypes",
            "timing"} <= set(d)
    assert d["dtype"] == "fp32"
    assert set(d["skipped_dtypes"]) == {"tf32", "fp16", "bf16", "fp8"}
    assert all("fp32 only" in why for why in d["skipped_dtypes"].values())
    assert d["shapes_tried"]  # how many fit in the time depends on the machine's load
    assert all(1024 <= m_ <= 2048 and 1024 <= n <= 2048 for m_, n, _k, _rate in d["shapes_tried"])
    assert d["summary"]["n"] == d["iterations"] >= gemm.MIN_TIMED_CALLS
    assert d["check"]["ok"] is True
    failures = by_name["gemm.check_failures"]
    assert (failures["value"], failures["unit"], failures["subject"]) == (0, "count", "cpu")
    assert failures["details"]["failed"] == [] and failures["details"]["checked"] == ["fp32"]
    assert elapsed < 3 * 2.0 + 2  # the budget holds, give or take a slow CI machine
    json.dumps(list(by_name.values()), allow_nan=False)  # the record is strict JSON


def test_the_value_is_the_best_finalist_median_and_finalists_are_the_best_scouts():
    by_name, _ = run_cpu(1.5, shapes=SMALL_SHAPES)
    d = by_name["gemm.fp32"]["details"]
    # A sweep, not one shape (on a loaded CI machine the budget may not reach every candidate).
    assert len(d["shapes_tried"]) >= 2
    scouted = sorted(d["shapes_tried"], key=lambda row: row[3], reverse=True)
    assert [row[:3] for row in d["finalists"]] == [row[:3] for row in scouted[: gemm.FINALISTS]]
    best = max(d["finalists"], key=lambda row: row[3])
    assert d["shape"] == best[:3]
    assert by_name["gemm.fp32"]["value"] == pytest.approx(best[3]) == pytest.approx(d["summary"]["median"])


def test_the_value_comes_from_per_call_timings(monkeypatch):
    calls = []
    real_time_each = gemm.time_each

    def spy(device, fn, repeats, before=None):
        times = real_time_each(device, fn, repeats, before=before)
        calls.append((repeats, before, times))
        return times

    monkeypatch.setattr(gemm, "time_each", spy)
    by_name, _ = run_cpu(0.6, shapes=SMALL_SHAPES)
    m = by_name["gemm.fp32"]
    assert calls and all(len(times) == repeats and before is None for repeats, before, times in calls)  # CPU: no flush
    m_, n, k = m["details"]["shape"]
    per_call_medians = [statistics.median(2 * m_ * n * k / t / 1e12 for t in times) for _, _, times in calls]
    assert any(rate == pytest.approx(m["value"]) for rate in per_call_medians)
    assert m["details"]["iterations"] in [repeats for repeats, _, _ in calls]


def test_finalists_are_the_scouts_with_the_best_medians():
    def scouted(side: int, seconds: list[float]):
        return gemm.ShapeRun(Shape(side, side, side), seconds)

    runs = [scouted(100, [1.0, 1.0, 1.0]), scouted(200, [0.001, 9.0, 9.0]), scouted(300, [1.0, 1.0, 1.0]),
            scouted(400, [2.0, 2.0, 2.0])]
    # medians: 100 -> 2e-6, 200 -> 1.8e-6 (one lucky call), 300 -> 5.4e-5, 400 -> 6.4e-5 TFLOPS
    assert gemm.finalists(runs) == [Shape(400, 400, 400), Shape(300, 300, 300)]


def test_a_fast_outlier_does_not_make_the_best_shape():
    one_lucky_call = gemm.ShapeRun(Shape(1000, 1000, 1000), [0.001, 1.0, 1.0, 1.0, 1.0])
    steady = gemm.ShapeRun(Shape(1000, 1000, 1000), [0.5, 0.5, 0.5, 0.5, 0.5])
    result = gemm.DtypeResult("fp32", "cpu", scouted=[], confirmed=[one_lucky_call, steady])
    assert result.best is steady
    assert one_lucky_call.tflops[0] == pytest.approx(2.0) and one_lucky_call.median_tflops == pytest.approx(0.002)


# ---------------------------------------------------------------- the correctness check


def corrupting(monkeypatch, corrupt):
    """Replace the product with one that `corrupt(ops, call_number)` damages after computing it."""
    real_multiply = gemm.multiply
    count = {"calls": 0}

    def multiply(ops):
        real_multiply(ops)
        count["calls"] += 1
        corrupt(ops, count["calls"])

    monkeypatch.setattr(gemm, "multiply", multiply)


def test_the_check_passes_a_healthy_product():
    by_name, _ = run_cpu(0.5, shapes=SMALL_SHAPES)
    check = by_name["gemm.fp32"]["details"]["check"]
    assert check["ok"] and not check["nan_or_inf"] and not check["repeat_mismatch"]
    assert 0 <= check["max_error"] < check["tolerance"] and check["checksum_error"] < check["tolerance"]


def test_a_flipped_bit_in_the_reference_block_fails_the_check(monkeypatch):
    corrupting(monkeypatch, lambda ops, call: flip_bit(ops, 1, 2))
    by_name, _ = run_cpu(0.5, shapes=SMALL_SHAPES)
    check = by_name["gemm.fp32"]["details"]["check"]
    assert not check["ok"] and check["max_error"] > check["tolerance"]
    failures = by_name["gemm.check_failures"]
    assert failures["value"] == 1 and failures["details"]["failed"] == ["fp32"]


def test_a_flipped_bit_outside_the_blocks_is_caught_by_the_checksum(monkeypatch):
    corrupting(monkeypatch, lambda ops, call: flip_bit(ops, ops.out.shape[0] // 2, ops.out.shape[1] // 2))
    by_name, _ = run_cpu(0.5, shapes=SMALL_SHAPES)
    check = by_name["gemm.fp32"]["details"]["check"]
    assert check["max_error"] < check["tolerance"]  # the corner blocks are right
    assert check["checksum_error"] > check["tolerance"] and not check["ok"]
    assert by_name["gemm.check_failures"]["value"] == 1


def test_an_error_only_under_load_is_caught_by_the_repeat_comparison(monkeypatch):
    """Right on the first, untimed call; slightly wrong on the timed ones (a fault that shows under load)."""
    timing = {"now": False}
    real_time_each = gemm.time_each

    def flagged_time_each(*args, **kwargs):
        timing["now"] = True
        try:
            return real_time_each(*args, **kwargs)
        finally:
            timing["now"] = False

    def wrong_under_load(ops, call):
        if timing["now"]:
            m, n = ops.out.shape
            ops.out[m // 2, n // 3] += 1e-3 * math.sqrt(ops.a.shape[1])  # 1e-3 of the product's RMS

    monkeypatch.setattr(gemm, "time_each", flagged_time_each)
    corrupting(monkeypatch, wrong_under_load)
    by_name, _ = run_cpu(0.5, shapes=SMALL_SHAPES)
    check = by_name["gemm.fp32"]["details"]["check"]
    assert check["max_error"] < check["tolerance"] and check["checksum_error"] < check["tolerance"]  # too small for those
    assert check["repeat_mismatch"] and not check["ok"]


def test_nan_anywhere_fails_the_check_and_the_record_stays_json(monkeypatch):
    corrupting(monkeypatch, lambda ops, call: ops.out.__setitem__((ops.out.shape[0] - 1, 0), float("nan")))
    by_name, _ = run_cpu(0.5, shapes=SMALL_SHAPES)
    check = by_name["gemm.fp32"]["details"]["check"]
    assert check["nan_or_inf"] and not check["ok"] and check["checksum_error"] is None
    json.dumps(list(by_name.values()), allow_nan=False)


def product_check(dtype: str, shape: Shape, product) -> dict:
    """check_product on `product(a, b)` (float64 in, float64 out) written into the dtype's output."""
    sizes = gemm.BufferSizes().including(shape)
    ops = gemm.Workspace.allocate("cpu", dtype, sizes).operands(shape)
    ops.out.copy_(product(ops.a.double(), ops.b.double()))
    ops.first_out.copy_(ops.out)
    return gemm.check_product(ops, gemm.TOLERANCE[dtype])


def exact(a, b):
    return a @ b.T


def bf16_split_k(a, b, parts: int = 8):
    """The worst healthy bf16 GEMM: split-K partial sums each rounded to bf16, added in bf16."""
    total = None
    for part in range(parts):
        partial = (a[:, part::parts] @ b[:, part::parts].T).to(torch.bfloat16)
        total = partial if total is None else (total.float() + partial.float()).to(torch.bfloat16)
    return total.double()


def tf32_inputs(a, b):
    """TF32 tensor cores: inputs truncated to 10 mantissa bits."""
    def cut(x):
        return (x.float().view(torch.int32) & ~((1 << 13) - 1)).view(torch.float32).double()
    return cut(a) @ cut(b).T


def nudge_one(product, relative: float):
    """A product with one element off by `relative` times the RMS of the product."""
    def damaged(a, b):
        out = product(a, b)
        out[3, 4] += relative * out.square().mean().sqrt()
        return out
    return damaged


@pytest.mark.parametrize("dtype, healthy", [("fp32", exact), ("tf32", tf32_inputs), ("fp16", exact), ("bf16", bf16_split_k),
                                            ("bf16", exact), ("fp8", exact)])
def test_tolerances_accept_healthy_rounding(dtype, healthy):
    check = product_check(dtype, Shape(128, 128, 4096), healthy)
    assert check["ok"], check


@pytest.mark.parametrize("dtype", gemm.DTYPES)
def test_tolerances_reject_an_element_off_by_its_own_size(dtype):
    check = product_check(dtype, Shape(128, 128, 4096), nudge_one(exact, 1.0))
    assert not check["ok"] and check["max_error"] > check["tolerance"]


def test_fp32_tolerance_is_strict_where_bf16_is_loose():
    small_error = nudge_one(exact, 1e-3)
    assert not product_check("fp32", Shape(128, 128, 1024), small_error)["ok"]
    assert product_check("bf16", Shape(128, 128, 1024), small_error)["ok"]
    # TF32 leaking into an fp32 measurement would show as wrong results.
    assert not product_check("fp32", Shape(128, 128, 4096), tf32_inputs)["ok"]


@pytest.mark.parametrize("dtype", gemm.DTYPES)
def test_every_dtype_path_measures_and_checks_on_the_cpu(dtype):
    """The GPU paths (torch._scaled_mm with a column-major B for fp8, bf16 output) run on the CPU too."""
    result = gemm.measure_dtype("cpu", dtype, Budget(0.2), [Shape(256, 128, 512)])
    assert result.best.median_tflops > 0 and result.check["ok"], result.check


# ---------------------------------------------------------------- dtypes, math mode, budget


def test_cpu_plan_is_fp32_and_unknown_dtypes_are_named():
    plan, skipped = gemm.plan_dtypes("cpu", gemm.requested_dtypes({"dtypes": "fp32, bf16,fp4"}))
    assert plan == ["fp32"]
    assert "fp32 only" in skipped["bf16"] and "unknown" in skipped["fp4"]
    with pytest.raises(Skip, match="bf16"):
        run_cpu(1.0, dtypes=["bf16"])


@pytest.mark.parametrize("capability, runs, reasons", [
    ((7, 5), ["fp32", "fp16"], {"tf32": "8.0", "bf16": "8.0", "fp8": "8.9"}),
    ((8, 0), ["fp32", "tf32", "fp16", "bf16"], {"fp8": "8.9"}),
    ((9, 0), ["fp32", "tf32", "fp16", "bf16"], {"fp8": "does not run here"}),  # the probe fails on a CPU build
])
def test_gpu_plan_follows_the_compute_capability(monkeypatch, capability, runs, reasons):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    plan, skipped = gemm.plan_dtypes("cuda:0", list(gemm.DTYPES))
    assert plan == runs
    assert set(skipped) == set(reasons)
    assert all(text in skipped[dtype] for dtype, text in reasons.items())


def test_fp32_runs_without_tf32_and_the_setting_is_restored(monkeypatch):
    seen = []
    real_multiply = gemm.multiply

    def multiply(ops):
        seen.append(gemm.tf32_enabled())
        real_multiply(ops)

    monkeypatch.setattr(gemm, "multiply", multiply)
    before = gemm.cublas_fp32_setting()
    gemm.set_cublas_tf32(True)  # what a user's training script might have done
    try:
        run_cpu(0.5, shapes=SMALL_SHAPES[:1])
        assert seen and not any(seen)
        assert gemm.tf32_enabled()
        with gemm.math_mode("fp32", 1.0) as held:
            assert held and not gemm.tf32_enabled()
        assert gemm.tf32_enabled()
        gemm.restore_cublas_fp32(before)
        with gemm.math_mode("tf32", 1.0) as held:
            assert held and gemm.tf32_enabled()
        assert gemm.cublas_fp32_setting() == before
        assert torch.backends.cuda.matmul.allow_tf32 in (True, False)  # torch sees no mix of its old and new APIs
    finally:
        gemm.restore_cublas_fp32(before)


def test_gpu_threads_share_one_fp32_math_mode_at_a_time():
    """GEMM jobs of several GPUs run in threads: fp32 in one must not run while another has TF32 on."""
    mode = gemm.Fp32MathMode()
    entered, release = threading.Event(), threading.Event()

    def other_gpu_in_fp32():
        with mode.hold(False, 5.0):
            entered.set()
            release.wait(5.0)

    thread = threading.Thread(target=other_gpu_in_fp32)
    thread.start()
    try:
        assert entered.wait(5.0)
        with mode.hold(False, 0.0) as held:  # the same mode is shared
            assert held
        with mode.hold(True, 0.05) as held:  # the other mode waits, here in vain
            assert not held
    finally:
        release.set()
        thread.join(5.0)
    with mode.hold(True, 1.0) as held:
        assert held and gemm.tf32_enabled()
    assert not gemm.tf32_enabled()


def test_no_budget_raises_out_of_time():
    with pytest.raises(OutOfTime):
        run_cpu(0.0)


def test_a_shape_too_slow_for_the_time_left_is_not_tried():
    assert gemm.too_slow(Shape(1000, 1000, 1000), best_flops_per_s=1e9, seconds_left=1.0)  # 5 calls of 2 s
    assert not gemm.too_slow(Shape(1000, 1000, 1000), best_flops_per_s=1e9, seconds_left=100.0)
    assert not gemm.too_slow(Shape(1000, 1000, 1000), best_flops_per_s=0.0, seconds_left=1.0)  # nothing seen yet
    by_name, elapsed = run_cpu(0.1, shapes=[[256, 256, 256], [2048, 2048, 2048]])
    assert by_name["gemm.fp32"]["details"]["shapes_not_tried"] == [[2048, 2048, 2048]]
    assert elapsed < 3 * 0.1 + 2


def test_a_tiny_budget_measures_fewer_shapes_without_overrunning():
    by_name, elapsed = run_cpu(0.05)
    d = by_name["gemm.fp32"]["details"]
    assert len(d["shapes_tried"]) < len(gemm.default_candidates("cpu"))
    assert d["shapes_not_tried"]
    assert d["check"]["ok"]
    assert elapsed < 3 * 0.05 + 2


# ---------------------------------------------------------------- candidate shapes and memory


def test_default_cpu_candidates_span_1024_to_2048():
    shapes = gemm.default_candidates("cpu")
    assert min(s.m for s in shapes) == 1024 and max(s.m for s in shapes) == 2048
    assert any(s.k > s.m for s in shapes)  # a long-K shape too


def test_wave_filling_shapes_fill_whole_waves_of_sms():
    for sm_count in (108, 132, 128, 148):
        shapes = gemm.wave_filling_shapes(sm_count)
        tiles = [(s.m // 128) * (s.n // 256) for s in shapes]
        assert tiles == [sm_count, 2 * sm_count]
    assert gemm.wave_filling_shapes(132)[0] in (Shape(2816, 1536, 16384), Shape(1536, 2816, 16384))
    assert gemm.wave_filling_shapes(8) == []


def test_shapes_are_kept_to_what_fits_in_the_memory_limit():
    shapes = [Shape(s, s, s) for s in (4096, 1024, 2048)]
    sizes_2048 = gemm.BufferSizes().including(Shape(2048, 2048, 2048))
    # A, B and the output twice (product and first copy) in bf16
    assert sizes_2048.bytes("bf16") == 4 * 2048 * 2048 * 2
    assert sizes_2048.bytes("fp8") == 2 * 2048 * 2048 * 1 + 2 * 2048 * 2048 * 2
    assert gemm.fitting_shapes(shapes, "bf16", sizes_2048.bytes("bf16")) == [Shape(1024, 1024, 1024), Shape(2048, 2048, 2048)]
    assert gemm.fitting_shapes(shapes, "bf16", 1000) == []


def test_a_memory_limit_below_every_shape_skips_the_dtype(monkeypatch):
    monkeypatch.setattr(gemm, "free_memory_bytes", lambda device: 4 * 1000)
    with pytest.raises(Skip, match="quarter of free memory"):
        run_cpu(1.0, shapes=SMALL_SHAPES)
