"""B2 memory bandwidth benchmark on the CPU build of torch."""

from __future__ import annotations

import statistics

import pytest

pytest.importorskip("torch")

from fake_clock import FakeClock  # noqa: E402
from gpuvet.bench import common, membw  # noqa: E402
from gpuvet.bench.common import BenchContext, Budget, OutOfTime, Skip  # noqa: E402

MiB = 2**20


def run_cpu(seconds: float, **params):
    ctx = BenchContext(device="cpu", subject="cpu", budget=Budget(seconds), params=params)
    return membw.run(ctx)


def run_on_a_fake_clock(monkeypatch, seconds: float, copy_s: float, **params):
    """membw.run on a clock that moves only by `copy_s` per timed copy (the copies are still made):
    how many copies a budget holds is then the same on any machine, whatever its load. The
    measurements, and the fake seconds the run took."""
    clock = FakeClock().install(monkeypatch, common)
    real_time_each = common.time_each

    def time_each(device, fn, repeats, before=None):
        def copy():
            fn()
            clock.advance(copy_s)

        return real_time_each(device, copy, repeats, before=before)

    monkeypatch.setattr(common, "time_each", time_each)  # calibrate_repeats' copy
    monkeypatch.setattr(membw, "time_each", time_each)
    start = clock.now
    measurements = membw.run(BenchContext(device="cpu", subject="cpu", budget=Budget(seconds), params=params))
    return measurements, clock.now - start


def test_cpu_run_measures_host_copy_bandwidth():
    (m,) = run_cpu(0.5, buffer_bytes=32 * MiB)
    assert (m["name"], m["unit"], m["subject"]) == ("membw.copy", "GB/s", "cpu")
    assert m["value"] > 0
    d = m["details"]
    assert d["buffer_bytes"] == 32 * MiB and d["bytes_per_copy"] == 64 * MiB
    assert d["bytes_counted"] == "read + write (2 x buffer per copy)"
    assert d["summary"]["n"] == d["iterations"] >= 3
    assert d["summary"]["min"] <= m["value"] <= d["summary"]["max"]


def test_the_timed_copies_fill_the_budget_and_stay_within_it(monkeypatch):
    (m,), elapsed = run_on_a_fake_clock(monkeypatch, 0.5, copy_s=0.01, buffer_bytes=4 * MiB)
    # One copy to calibrate, then as many as BUDGET_FRACTION of the budget holds.
    assert m["details"]["iterations"] == int(0.5 * membw.BUDGET_FRACTION / 0.01) == 40
    assert elapsed == pytest.approx(41 * 0.01) and elapsed <= 0.5
    assert m["value"] == pytest.approx(2 * 4 * MiB / 0.01 / 1e9)


def test_bandwidth_counts_read_and_write(monkeypatch):
    captured = []
    real_time_each = membw.time_each

    def spy(device, fn, repeats, before=None):
        times = real_time_each(device, fn, repeats, before=before)
        captured.append(times)
        return times

    monkeypatch.setattr(membw, "time_each", spy)
    (m,) = run_cpu(0.3, buffer_bytes=8 * MiB)
    (times,) = captured
    assert len(times) == m["details"]["iterations"]  # one time per copy
    assert m["value"] == pytest.approx(statistics.median(2 * 8 * MiB / t / 1e9 for t in times))


def test_buffers_are_1_gib_on_a_gpu_256_mib_on_the_cpu_and_within_a_quarter_of_free_memory(monkeypatch):
    monkeypatch.setattr(membw, "free_memory_bytes", lambda device: 100 * 2**30)
    assert membw.buffer_bytes("cuda:0") == 2**30
    assert membw.buffer_bytes("cpu") == 256 * MiB
    assert membw.buffer_bytes("cpu", requested=4 * MiB) == 4 * MiB
    monkeypatch.setattr(membw, "free_memory_bytes", lambda device: 80 * MiB)
    assert membw.buffer_bytes("cuda:0") == 10 * MiB  # source + destination = a quarter of free memory


def test_too_little_memory_skips(monkeypatch):
    monkeypatch.setattr(membw, "free_memory_bytes", lambda device: 4 * MiB)
    with pytest.raises(Skip, match="not enough free memory"):
        run_cpu(1.0)


def test_no_budget_raises_out_of_time():
    with pytest.raises(OutOfTime):
        run_cpu(0.0, buffer_bytes=MiB)


def test_a_budget_shorter_than_a_copy_still_times_three_copies_and_no_more(monkeypatch):
    (m,), elapsed = run_on_a_fake_clock(monkeypatch, 0.05, copy_s=0.05, buffer_bytes=4 * MiB)
    assert m["details"]["iterations"] == 3  # a median of three: the fewest that make a figure
    assert elapsed == pytest.approx(4 * 0.05)  # the calibrating copy and the three: the overrun is bounded
