"""B1 GEMM benchmark on the CPU build of torch: the contract, the sweep, the timing, the check."""

from __future__ import annotations

import json
import math
import statistics
import threading
import types

import pytest

torch = pytest.importorskip("torch")

from fake_clock import FakeClock  # noqa: E402
from gpuvet.bench import common, gemm  # noqa: E402
from gpuvet.bench.common import BenchContext, Budget, OutOfTime, Skip  # noqa: E402
from gpuvet.bench.gemm import Shape  # noqa: E402
from gpuvet.specs import reference  # noqa: E402

SMALL_SHAPES = [[256, 256, 512], [384, 384, 512], [256, 256, 1024]]


def run_cpu(seconds: float, **params):
    ctx = BenchContext(device="cpu", subject="cpu", budget=Budget(seconds), params=params)
    return {m["name"]: m for m in gemm.run(ctx)}


FAKE_FLOPS_PER_S = 2e10  # a small CPU's fp32 rate (a loaded 2-core CI machine: about 15 GFLOPS)


def run_on_a_fake_clock(monkeypatch, seconds: float, flops_per_s: float = FAKE_FLOPS_PER_S, **params):
    """gemm.run on a clock that moves only by each product's flops at `flops_per_s` (the products
    are still computed and checked): where a run stops in its budget is then the same on any machine,
    whatever its load. The measurements, and the fake seconds the run took."""
    clock = FakeClock().install(monkeypatch, gemm, common)
    real_multiply = gemm.multiply

    def multiply(ops):
        real_multiply(ops)
        (m, k), n = ops.a.shape, ops.b.shape[0]
        clock.advance(2 * m * n * k / flops_per_s)

    monkeypatch.setattr(gemm, "multiply", multiply)
    start = clock.now
    measurements = gemm.run(BenchContext(device="cpu", subject="cpu", budget=Budget(seconds), params=params))
    return {m["name"]: m for m in measurements}, clock.now - start


def call_s(shape: list[int], flops_per_s: float = FAKE_FLOPS_PER_S) -> float:
    m, n, k = shape
    return 2 * m * n * k / flops_per_s


def fewest_calls_s(shape: list[int], flops_per_s: float = FAKE_FLOPS_PER_S) -> float:
    """The fake seconds of the fewest calls any run of a shape makes (first, warm-up, timed)."""
    return (2 + gemm.MIN_TIMED_CALLS) * call_s(shape, flops_per_s)


def budget_bound_s(budget: float, details: dict, flops_per_s: float = FAKE_FLOPS_PER_S) -> float:
    """How long a GEMM run may take: its budget, or the fewest calls of its first (smallest) shape
    where those alone take longer (the one run there must be time for), plus a stated slack of one
    call of the largest shape it ran (a run whose warm-up ends a little late makes its fewest calls)."""
    first = min((row[:3] for row in details["shapes_tried"]), key=lambda s: s[0] * s[1] * s[2])
    largest = max((row[:3] for row in details["shapes_tried"]), key=lambda s: s[0] * s[1] * s[2])
    return max(budget, fewest_calls_s(first, flops_per_s)) + call_s(largest, flops_per_s)


def flip_bit(ops, row: int, col: int, bit: int = 30) -> None:
    """A silent data corruption: one bit of one fp32 element (bit 30 is the exponent's top bit)."""
    ops.out.view(torch.int32)[row, col] ^= 1 << bit


# ---------------------------------------------------------------- the contract on the CPU


