"""The sustained load checks its results (issue 24): gpu-burn compares every product, and
corruption that shows only when the card is hot passed gpuvet's load unseen. The same code runs on
PyTorch's CPU build here; a product corrupted after a while is what a hot, failing GPU gives."""

from __future__ import annotations

from pathlib import Path

import torch

from gpuvet.bench import sustained
from gpuvet.bench.common import BenchContext, Budget
from gpuvet.judge import judge
from gpuvet.probe import capture
from gpuvet.record import Measurement

FIXTURES = Path(__file__).parent / "fixtures"


def run(duration_s: float = 1.2) -> dict:
    ctx = BenchContext("cpu", "gpu0", Budget(30.0), {"duration_s": duration_s, "size": 192})
    return {m["name"]: m for m in sustained.run(ctx)}


class HotTorch:
    """torch whose matmul starts flipping an exponent bit of one element after `good_calls`."""

    def __init__(self, good_calls: int):
        self.calls, self.good_calls = 0, good_calls

    def __getattr__(self, name):
        return getattr(torch, name)

    def mm(self, a, b, out):
        torch.mm(a, b, out=out)
        self.calls += 1
        if self.calls > self.good_calls:
            out[7, 11] *= 256.0


def test_a_healthy_load_repeats_its_product():
    check = run()["sustained.tflops"]["details"]["check"]
    assert check["windows_checked"] >= 2 and check["windows_wrong"] == 0
    assert check["largest_difference_of_rms"] < 1e-6  # a CPU library may sum in another order; a GPU repeats it


def test_a_product_that_changes_under_load_fails_the_gpu(monkeypatch):
    monkeypatch.setattr(sustained, "torch", HotTorch(good_calls=30))
    results = run()
    check = results["sustained.tflops"]["details"]["check"]
    assert check["windows_wrong"] >= 1 and check["first_wrong_at_s"] is not None
    m = capture.merge(capture.read_captures(str(FIXTURES / "smi_text/q-h100-80gb-hbm3-vm-590.48.01-idle.txt")))
    measurements = [Measurement(r["name"], r["value"], r["unit"], r["subject"], r["details"]) for r in results.values()]
    f = next(f for f in judge(m, measurements, {"benchmarks": ["sustained"], "device": "cuda"}) if f.check == "gpu.sustained")
    assert f.status == "fail" and "wrong results under load" in f.summary and "silent data corruption" in f.summary
    assert "stop using GPU 0" in f.remedy
