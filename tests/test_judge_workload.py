"""workload.* rules: the reference training run judged.

The GPU machine is a real capture (an H100 80GB HBM3 VM: bf16 dense peak 989 TFLOPS in the
reference data); the measurements are synthetic figures written here, shaped like the ones
bench/workload.py records and chosen around the thresholds.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuvet.facts import Host, Machine, Storage
from gpuvet.judge import workload as rules
from gpuvet.judge.common import Context
from gpuvet.probe import capture
from gpuvet.record import Measurement

FIXTURES = Path(__file__).parent / "fixtures"
H100 = "smi_text/q-h100-80gb-hbm3-vm-590.48.01-idle.txt"
H100_PEAK = 989.0
DEFAULT_SHAPE = {"d_model": 768, "layers": 12, "heads": 12, "seq_len": 1024, "batch": 16, "vocab": 8192}


def h100() -> Machine:
    return capture.merge(capture.read_captures(str(FIXTURES / H100)))


def judged(machine: Machine, measurements: list[Measurement], device: str = "cuda", benchmarks=("workload",)):
    ctx = Context(machine, measurements, {"benchmarks": list(benchmarks), "device": device})
    return {f.check: f for f in rules.check_workload(ctx)}


def synthetic_throughput(subject="gpu0", model_tflops=300.0, default_shape=True, median_ms=40.0, p90_ms=42.0,
                         dtype="bfloat16", with_mfu=True):
    """Synthetic throughput figures: tokens/s from the model TFLOPS and the default model's FLOPs per token."""
    per_token = 620_000_000
    tps = model_tflops * 1e12 / per_token
    common = {"dtype": dtype, "shape": DEFAULT_SHAPE, "default_shape": default_shape, "timed_steps": 140, "warmup_steps": 10}
    found = [Measurement("workload.tokens_per_s", tps, "tokens/s", subject,
                         {**common, "model_tflops": model_tflops, "model_flops_per_token": per_token,
                          "loss_first": 9.1, "loss_last": 3.2}),
             Measurement("workload.step_time_ms", median_ms, "ms", subject, {**common, "p10": median_ms * 0.98, "p90": p90_ms})]
    if with_mfu:
        found.append(Measurement("workload.mfu", 100 * model_tflops / H100_PEAK, "%", subject,
                                 {**common, "peak_tflops": H100_PEAK, "model_tflops": model_tflops}))
    return found


def synthetic_checkpoint(subject="gpu0", write_mbs=1500.0, read_mbs=2500.0, size=1_100_000_000, path="/data/ckpt",
                         path_given=True, resume_ok=1.0):
    where = {"path": path, "path_given": path_given}
    return [
        Measurement("workload.checkpoint_write", write_mbs, "MB/s", subject,
                    {"ok": True, "bytes": size, "seconds": size / write_mbs / 1e6, "cache_dropped": True, **where}),
        Measurement("workload.checkpoint_read", read_mbs, "MB/s", subject,
                    {"ok": True, "bytes": size, "seconds": size / read_mbs / 1e6, "checksum_match": True, **where}),
        Measurement("workload.resume_ok", resume_ok, "bool", subject,
                    {"from_step": 150, "steps": 4, "losses_uninterrupted": [3.2, 3.19, 3.18, 3.18],
                     "losses_resumed": [3.2, 3.19, 3.18, 3.18] if resume_ok else [3.2, 3.25, 3.3, 3.31],
                     "max_rel_diff": 0.0 if resume_ok else 0.04, "update_rel_diff": 1e-5 if resume_ok else 0.9,
                     "rtol": {"loss": 2e-3, "update": 2e-2},
                     **({} if resume_ok else {"reason": "training did not continue from the same state: the weight update differs by 9.00e-01"})}),
    ]


def failed_write(subject="cpu", path="/readonly"):
    why = "not tried: the checkpoint could not be written"
    return [Measurement("workload.checkpoint_write", None, "MB/s", subject,
                        {"ok": False, "stage": "write", "errno": "EROFS", "path": path, "path_given": True,
                         "reason": f"{path} is on a read-only file system: OSError: [Errno 30] Read-only file system"}),
            Measurement("workload.checkpoint_read", None, "MB/s", subject, {"ok": False, "reason": why, "path": path}),
            Measurement("workload.resume_ok", None, "bool", subject, {"reason": why})]


# ---------------------------------------------------------------- workload.throughput


@pytest.mark.parametrize("model_tflops, status", [(300.0, "pass"), (160.0, "pass"), (120.0, "warn")])
def test_mfu_is_judged_loosely_against_the_dense_peak(model_tflops, status):
    f = judged(h100(), synthetic_throughput(model_tflops=model_tflops))["workload.throughput"]
    assert f.subject == "gpu0" and f.status == status
    assert f"MFU {100 * model_tflops / H100_PEAK:.1f}% of the 989 TFLOPS dense peak" in f.summary
    assert "eager" in f.evidence.source and "15%" in f.evidence.expected