def test_cpu_run_measures_fp32_with_the_default_shapes(monkeypatch):
    by_name, elapsed = run_on_a_fake_clock(monkeypatch, 2.0)
    assert list(by_name) == ["gemm.fp32", "gemm.check_failures"]
    m = by_name["gemm.fp32"]
    assert (m["unit"], m["subject"]) == ("TFLOPS", "cpu")
    assert m["value"] > 0
    d = m["details"]
    assert {"shape", "dtype", "iterations", "summary", "shapes_tried", "finalists", "check", "skipped_dtypes",
            "timing", "spread_iqr_pct", "cpu_share", "blocks", "calm_blocks", "shapes_retimed"} <= set(d)
    assert d["dtype"] == "fp32"
    assert set(d["skipped_dtypes"]) == {"tf32", "fp16", "bf16", "fp8"}
    assert all("fp32 only" in why for why in d["skipped_dtypes"].values())
    assert d["shapes_tried"]  # how many fit in the time depends on the machine's load
    candidates = [s.as_list() for s in gemm.default_candidates("cpu")]
    assert all([m_, n, k] in candidates for m_, n, k, _rate in d["shapes_tried"])
    assert 0 < d["cpu_share"] < 2 and 0 <= d["calm_blocks"] <= d["blocks"] >= 1
    assert d["summary"]["n"] == d["iterations"] >= gemm.MIN_TIMED_CALLS
    assert d["check"]["ok"] is True
    failures = by_name["gemm.check_failures"]
    assert (failures["value"], failures["unit"], failures["subject"]) == (0, "count", "cpu")
    assert failures["details"]["failed"] == [] and failures["details"]["checked"] == ["fp32"]
    # The budget holds on the benchmark's own clock: it stops where its time ends, and says so.
    assert elapsed <= budget_bound_s(2.0, d)
    assert d["wall_s"] == pytest.approx(elapsed)
    json.dumps(list(by_name.values()), allow_nan=False)  # the record is strict JSON


def test_the_value_is_the_best_finalist_median_and_finalists_are_the_best_scouts():
    by_name = run_cpu(3.0, shapes=SMALL_SHAPES)  # room for two shapes on a loaded 2-core machine
    d = by_name["gemm.fp32"]["details"]
    # A sweep, not one shape (on a loaded CI machine the budget may not reach every candidate).
    assert len(d["shapes_tried"]) >= 2
    scouted = sorted(d["shapes_tried"], key=lambda row: row[3], reverse=True)
    # Each of the best scouts is timed again, unless the time left could not hold its fewest calls.
    timed = [str(Shape(*row[:3])) for row in d["finalists"]]
    assert timed and timed + sorted(d["finalists_not_timed"]) == [str(Shape(*row[:3])) for row in scouted[: gemm.FINALISTS]]
    best = max(d["finalists"], key=lambda row: row[3])
    assert d["shape"] == best[:3]
    assert by_name["gemm.fp32"]["value"] == pytest.approx(best[3]) == pytest.approx(d["summary"]["median"])


def test_the_value_comes_from_per_call_timings(monkeypatch):
    """The value is the median of per-call rates: on the CPU, over the calls of the best finalist's
    calm blocks, every one of them timed on its own by time_each."""
    timed, blocks = [], []
    real_time_each, real_run_shape = gemm.time_each, gemm.run_shape

    def spy_time_each(device, fn, repeats, before=None):
        times = real_time_each(device, fn, repeats, before=before)
        timed.append((repeats, before, times))
        return times

    def spy_run_shape(device, workspace, shape, seconds, flush, **kwargs):
        run = real_run_shape(device, workspace, shape, seconds, flush, **kwargs)
        blocks.append((kwargs["max_calls"] == gemm.FINAL_MAX_CALLS, run))  # a finalist's block (the first scout is checked too)
        return run

    monkeypatch.setattr(gemm, "time_each", spy_time_each)
    monkeypatch.setattr(gemm, "run_shape", spy_run_shape)
    by_name = run_cpu(1.0, shapes=SMALL_SHAPES)
    m = by_name["gemm.fp32"]
    d = m["details"]
    assert timed and all(len(times) == repeats and before is None for repeats, before, times in timed)  # CPU: no flush
    assert all(any(run.seconds is times for _, _, times in timed) for _, run in blocks)
    final = [run for finalist, run in blocks if finalist and run.shape.as_list() == d["shape"]]
    kept = [run for run in final if not run.noisy] or final
    assert len(final) == d["blocks"] and len([run for run in final if not run.noisy]) == d["calm_blocks"]
    m_, n, k = d["shape"]
    rates = [2 * m_ * n * k / t / 1e12 for run in kept for t in run.seconds]
    assert m["value"] == pytest.approx(statistics.median(rates))
    assert d["iterations"] == len(rates)


