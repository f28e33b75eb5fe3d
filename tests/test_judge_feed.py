"""host.cpu_feed on real GPU facts (nvidia-smi captures) with synthetic feed and GEMM figures.

Every figure made up for a test is named SYNTHETIC_*; the GPU facts are real captures."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuvet.facts import Gpu, Machine
from gpuvet.judge import feed
from gpuvet.judge.common import Context
from gpuvet.probe import capture
from gpuvet.record import Measurement

FIXTURES = Path(__file__).parent / "fixtures"
RTX4090_X8 = FIXTURES / "smi_text/q-8x-rtx4090-all-idle-535.154.05.txt"
H200_MIG = FIXTURES / "smi_text/q-h200-mig-vm-590.48.01-idle.txt"

# What the rule must compute for an RTX 4090 from its reference figure (165.2 TFLOPS bf16 dense).
RTX4090_IMAGES_PER_S = 165.2e12 * feed.SHARE_OF_PEAK / (feed.TRAIN_GFLOP_PER_IMAGE * 1e9)


def machine_from(path: Path, gpus: int | None = None) -> Machine:
    machine = capture.merge(capture.read_captures(str(path)))
    if gpus is not None:
        machine.gpus = machine.gpus[:gpus]
    return machine


def synthetic_feed(rate: float, cpu_share: float = 0.99, workers: int = 16) -> Measurement:
    return Measurement("cpu.feed_rate", rate, "samples/s", "cpu", details={
        "workers": workers, "per_worker": [rate / workers] * workers, "cpu_share": cpu_share,
        "image": {"width": 500, "height": 375, "jpeg_bytes_mean": 102_000},
        "libraries": {"tensor": "torch 2.3.0"}})


def synthetic_gemm(gpu: str, tflops: float, dtype: str = "bf16") -> Measurement:
    return Measurement(f"gemm.{dtype}", tflops, "TFLOPS", gpu, details={"shape": [8192, 8192, 8192]})


def judge(machine: Machine, *measurements: Measurement, benchmarks=("cpu",)):
    return feed.check_cpu_feed(Context(machine, list(measurements), {"benchmarks": list(benchmarks)}))


def test_the_reference_model_is_resnet50_training_at_about_25_gflop_per_image():
    assert feed.TRAIN_GFLOP_PER_IMAGE == pytest.approx(24.6)
    # Calibration check: an A100 (312 TFLOPS dense bf16) lands near NVIDIA's published 2470 img/s.
    a100 = 312e12 * feed.SHARE_OF_PEAK / (feed.TRAIN_GFLOP_PER_IMAGE * 1e9)
    assert 2470 * 0.8 < a100 < 2470 * 1.2


def test_eight_4090s_fed_by_a_weak_cpu_are_input_bound():
    SYNTHETIC_FEED = 900.0
    (f,) = judge(machine_from(RTX4090_X8), synthetic_feed(SYNTHETIC_FEED))
    need = 8 * RTX4090_IMAGES_PER_S
    assert f.check == "host.cpu_feed" and f.subject == "host"
    assert f.status == "fail"  # 900 / ~11,400: the GPUs idle most of the time
    assert f.summary.startswith("input-bound: the CPU prepares 900 images/s, the 8 GPUs can train on")
    assert "gpu0, gpu1, gpu2, gpu3, gpu4, gpu5, gpu6, gpu7 ~1,427 images/s each from" in f.evidence.measured
    assert f"~{need:,.0f} images/s" in f.summary
    assert "DALI" in f.summary and "DALI" in f.remedy and "num_workers" in f.remedy
    assert "RTX-4090 bf16 dense peak 165.2 TFLOPS (not measured)" in f.evidence.measured
    assert "ResNet-50" in f.evidence.source and "DeepLearningExamples" in f.evidence.source
    assert f.evidence.expected.startswith(f">= ~{need:,.0f} images/s")


def test_one_4090_and_a_cpu_at_two_thirds_of_its_need_warns_like_the_seeds_8_core_box():
    SYNTHETIC_FEED = 0.66 * RTX4090_IMAGES_PER_S
    (f,) = judge(machine_from(RTX4090_X8, gpus=1), synthetic_feed(SYNTHETIC_FEED))
    assert f.status == "warn" and "input-bound" in f.summary and "would wait 34% of the time" in f.summary


def test_a_cpu_faster_than_the_gpus_passes_with_its_headroom():
    SYNTHETIC_FEED = 2.5 * RTX4090_IMAGES_PER_S
    (f,) = judge(machine_from(RTX4090_X8, gpus=1), synthetic_feed(SYNTHETIC_FEED))
    assert f.status == "pass" and "2.5x" in f.summary and f.remedy is None


def test_measured_gemm_rates_replace_the_reference_peak():
    machine = machine_from(RTX4090_X8, gpus=2)
    SYNTHETIC_GEMM_TFLOPS = 100.0  # a slow pair: demand must follow the measurement, not the spec
    measurements = [synthetic_gemm("gpu0", SYNTHETIC_GEMM_TFLOPS), synthetic_gemm("gpu1", SYNTHETIC_GEMM_TFLOPS, "fp16")]
    per_gpu = SYNTHETIC_GEMM_TFLOPS * 1e12 * feed.SHARE_OF_MEASURED_GEMM / (feed.TRAIN_GFLOP_PER_IMAGE * 1e9)
    SYNTHETIC_FEED = 1.5 * per_gpu  # enough for one GPU, not for two
    (f,) = judge(machine, synthetic_feed(SYNTHETIC_FEED), *measurements)
    assert f.status == "warn"
    assert f"~{2 * per_gpu:,.0f} images/s" in f.summary
    assert "gpu0 ~" in f.evidence.measured and "from measured bf16 GEMM 100.0 TFLOPS" in f.evidence.measured
    assert "measured fp16 GEMM 100.0 TFLOPS" in f.evidence.measured


def test_bf16_is_preferred_over_fp32_when_both_were_measured():
    machine = machine_from(RTX4090_X8, gpus=1)
    (f,) = judge(machine, synthetic_feed(100.0), synthetic_gemm("gpu0", 80.0, "fp32"), synthetic_gemm("gpu0", 160.0, "bf16"))
    assert "measured bf16 GEMM 160.0 TFLOPS" in f.evidence.measured


def test_without_gpus_the_cpu_figure_is_measured_not_judged():
    (f,) = judge(Machine(), synthetic_feed(1234.0))
    assert f.status == "measured" and "1,234 images/s" in f.summary and "no GPU" in f.summary


def test_unknown_gpus_without_a_gemm_figure_skip_with_the_cpu_figure():
    machine = Machine(gpus=[Gpu(index=0, name="Mystery Accelerator 9000")])
    (f,) = judge(machine, synthetic_feed(500.0))
    assert f.status == "skip" and "500 images/s" in f.summary and "Mystery Accelerator 9000" in f.summary


def test_gpus_without_a_figure_are_named_as_not_counted():
    machine = machine_from(RTX4090_X8, gpus=1)
    machine.gpus.append(Gpu(index=1, name="Mystery Accelerator 9000"))
    (f,) = judge(machine, synthetic_feed(10_000.0))
    assert "the GPU with a figure (of 2; the others are not counted)" in f.summary


def test_mig_instances_count_for_their_share_of_the_gpu():
    machine = machine_from(H200_MIG)
    gpu = machine.gpus[0]
    assert gpu.mig_enabled and sum(d.sm_count for d in gpu.mig_devices) == 112  # of the H200's 132
    (f,) = judge(machine, synthetic_feed(100.0))
    whole = 989e12 * feed.SHARE_OF_PEAK / (feed.TRAIN_GFLOP_PER_IMAGE * 1e9)
    assert f"~{whole * 112 / 132:,.0f} images/s" in f.summary
    assert "MIG instances hold 112 of 132 SMs" in f.evidence.measured


def test_contended_workers_are_called_out_with_what_they_would_do_alone():
    SYNTHETIC_CONTENDED = synthetic_feed(100.0, cpu_share=0.33)
    SYNTHETIC_CONTENDED.details["uncontended_rate"] = 303.0
    (f,) = judge(machine_from(RTX4090_X8, gpus=1), SYNTHETIC_CONTENDED)
    assert "the workers got only 33% of their cores' time" in f.summary and "~303 images/s" in f.summary
    (f,) = judge(machine_from(RTX4090_X8, gpus=1), synthetic_feed(100.0, cpu_share=0.95))
    assert "cores' time" not in f.summary


def test_only_when_the_cpu_benchmark_was_planned():
    assert judge(machine_from(RTX4090_X8), synthetic_feed(900.0), benchmarks=("gemm",)) == []


def test_a_failed_benchmark_is_a_skip_with_its_reason():
    note = Measurement("bench.cpu", None, "", "cpu", details={"outcome": "failed", "reason": "worker 1 died (exit code 3)"})
    (f,) = judge(machine_from(RTX4090_X8), note)
    assert f.status == "skip" and "worker 1 died (exit code 3)" in f.summary and "gpuvet bench cpu" in f.remedy


def test_nothing_measured_and_no_note_is_a_plain_skip():
    (f,) = judge(machine_from(RTX4090_X8))
    assert f.status == "skip" and f.summary == "the CPU feed rate was not measured"