def test_mfu_comes_from_the_reference_when_the_benchmark_had_no_peak():
    f = judged(h100(), synthetic_throughput(model_tflops=100.0, with_mfu=False))["workload.throughput"]
    assert f.status == "warn" and "MFU 10.1%" in f.summary
    assert "bf16_tensor_tflops_dense" in f.evidence.source


def test_well_below_the_gemm_rate_of_the_same_gpu_warns():
    gemm = Measurement("gemm.bf16", 760.0, "TFLOPS", "gpu0", {"shape": [8192, 8192, 8192]})
    healthy = judged(h100(), synthetic_throughput(model_tflops=300.0) + [gemm])["workload.throughput"]
    assert healthy.status == "pass" and "39% of the 760 TFLOPS this GPU reached in GEMMs" in healthy.summary
    starved = judged(h100(), synthetic_throughput(model_tflops=170.0) + [gemm])["workload.throughput"]
    assert starved.status == "warn" and "22% of the 760" in starved.summary  # MFU 17% alone would pass
    assert "nvidia-smi dmon" in starved.remedy


def test_slow_steps_warn_even_at_a_good_average():
    f = judged(h100(), synthetic_throughput(median_ms=40.0, p90_ms=80.0))["workload.throughput"]
    assert f.status == "warn" and "p90 is 2.0x the median" in f.summary


def test_a_custom_model_shape_is_reported_not_judged():
    f = judged(h100(), synthetic_throughput(model_tflops=20.0, default_shape=False))["workload.throughput"]
    assert f.status == "measured" and "custom model shape" in f.summary


def test_a_run_without_a_warm_up_step_is_reported_not_judged():
    found = synthetic_throughput(model_tflops=40.0)  # `--steps 2`: the first step's start-up in the average
    for m in found:
        m.details.update(warmup_steps=0, timed_steps=2)
    f = judged(h100(), found)["workload.throughput"]
    assert f.status == "measured" and "the first step, with CUDA's start-up, is timed; not judged" in f.summary


def test_on_the_cpu_figures_are_measured_not_judged():
    f = judged(Machine(), synthetic_throughput(subject="cpu", with_mfu=False, dtype="float32"), device="cpu")["workload.throughput"]
    assert f.subject == "cpu" and f.status == "measured" and "no reference" in f.summary and "MFU" not in f.summary


# ---------------------------------------------------------------- workload.checkpoint


def test_a_fast_checkpoint_path_passes_and_says_what_a_big_checkpoint_costs():
    f = judged(h100(), synthetic_checkpoint())["workload.checkpoint"]
    assert f.status == "pass" and "write 1500 MB/s" in f.summary and "read 2500 MB/s" in f.summary
    assert "12 GB (a 1B-parameter model with AdamW state) would take ~8 s" in f.summary


def test_a_slow_checkpoint_path_warns():
    f = judged(h100(), synthetic_checkpoint(write_mbs=60.0))["workload.checkpoint"]
    assert f.status == "warn" and "~200 s" in f.summary and "--path" in f.remedy


def test_a_small_checkpoint_is_not_judged_on_speed():
    f = judged(h100(), synthetic_checkpoint(write_mbs=20.0, size=5_000_000))["workload.checkpoint"]
    assert f.status == "measured" and "too small a checkpoint" in f.summary


@pytest.mark.parametrize("gpu", [True, False])
def test_a_path_that_cannot_be_written_fails_with_the_reason(gpu):
    machine, subject = (h100(), "gpu0") if gpu else (Machine(), "cpu")
    found = judged(machine, failed_write(subject), device="cuda" if gpu else "cpu")
    f = found["workload.checkpoint"]
    assert f.subject == subject and f.status == "fail"
    assert "read-only file system" in f.summary and "persistent, writable path" in f.remedy
    assert found["workload.resume"].status == "skip" and "could not be written" in found["workload.resume"].summary


def test_a_checkpoint_read_back_wrong_fails():
    found = synthetic_checkpoint()
    found[1].details["checksum_match"] = False
    f = judged(h100(), found)["workload.checkpoint"]
    assert f.status == "fail" and "storage corrupts data" in f.summary


def test_a_checkpoint_that_could_not_be_read_back_fails():
    found = synthetic_checkpoint()
    found[1] = Measurement("workload.checkpoint_read", None, "MB/s", "gpu0",
                           {"ok": False, "stage": "read", "path": "/data/ckpt",
                            "reason": "the fresh process could not read the checkpoint: /data/ckpt does not exist (or vanished)"})
    f = judged(h100(), found)["workload.checkpoint"]
    assert f.status == "fail" and "vanished" in f.summary


@pytest.mark.parametrize("kind, ephemeral, words", [("overlay", None, "writable layer"), ("tmpfs", None, "tmpfs"),
                                                     ("nvme", True, "ephemeral instance storage")])