def cpu_run(side: int, seconds: list[float], share: float | None = 1.0, check: bool = False) -> gemm.ShapeRun:
    check_result = {"ok": True, "max_error": 0.0, "tolerance": 1e-4, "nan_or_inf": False, "repeat_mismatch": False,
                    "repeat_error": 0.0, "repeat_tolerance": 1e-5, "checksum_error": 0.0} if check else None
    return gemm.ShapeRun(Shape(side, side, side), seconds, check_result, cpu_share=share)


def test_a_run_is_noisy_when_the_cpus_were_taken_or_the_calls_scatter():
    assert not cpu_run(100, [1.0, 1.0, 1.02, 0.98, 1.0]).noisy
    assert cpu_run(100, [1.0, 1.0, 1.02, 0.98, 1.0], share=0.6).noisy  # another process held a core
    assert cpu_run(100, [1.0, 2.0, 1.0, 2.0, 1.0, 2.0]).noisy  # bimodal calls
    assert not cpu_run(100, [1.0, 2.0, 1.0], share=None).noisy  # too few calls to tell; a GPU has no share
    assert cpu_run(100, [1.0, 1.0, 1.0, 1.0]).spread == 0.0


def test_noisy_blocks_are_set_aside_when_the_shape_has_a_calm_one():
    calm, taken = cpu_run(100, [1.0] * 5, check=True), cpu_run(100, [2.0] * 5, share=0.5, check=True)
    taken.check = dict(taken.check, ok=False)  # every block's check counts, calm or not
    run = gemm.pooled(Shape(100, 100, 100), [taken, calm])
    assert run.seconds == [1.0] * 5 and (run.blocks, run.calm_blocks) == (2, 1) and run.cpu_share == 1.0
    assert run.check["ok"] is False and run.check["runs_checked"] == 2
    all_taken = gemm.pooled(Shape(100, 100, 100), [taken, cpu_run(100, [3.0] * 5, share=0.4, check=True)])
    assert len(all_taken.seconds) == 10 and all_taken.calm_blocks == 0  # none calm: all of them, and it says so


FAKE_WORKSPACE = types.SimpleNamespace(dtype="fp32")  # what scout and confirm read of it, run_shape being replaced


def scripted_run_shape(monkeypatch, script: dict):
    """run_shape replaced by runs from `script` (shape side -> list of ShapeRuns, used in turn); returns the call log."""
    log = []

    def fake(device, workspace, shape, seconds, flush, *, max_calls, check, warm_up_fraction=gemm.WARM_UP_FRACTION):
        log.append((shape.m, check, seconds))
        run = script[shape.m].pop(0)
        return gemm.ShapeRun(shape, run.seconds, run.check, cpu_share=run.cpu_share)

    monkeypatch.setattr(gemm, "run_shape", fake)
    return log


def test_a_noisy_scout_is_timed_again_and_ranked_by_its_steadier_run(monkeypatch):
    # 300 was slowed by load from elsewhere while scouting; timed again it is the fastest.
    log = scripted_run_shape(monkeypatch, {
        100: [cpu_run(100, [1e-3] * 5)],
        200: [cpu_run(200, [5e-3] * 5)],
        300: [cpu_run(300, [1.0] * 5, share=0.5), cpu_run(300, [0.01] * 5)],
    })
    shapes = [Shape(s, s, s) for s in (100, 200, 300)]
    runs, not_tried = gemm.scout("cpu", FAKE_WORKSPACE, shapes, Budget(10.0), None, lambda message: None, gemm.CPU_METHOD)
    assert [m for m, _, _ in log] == [100, 200, 300, 300] and not not_tried
    assert runs[2].retimed and not runs[2].noisy and not runs[0].retimed
    assert gemm.finalists(runs) == [Shape(300, 300, 300), Shape(200, 200, 200)]


