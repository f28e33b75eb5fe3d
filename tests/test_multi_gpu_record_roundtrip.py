"""A run on a machine with 2 or 8 GPUs can be read back (issue 24): the P2P benchmark writes
`p2p.matrix` with peer_access as a list of lists, which the record loader refused, so `inspect`,
`show` and `report` of any multi-GPU run exited 2.

The measurements are written by the benchmarks' own code, on the CPU build: p2p with the CUDA
stand-in of test_bench_multi_gpu (peer access refused, as on RTX 4090s), the sustained load and
the memory copy and the GEMM sweep on the CPU device under a GPU's subject, the host copies (alone
and all at once) with test_bench_transfer's stand-in. The machine is a real 8x RTX 4090 capture."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_runner import gpuvet
from gpuvet.bench import gemm, membw, p2p, pcie, sustained
from gpuvet.bench.common import STUCK_ON_GPU, BenchContext, Budget
from gpuvet.judge import judge
from gpuvet.probe import capture
from gpuvet.record import Measurement, RunRecord
from gpuvet.record.run import timestamp
from cuda_stand_in import CpuTorch
from test_bench_multi_gpu import _Cuda
from test_bench_transfer import _FakeCuda

FIXTURES = Path(__file__).parent / "fixtures"
MiB = 1 << 20


class _NoPeers(_Cuda):
    def can_device_access_peer(self, src, dst):
        super().can_device_access_peer(src, dst)
        return False


def p2p_measurements(monkeypatch, gpus: int) -> list[dict]:
    monkeypatch.setattr(p2p, "torch", CpuTorch(_NoPeers(gpus)))
    monkeypatch.setattr(p2p, "free_memory_bytes", lambda device: 64 << 30)
    try:
        return p2p.run(BenchContext("cuda:0", "machine", Budget(4.0), {"gpus": list(range(gpus)), "bytes": 8 * MiB}))
    finally:
        STUCK_ON_GPU.clear()


def pcie_measurements(monkeypatch, gpus: int) -> list[dict]:
    """Host copies alone, then (several GPUs) all at once, with the CUDA stand-in of test_bench_transfer."""
    monkeypatch.setattr(pcie, "torch", CpuTorch(_FakeCuda(gpus)))
    monkeypatch.setattr(pcie, "free_memory_bytes", lambda device: 64 << 30)
    monkeypatch.setattr(pcie, "PHASE_CAP_S", 0.02)
    results = []
    for index in range(gpus):
        for together in ([False, True] if gpus > 1 else [False]):
            params = {"bytes": 8 * MiB, "min_load_s": 0.05, "together": together, "cpu_affinity": [0],
                      "cpu_affinity_source": "sysfs local_cpulist"}
            results += pcie.run(BenchContext(f"cuda:{index}", f"gpu{index}", Budget(0.5), params))
    return results


def per_gpu_measurements(gpus: int) -> list[dict]:
    results = []
    for index in range(gpus):
        subject = f"gpu{index}"
        results += sustained.run(BenchContext("cpu", subject, Budget(30.0), {"duration_s": 0.2, "size": 128}))
        results += membw.run(BenchContext("cpu", subject, Budget(0.2), {"buffer_bytes": 4 * MiB}))
        results += gemm.run(BenchContext("cpu", subject, Budget(0.3), {"shapes": [[128, 128, 128]]}))
    return results


@pytest.mark.parametrize("gpus", [1, 2, 8])
def test_a_multi_gpu_run_is_read_back_by_every_reader(capsys, tmp_path, monkeypatch, gpus):
    monkeypatch.setenv("GPUVET_DB", str(tmp_path / "runs.sqlite3"))
    machine = capture.merge(capture.read_captures(str(FIXTURES / "smi_text/q-8x-rtx4090-all-idle-535.154.05.txt")))
    machine.gpus = machine.gpus[:gpus]
    written = (per_gpu_measurements(gpus) + pcie_measurements(monkeypatch, gpus)
               + (p2p_measurements(monkeypatch, gpus) if gpus > 1 else []))
    measurements = [Measurement(m["name"], m["value"], m["unit"], m["subject"], m["details"]) for m in written]
    benchmarks = ["gemm", "sustained", "membw", "pcie"] + (["p2p"] if gpus > 1 else [])
    options = {"benchmarks": benchmarks, "device": "cuda"}
    record = RunRecord(machine=machine, started_at=timestamp(), measurements=measurements,
                       findings=judge(machine, measurements, options), options=options)
    path = tmp_path / "run.json"
    path.write_text(record.to_json())
    if gpus > 1:
        matrix = next(m for m in json.loads(path.read_text())["measurements"] if m["name"] == "p2p.matrix")
        assert matrix["details"]["peer_access"][0][1] is False  # the list of lists that was refused
    for argv in (["inspect", str(path)], ["report", str(path), "--format", "md"], ["import", str(path)]):
        code, out, err = gpuvet(capsys, *argv)
        assert code in (0, 1), f"{argv[0]}: exit {code}: {err}"
    code, out, err = gpuvet(capsys, "show", "1", "--format", "md")
    assert code in (0, 1) and "gpu.sustained" in out and "gpu.gemm" in out and "gpu.pcie_bandwidth" in out, err
    if gpus > 1:
        assert "gpu.p2p" in out