def test_a_checkpoint_in_a_working_directory_that_will_vanish_warns(kind, ephemeral, words):
    machine = h100()
    machine.host = Host(workdir=Storage(path="/workspace", fs_type=kind, kind=kind, ephemeral=ephemeral))
    default_path = judged(machine, synthetic_checkpoint(path="/workspace", path_given=False))["workload.checkpoint"]
    assert default_path.status == "warn" and words in default_path.summary
    elsewhere = judged(machine, synthetic_checkpoint(path="/mnt/persistent"))["workload.checkpoint"]
    assert elsewhere.status == "pass"


# ---------------------------------------------------------------- workload.resume


def test_resume_from_the_same_state_passes():
    f = judged(h100(), synthetic_checkpoint())["workload.resume"]
    assert f.status == "pass" and "fresh process" in f.summary and "4 steps compared" in f.summary


def test_resume_from_another_state_fails():
    f = judged(h100(), synthetic_checkpoint(resume_ok=0.0))["workload.resume"]
    assert f.status == "fail" and f.summary.startswith("training did not continue from the same state")
    assert f.summary.count("did not continue") == 1  # the reason's own opening is not repeated
    assert "3.25" in f.evidence.measured and "optimizer, step, RNG states and data position" in f.remedy


def with_noise(found, noise_update, failed_in=None, **changes):
    """The resume measurement as bench/workload.py writes it once the run-to-run noise was measured."""
    resume = found[2]
    resume.details.update({"noise": {"loss": 1e-6, "update": noise_update, "losses": [3.2, 3.19, 3.18, 3.18]},
                           "rtol": {"loss": 2e-3, "update": max(5e-3, 5 * noise_update)},
                           "rtol_floor": {"loss": 2e-3, "update": 5e-3}, "rtol_max": {"loss": 1e-2, "update": 2e-2},
                           "noise_factor": 5.0, **changes})
    if failed_in:
        resume.details["failed_in"] = failed_in
    return found


def test_a_passing_resume_shows_the_noise_it_was_judged_against():
    f = judged(h100(), with_noise(synthetic_checkpoint(), 2e-4))["workload.resume"]
    assert f.status == "pass"
    assert "restored again in the training process: update differs by 2.00e-04" in f.evidence.measured
    assert "5x the run-to-run noise, at least" in f.evidence.expected


def test_a_resume_that_drifts_in_the_training_process_too_points_at_the_state_not_the_storage():
    found = with_noise(synthetic_checkpoint(resume_ok=0.0), 0.6, failed_in=["fresh process", "this process"])
    f = judged(h100(), found)["workload.resume"]
    assert f.status == "fail" and "restored in this process from the same bytes drifted too" in f.remedy
    assert "--path /tmp" not in f.remedy  # the storage is not the suspect: the bytes were the same
    only_fresh = judged(h100(), with_noise(synthetic_checkpoint(resume_ok=0.0), 1e-4, failed_in=["fresh process"]))
    assert "--path /tmp" in only_fresh["workload.resume"].remedy


def test_a_resume_with_nan_is_reported_without_a_crash():
    found = synthetic_checkpoint(resume_ok=0.0)
    found[2].details.update({"max_rel_diff": None, "update_rel_diff": None,
                             "reason": "training did not continue from the same state: losses or weights are not finite"})
    f = judged(h100(), found)["workload.resume"]
    assert f.status == "fail" and "weight update differs by n/a" in f.evidence.measured


def test_a_fresh_process_on_another_gpu_is_not_verified_and_says_which():
    found = synthetic_checkpoint()
    found[2] = Measurement("workload.resume_ok", None, "bool", "gpu0",
                           {"stage": "device", "reason": "not verified: the fresh process computed on cuda:0 "
                                                         "(NVIDIA H100 80GB HBM3, GPU-bbbb), not on the training GPU"})
    f = judged(h100(), found)["workload.resume"]
    assert f.status == "skip" and "GPU-bbbb" in f.summary and "see workload.checkpoint" not in f.summary


def test_a_nan_training_loss_fails_the_throughput():
    found = synthetic_throughput()
    for m in found:
        m.details["nonfinite_losses"] = 3
    f = judged(h100(), found)["workload.throughput"]
    assert f.status == "fail" and "NaN or inf at 3 of 150 steps" in f.summary and "gpu.correctness" in f.remedy


# ---------------------------------------------------------------- when it did not run


def test_nothing_is_said_unless_the_workload_was_planned():
    assert judged(h100(), synthetic_checkpoint(), benchmarks=("gemm",)) == {}


def test_a_workload_that_did_not_run_says_why():
    note = Measurement("bench.workload", None, "", "gpu0",
                       {"outcome": "skipped", "reason": "1 compute process(es) already on NVIDIA H100 80GB HBM3"})
    found = judged(h100(), [note])
    assert set(found) == {"workload.throughput", "workload.checkpoint", "workload.resume"}
    assert {f.status for f in found.values()} == {"skip"} and "compute process" in found["workload.throughput"].summary