def test_the_gpu_method_trusts_its_scouts_and_times_each_finalist_once(monkeypatch):
    assert gemm.method_for("cuda:0") is gemm.GPU_METHOD and gemm.method_for("cpu") is gemm.CPU_METHOD
    assert (gemm.GPU_METHOD.scout_fraction, gemm.GPU_METHOD.retime_fraction, gemm.GPU_METHOD.final_block_s) == (0.5, 0.0, None)
    log = scripted_run_shape(monkeypatch, {
        100: [cpu_run(100, [1e-3] * 5), cpu_run(100, [1e-3] * 5, check=True)],
        200: [cpu_run(200, [1.0] * 5, share=0.5)],
        300: [cpu_run(300, [0.02] * 5), cpu_run(300, [0.02] * 5, check=True)],
    })
    monkeypatch.setattr(gemm, "method_for", lambda device: gemm.GPU_METHOD)
    result = gemm.measure_dtype("cpu", "fp32", Budget(10.0), [Shape(s, s, s) for s in (100, 200, 300)])
    # The first scout is checked (on a device too slow for its budget it would be the figure).
    assert [(m, check) for m, check, _ in log] == [(100, True), (200, False), (300, False), (300, True), (100, True)]
    assert [run.blocks for run in result.confirmed] == [1, 1]


def test_cpu_finalists_are_timed_in_turns_of_checked_blocks(monkeypatch):
    blocks = 2 * 3  # three turns of two finalists
    log = scripted_run_shape(monkeypatch, {
        100: [cpu_run(100, [1e-3] * 5, check=True) for _ in range(blocks)],
        200: [cpu_run(200, [8e-3] * 5, share=0.5 if i == 0 else 1.0, check=True) for i in range(blocks)],
    })
    runs = gemm.confirm_in_turns("cpu", FAKE_WORKSPACE, [Shape(200, 200, 200), Shape(100, 100, 100)],
                                 Budget(blocks * gemm.CPU_METHOD.final_block_s), None,
                                 lambda message: None, gemm.CPU_METHOD, {}, {})
    assert [m for m, _, _ in log] == [200, 100] * (blocks // 2) and all(check for _, check, _ in log)
    assert [(run.shape.m, run.blocks, run.calm_blocks) for run in runs] == [(200, blocks // 2, blocks // 2 - 1),
                                                                           (100, blocks // 2, blocks // 2)]


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
    by_name = run_cpu(0.5, shapes=SMALL_SHAPES)
    check = by_name["gemm.fp32"]["details"]["check"]
    assert check["ok"] and not check["nan_or_inf"] and not check["repeat_mismatch"]
    assert 0 <= check["max_error"] < check["tolerance"] and check["checksum_error"] < check["tolerance"]


def test_a_flipped_bit_in_the_reference_block_fails_the_check(monkeypatch):
    corrupting(monkeypatch, lambda ops, call: flip_bit(ops, 1, 2))
    by_name = run_cpu(0.5, shapes=SMALL_SHAPES)
    check = by_name["gemm.fp32"]["details"]["check"]
    assert not check["ok"] and check["max_error"] > check["tolerance"]
    failures = by_name["gemm.check_failures"]
    assert failures["value"] == 1 and failures["details"]["failed"] == ["fp32"]


def test_a_flipped_bit_outside_the_blocks_is_caught_by_the_checksum(monkeypatch):
    corrupting(monkeypatch, lambda ops, call: flip_bit(ops, ops.out.shape[0] // 2, ops.out.shape[1] // 2))
    by_name = run_cpu(0.5, shapes=SMALL_SHAPES)
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
    by_name = run_cpu(0.5, shapes=SMALL_SHAPES)
    check = by_name["gemm.fp32"]["details"]["check"]
    assert check["max_error"] < check["tolerance"] and check["checksum_error"] < check["tolerance"]  # too small for those
    assert check["repeat_mismatch"] and not check["ok"]


def test_nan_anywhere_fails_the_check_and_the_record_stays_json(monkeypatch):
    corrupting(monkeypatch, lambda ops, call: ops.out.__setitem__((ops.out.shape[0] - 1, 0), float("nan")))
    by_name = run_cpu(0.5, shapes=SMALL_SHAPES)
    check = by_name["gemm.fp32"]["details"]["check"]
    assert check["nan_or_inf"] and not check["ok"] and check["checksum_error"] is None
    json.dumps(list(by_name.values()), allow_nan=False)


def product_check(dtype: str, shape: Shape, product) -> dict:
    """check_product on `product(a, b)` (float64 in, float64 out) written into the dtype's output."""
    sizes = gemm.BufferSizes().including(shape)
    ops = gemm.Workspace.allocate("cpu", dtype, sizes).operands(shape)
    ops.out.copy_(product(ops.a.double(), ops.b.double()) * gemm.scale_factor(ops))  # fp8: scaled into e4m3's range
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
    """The GPU paths (torch._scaled_mm with a column-major B for fp8, e4m3 output) run on the CPU too."""
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
    without_tf32_overrides(monkeypatch)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    plan, skipped = gemm.plan_dtypes("cuda:0", list(gemm.DTYPES))
    assert plan == runs
    assert set(skipped) == set(reasons)
    assert all(text in skipped[dtype] for dtype, text in reasons.items())


def without_tf32_overrides(monkeypatch):
    for name in ("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "NVIDIA_TF32_OVERRIDE"):
        monkeypatch.delenv(name, raising=False)


def test_an_environment_that_forces_the_other_fp32_math_mode_skips_the_dtype_it_would_falsify(monkeypatch):
    """TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 (set in NVIDIA's containers) makes "fp32" TF32, which fails the
    fp32 check on a healthy GPU; NVIDIA_TF32_OVERRIDE=0 makes "tf32" fp32. Each skips, saying how to unset it."""
    without_tf32_overrides(monkeypatch)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(gemm, "fp8_unsupported_reason", lambda device, capability: None)
    assert gemm.plan_dtypes("cuda:0", ["fp32", "tf32"]) == (["fp32", "tf32"], {})

    monkeypatch.setenv("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "1")
    plan, skipped = gemm.plan_dtypes("cuda:0", list(gemm.DTYPES))
    assert plan == ["tf32", "fp16", "bf16", "fp8"] and set(skipped) == {"fp32"}
    assert "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1" in skipped["fp32"] and "TF32" in skipped["fp32"]
    assert "env -u TORCH_ALLOW_TF32_CUBLAS_OVERRIDE" in skipped["fp32"]

    monkeypatch.setenv("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "0")
    monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", "0")
    plan, skipped = gemm.plan_dtypes("cuda:0", list(gemm.DTYPES))
    assert plan == ["fp32", "fp16", "bf16", "fp8"] and set(skipped) == {"tf32"}
    assert "NVIDIA_TF32_OVERRIDE=0" in skipped["tf32"] and "env -u NVIDIA_TF32_OVERRIDE" in skipped["tf32"]

    # The CPU has no TF32: its fp32 is measured whatever the environment says.
    monkeypatch.setenv("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "1")
    assert gemm.plan_dtypes("cpu", ["fp32"]) == (["fp32"], {})


@pytest.mark.parametrize("environ, capability, skipped", [
    ({"TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "1"}, (8, 0), {"fp32"}),
    ({"TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "1"}, (7, 0), set()),  # no TF32 before Ampere: fp32 stays fp32
    ({"TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "true"}, (9, 0), set()),  # torch reads exactly "1" (and warns)
    ({"TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "0", "NVIDIA_TF32_OVERRIDE": "1"}, (9, 0), set()),
    ({"NVIDIA_TF32_OVERRIDE": "0"}, (9, 0), {"tf32"}),
    ({"NVIDIA_TF32_OVERRIDE": "0", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "1"}, (9, 0), {"fp32", "tf32"}),
])
def test_tf32_override_reason_reads_the_variables_as_the_libraries_do(environ, capability, skipped):
    reasons = {dtype: gemm.tf32_override_reason(dtype, capability, environ) for dtype in gemm.DTYPES}
    assert {dtype for dtype, why in reasons.items() if why} == skipped


@pytest.mark.parametrize("version, old", [("2.3.1+cu121", True), ("2.1.0", True), ("2.4.0", True),
                                          ("2.4.0a0+07cecf4.nv24.5", True), ("2.5.1+cu124", False),
                                          ("2.10.0.dev20250916+cu130", False), ("2.13.0+cpu", False), ("unknown", False)])
def test_fp8_on_a_torch_with_the_old_api_says_it_needs_2_5(monkeypatch, version, old):
    """The old torch._scaled_mm took keyword scales and returned (out, amax); 2.4 lets fp8 through
    with it (issue 24): the reason names the version the API needs, not that fp8 "does not run here"."""
    reason = gemm.scaled_mm_api_reason(version)
    assert (reason is not None) == old
    if old:
        assert reason == f"torch {version} has the old torch._scaled_mm API: fp8 needs torch >= 2.5"
        monkeypatch.setattr(torch, "__version__", version)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
        _, skipped = gemm.plan_dtypes("cuda:0", ["fp8"])
        assert skipped["fp8"] == reason


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


def test_a_shape_too_slow_for_the_time_left_is_not_tried(monkeypatch):
    assert gemm.too_slow(Shape(1000, 1000, 1000), best_flops_per_s=1e9, seconds_left=1.0)  # 5 calls of 2 s
    assert not gemm.too_slow(Shape(1000, 1000, 1000), best_flops_per_s=1e9, seconds_left=100.0)
    assert not gemm.too_slow(Shape(1000, 1000, 1000), best_flops_per_s=0.0, seconds_left=1.0)  # nothing seen yet
    by_name, elapsed = run_on_a_fake_clock(monkeypatch, 0.1, shapes=[[256, 256, 256], [2048, 2048, 2048]])
    assert by_name["gemm.fp32"]["details"]["shapes_not_tried"] == [[2048, 2048, 2048]]
    assert elapsed <= budget_bound_s(0.1, by_name["gemm.fp32"]["details"])  # the 2048 shape's 5 calls alone would take 17 s


def test_a_tiny_budget_measures_fewer_shapes_without_overrunning(monkeypatch):
    by_name, elapsed = run_on_a_fake_clock(monkeypatch, 0.05)
    d = by_name["gemm.fp32"]["details"]
    assert len(d["shapes_tried"]) < len(gemm.default_candidates("cpu"))
    assert d["shapes_not_tried"]
    assert d["check"]["ok"]
    # Too little time for more than the fewest calls: each run of a shape (scout, finalist) gets
    # those and no more, so the overrun is bounded by them.
    assert d["iterations"] == gemm.MIN_TIMED_CALLS
    assert elapsed <= budget_bound_s(0.05, d)


@pytest.mark.parametrize(("flops_per_s", "budget"), [(5e9, 2.0), (5e9, 8.0), (2e10, 0.5), (1e11, 2.0)])
def test_a_slow_device_keeps_its_budget_and_its_headline_figure(monkeypatch, flops_per_s, budget):
    """A device too slow for its budget (5 GFLOPS: the first shape's fewest calls take 2.1 s)
    still gets a checked figure of its best shape, in its budget (or the first shape's fewest
    calls, where those alone are longer): a finalist that has no time left for its fewest calls is
    not timed again, and the record says which and why."""
    by_name, elapsed = run_on_a_fake_clock(monkeypatch, budget, flops_per_s)
    d = by_name["gemm.fp32"]["details"]
    assert elapsed <= budget_bound_s(budget, d, flops_per_s)
    assert by_name["gemm.fp32"]["value"] > 0 and d["check"]["ok"] is True
    best_scout = max(d["shapes_tried"], key=lambda row: row[3])
    assert d["shape"] == best_scout[:3]  # the headline shape is the sweep's best
    for shape, why in d["finalists_not_timed"].items():
        assert "would overrun the time left" in why and shape in {str(Shape(*row[:3])) for row in d["shapes_tried"]}
    if fewest_calls_s(gemm.default_candidates("cpu")[0].as_list(), flops_per_s) > budget:
        assert d["finalists_not_timed"]  # no time to time the best shape again: its checked scout is the figure


# ---------------------------------------------------------------- candidate shapes and memory


def test_a_build_with_the_old_fp8_api_is_named_by_the_probe(monkeypatch):
    """A build whose version passes but whose API is old (a pre-release, a vendor build): the
    probe's TypeError says so, not "does not run here"."""
    real_allocate = gemm.Workspace.allocate

    def old_scaled_mm(*args, **kwargs):
        raise TypeError("_scaled_mm() received an invalid combination of arguments - got (Tensor, Tensor, Tensor, Tensor)")

    monkeypatch.setattr(torch, "__version__", "2.5.0a0+e000000.nv24.8")
    monkeypatch.setattr(torch, "_scaled_mm", old_scaled_mm)
    monkeypatch.setattr(gemm.Workspace, "allocate", lambda device, dtype, sizes: real_allocate("cpu", dtype, sizes))
    reason = gemm.fp8_unsupported_reason("cuda:0", (9, 0))
    assert reason.startswith("torch 2.5.0a0+e000000.nv24.8 has the old torch._scaled_mm API")
    assert reason.endswith("fp8 needs torch >= 2.5") and "invalid combination of arguments" in reason


JUDGED = [ref for ref in reference.all_references() if ref.number("mamf_bf16_tflops") or ref.number("mamf_fp8_tflops")]


@pytest.mark.parametrize("ref", JUDGED, ids=[ref.id for ref in JUDGED])
def test_gpu_candidates_include_the_best_shapes_of_the_model_and_all_suit_fp8(monkeypatch, ref):
    """Every model judged against a mamf-finder best scouts that best's shapes (A100 bf16
    1024x10240x5120, B200 fp8 15360x4096x3072, ... stas00's MAMF tables), and every default shape
    runs in fp8 (torch._scaled_mm: n and k multiples of 16)."""
    props = types.SimpleNamespace(multi_processor_count=int(ref.number("sm_count")), name=ref.name)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
    candidates = gemm.default_candidates("cuda:0")
    wanted = [ref.row[column] for column in ("mamf_bf16_shape", "mamf_fp8_shape")
              if ref.number(column.replace("_shape", "_tflops"))]
    assert wanted and {str(shape) for shape in candidates} >= set(wanted)
    assert all(gemm.shape_unfit_reason("fp8", shape) is None for shape in candidates)
    # Scouting gets half of a dtype's time: a few more candidates, each a fraction of a millisecond a
    # call on a Hopper GPU, keep within it.
    assert len(set(candidates)) <= 16


def test_a_mig_slice_scouts_its_gpus_best_shapes(monkeypatch):
    props = types.SimpleNamespace(multi_processor_count=14, name="NVIDIA A100-SXM4-80GB MIG 1g.10gb")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
    assert Shape(1024, 10240, 5120) in gemm.default_candidates("cuda:0")


def test_default_cpu_candidates_are_calls_of_10_to_60_ms():
    shapes = gemm.default_candidates("cpu")
    # ~150 GFLOPS on two cores: long enough that a preempted thread is an outlier, short enough for
    # dozens of calls per block.
    assert all(1.5e9 <= s.flops <= 1e10 for s in shapes)
    assert any(s.k > s.m for s in shapes) and any(s.k == s.m for s in shapes)  # squares and long-K shapes


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
    assert sizes_2048.bytes("fp8") == 4 * 2048 * 2048 * 1  # e4m3 in and out, as mamf-finder
    assert gemm.fitting_shapes(shapes, "bf16", sizes_2048.bytes("bf16")) == [Shape(1024, 1024, 1024), Shape(2048, 2048, 2048)]
    assert gemm.fitting_shapes(shapes, "bf16", 1000) == []


def test_a_memory_limit_below_every_shape_skips_the_dtype(monkeypatch):
    monkeypatch.setattr(gemm, "free_memory_bytes", lambda device: 4 * 1000)
    with pytest.raises(Skip, match="quarter of free memory"):
        run_cpu(1.0, shapes=SMALL_SHAPES)


# ---------------------------------------------------------------- fp8 shapes, failures of one dtype


def fp8_on_the_cpu(monkeypatch):
    """Let run() plan fp8 on the CPU (torch._scaled_mm runs there too), as a GPU would."""
    monkeypatch.setattr(gemm, "unsupported_reason", lambda device, dtype: None)


def test_fp8_leaves_out_shapes_torch_scaled_mm_refuses_and_says_why(monkeypatch):
    fp8_on_the_cpu(monkeypatch)
    shapes = [[256, 128, 512], [256, 120, 512], [256, 128, 500], [250, 128, 512]]  # m is free
    by_name = run_cpu(1.0, dtypes=["fp32", "fp8"], shapes=shapes)
    fp8 = by_name["gemm.fp8"]["details"]
    assert {tuple(row[:3]) for row in fp8["shapes_tried"]} <= {(256, 128, 512), (250, 128, 512)}
    assert [256, 120, 512] in fp8["shapes_not_tried"] and [256, 128, 500] in fp8["shapes_not_tried"]
    for shape in ("256x120x512", "256x128x500"):
        assert "multiples of 16" in fp8["shapes_not_tried_why"][shape]
    assert fp8["check"]["ok"]
    assert "use_fast_accum=False" in fp8["accumulation"] and "use_fast_accum=False" in fp8["method"]
    fp32 = by_name["gemm.fp32"]["details"]  # fp32 has no such limit
    assert not any("multiples of 16" in why for why in fp32["shapes_not_tried_why"].values())
    assert "accumulation" not in fp32


def test_fp8_with_no_shape_it_can_take_is_skipped_with_the_reason(monkeypatch):
    fp8_on_the_cpu(monkeypatch)
    by_name = run_cpu(0.5, dtypes=["fp32", "fp8"], shapes=[[256, 120, 500]])
    d = by_name["gemm.fp32"]["details"]
    assert "gemm.fp8" not in by_name and "multiples of 16" in d["skipped_dtypes"]["fp8"]


def test_fp8_products_accumulate_in_full_fp32(monkeypatch):
    """As mamf-finder measured the fp8 figures gpuvet compares with: not cuBLASLt's fast accumulation."""
    seen = []
    real_scaled_mm = torch._scaled_mm

    def spy(*args, **kwargs):
        seen.append(kwargs.get("use_fast_accum"))
        return real_scaled_mm(*args, **kwargs)

    monkeypatch.setattr(torch, "_scaled_mm", spy)
    result = gemm.measure_dtype("cpu", "fp8", Budget(0.2), [Shape(256, 128, 512)])
    assert seen and set(seen) == {False} and result.check["ok"]


def test_an_error_in_one_dtype_keeps_the_other_dtypes_results(monkeypatch):
    """A library error in one dtype (here fp8's "divisible by 16") is that dtype's error, not the end of the benchmark."""
    fp8_on_the_cpu(monkeypatch)
    real_multiply = gemm.multiply

    def multiply(ops):
        if ops.dtype == "fp8":
            raise RuntimeError("Expected trailing dimension of mat1 to be divisible by 16 but got mat1 shape: (256x500).")
        real_multiply(ops)

    monkeypatch.setattr(gemm, "multiply", multiply)
    by_name = run_cpu(1.0, dtypes=["fp32", "fp8"], shapes=SMALL_SHAPES)
    assert list(by_name) == ["gemm.fp32", "gemm.check_failures"]
    assert by_name["gemm.fp32"]["value"] > 0 and by_name["gemm.fp32"]["details"]["check"]["ok"]
    error = "RuntimeError: Expected trailing dimension of mat1 to be divisible by 16 but got mat1 shape: (256x500)."
    assert by_name["gemm.fp32"]["details"]["failed_dtypes"] == {"fp8": error}
    failures = by_name["gemm.check_failures"]["details"]
    assert failures["errors"] == {"fp8": error} and failures["checked"] == ["fp32"]
    assert by_name["gemm.check_failures"]["value"] == 0  # an error is not a wrong product
    json.dumps(list(by_name.values()), allow_nan=False)


def test_when_every_dtype_fails_the_benchmark_fails_rather_than_skips(monkeypatch):
    def multiply(ops):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(gemm, "multiply", multiply)
    with pytest.raises(RuntimeError, match="fp32: RuntimeError: CUDA error: an illegal memory access"):
        run_cpu(0.5, shapes=SMALL_SHAPES)
