"""The benchmark worker and plan: jobs run in a child process, deadlines end hung jobs, and every
benchmark ends as figures or as a reason. Runs for real on the CPU build of torch."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest

from gpuvet import occupancy
from gpuvet.bench import plan, schedule
from gpuvet.bench.session import Worker, WorkerError
from gpuvet.facts import Machine, Stack, Torch
from gpuvet.judge.common import Context
from gpuvet.judge.gpu_health import check_isolation
from gpuvet.probe import capture, live

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def worker():
    w = Worker()
    yield w
    w.close()


def test_worker_reports_torch_and_runs_a_cpu_job(worker):
    assert worker.info["ready"] and worker.info["cuda"] is False
    (result,) = worker.run({"module": "sustained", "device": "cpu", "subject": "cpu", "budget_s": 10,
                            "params": {"duration_s": 2.0, "size": 256}}, timeout_s=60)
    assert result["ok"], result
    names = {m["name"] for m in result["measurements"]}
    assert names == {"sustained.tflops", "sustained.decay_pct"}
    (series,) = result["series"]
    assert series["name"] == "sustained.throughput" and len(series["rows"]) >= 2


def test_unknown_benchmark_is_an_error_not_a_crash(worker):
    (result,) = worker.run({"module": "nope", "device": "cpu", "subject": "cpu"}, timeout_s=30)
    assert result == {"ok": False, "error": "unknown benchmark 'nope'"}


def test_a_job_past_its_deadline_kills_the_worker():
    w = Worker()
    try:
        with pytest.raises(WorkerError, match="no answer after"):
            w.run({"module": "sustained", "device": "cpu", "subject": "cpu", "budget_s": 120,
                   "params": {"duration_s": 100.0, "size": 256}}, timeout_s=2)
        assert w.proc.poll() is not None  # nothing left running
    finally:
        w.close()


def this_machine() -> Machine:
    return live.collect(steal_window_s=0.05, import_torch=False)


def test_cpu_plan_measures_what_a_cpu_can_and_explains_the_rest(monkeypatch):
    monkeypatch.setitem(plan.CPU_BUDGET_S, "sustained", 1.5)  # a short load is enough to check the plumbing
    shown = []
    outcome = plan.run(this_machine(), ["sustained", "pcie"], device="cpu", progress=shown.append)
    by_name = {m["name"]: m for m in outcome.measurements}
    assert by_name["sustained.tflops"]["value"] > 0 and by_name["sustained.tflops"]["subject"] == "cpu"
    assert by_name["sustained.tflops"]["details"]["duration_s"] >= 1.5  # the whole duration asked, not less
    assert "sustained load for 2 s" in shown  # the benchmark's own progress reaches the screen
    note = by_name["bench.pcie"]
    assert note["details"]["outcome"] == "skipped" and "needs a CUDA GPU" in note["details"]["reason"]


def test_without_torch_every_benchmark_says_how_to_get_it():
    m = Machine(stack=Stack(torch=Torch(installed=False)))
    outcome = plan.run(m, ["gemm", "membw"], device="cuda")
    assert [n["name"] for n in outcome.measurements] == ["bench.gemm", "bench.membw"]
    # the pip of gpuvet's own environment, by path, and the CPU build on a machine without a GPU
    line = f"`{sys.executable} -m pip install torch --index-url https://download.pytorch.org/whl/cpu`"
    assert all(line in n["details"]["reason"] for n in outcome.measurements)


def test_gpu_benchmarks_without_a_gpu_skip_with_the_driver_reason():
    m = this_machine()
    if m.gpus:
        pytest.skip("this machine has a GPU")
    outcome = plan.run(m, ["gemm"], device="cuda")
    (note,) = outcome.measurements
    assert note["details"]["outcome"] == "skipped" and "no NVIDIA GPU" in note["details"]["reason"]


def test_a_gpu_already_in_use_is_left_alone():
    busy = capture.merge(capture.read_captures(str(FIXTURES / "smi_text/q-h100-80gb-hbm3-vm-590.48.01-load.txt"))).gpus[0]
    idle = capture.merge(capture.read_captures(str(FIXTURES / "smi_text/q-h100-80gb-hbm3-vm-590.48.01-idle.txt"))).gpus[0]
    assert "compute process" in schedule.someone_else_on(busy)
    assert schedule.someone_else_on(idle) is None
    hidden = copy.deepcopy(idle)
    hidden.memory_used_mib = 20000  # edited: memory held by a process nobody lists
    assert "cannot see" in schedule.someone_else_on(hidden)


def machine_from(name: str) -> Machine:
    return capture.merge(capture.read_captures(str(FIXTURES / name)))


def _isolation_and_plan(machine: Machine) -> list[tuple[str, str, bool]]:
    """Per GPU: the judge's gpu.isolation status and summary, and whether `gpuvet run` loads it."""
    findings = {f.subject: f for f in check_isolation(Context(machine))}
    loaded = {gpu.index for gpu in schedule.loaded_gpus(machine)}
    return [(findings[f"gpu{gpu.index}"].status, findings[f"gpu{gpu.index}"].summary, gpu.index in loaded)
            for gpu in machine.gpus]


# Real captures, each named by what is on its GPU; whether run loads it, as the judge reads it.
OCCUPANCY_CAPTURES = {
    "smi_text/q-h100-80gb-hbm3-vm-590.48.01-idle.txt": True,  # idle
    "smi_text/q-h100-80gb-hbm3-vm-590.48.01-load.txt": False,  # a compute process (gpu-burn)
    "smi_text/q-l40s-vm-595.80-idle.txt": True,  # 100% busy, 0 MiB, no process: the driver waking it
    "smi_xml/gtx-1050-laptop-x8-515.65.01-nodoctype.xml": True,  # 7% busy with Xorg: the user's desktop
    "smi_xml/rtx-4000-sff-ada-595.84-v13.xml": True,  # 3.5 GiB of display buffers of a desktop session
    "smi_csv/l40s-vm-595.80-load.csv": False,  # 1.2 GiB used, 9% busy, no process list to say whose
}


@pytest.mark.parametrize("name", OCCUPANCY_CAPTURES)
def test_run_loads_the_gpus_the_judge_finds_nobody_else_on(name):
    """One rule (gpuvet.occupancy): run leaves a GPU alone exactly where gpu.isolation says someone
    else's work is, or may be, on it, and loads every GPU the judge calls idle or the driver's."""
    (status, summary, loaded), *_ = _isolation_and_plan(machine_from(name))
    assert loaded is OCCUPANCY_CAPTURES[name], summary
    someone_else = ("already running" in summary or "another user, container or VM" in summary
                    or "no process list to say whose" in summary)
    assert loaded is not someone_else and (status == "pass" or not loaded or status == "warn"), summary


def test_a_gpu_a_few_percent_busy_with_no_context_is_idle_to_run_and_judge():
    machine = machine_from("smi_text/q-l40s-vm-595.80-idle.txt")
    for util in range(occupancy.WAKING_QUIET_PCT):
        machine.gpus[0].utilization_pct = util  # edited: the capture says 100% (0 MiB used, no process)
        assert _isolation_and_plan(machine)[0][0::2] == ("pass", True), util
    machine.gpus[0].memory_used_mib = 2000  # edited: memory nobody lists, so a context someone else holds
    machine.gpus[0].utilization_pct = 7
    status, summary, loaded = _isolation_and_plan(machine)[0]
    assert status == "fail" and "another user" in summary and not loaded


def test_numa_cpus_come_from_the_topology_affinity_without_sysfs(tmp_path):
    m = capture.merge(capture.read_captures(str(FIXTURES / "topo/asus-esc8000a-4x-rtx6000ada-node-sys-nics-spaces.txt")))
    cpus, source = plan.numa_cpus(m, m.gpus[2], root=str(tmp_path))  # "32-63" on that machine, cut to the CPUs this process may use
    import os

    assert set(cpus) == set(range(32, 64)) & os.sched_getaffinity(0)
    assert source == ("nvidia-smi topo -m" if cpus else "")


def test_numa_cpus_come_from_the_gpus_pci_device_in_sysfs_first(tmp_path):
    """nvbandwidth binds to the GPU's local_cpulist: read for every GPU, not only from a pasted
    `topo -m` (a live run had none, so pinned buffers were never bound)."""
    import os

    from gpuvet.facts import Gpu, Machine, Pcie

    allowed = sorted(os.sched_getaffinity(0))
    device = tmp_path / "0000:17:00.0"
    device.mkdir()
    (device / "local_cpulist").write_text(f"{allowed[0]}-{allowed[-1]}\n")  # the sysfs format
    gpu = Gpu(index=0, pcie=Pcie(bus_id="0000:17:00.0"))
    cpus, source = plan.numa_cpus(Machine(gpus=[gpu]), gpu, root=str(tmp_path))
    assert cpus == allowed and source == "sysfs local_cpulist"


def test_asking_for_more_workload_steps_gives_the_workload_more_time():
    def budget(workload, device_cpu=True):
        runner = plan.Runner(Machine(), None, [], plan.Outcome(), print, None, workload)
        runner.cpu = device_cpu
        return runner.budget("workload")

    default = budget({})
    assert budget({"steps": 10}) == default  # fewer steps than the default never shrink it
    assert budget({"steps": 3 * schedule.WORKLOAD_DEFAULT_STEPS["cpu"]}) == 3 * default
    assert budget({"steps": 2 * schedule.WORKLOAD_DEFAULT_STEPS["cuda"]}, device_cpu=False) == 2 * plan.BUDGET_S["workload"]


def test_sustained_telemetry_is_judged_only_while_the_load_ran():
    """The sampler runs from before the worker's setup to after the slowest GPU: an idle clock and
    the gpu_idle reason read outside the load must not count as the GPU under load."""
    from gpuvet.facts import Gpu
    from gpuvet.telemetry import Sample

    gpu = Gpu(index=0, name="NVIDIA H100 80GB HBM3")
    outcome = plan.Outcome(series=[{"name": "sustained.throughput", "subject": "gpu0", "interval_s": 0.25,
                                    "start": 1000.0, "columns": ["t", "tflops"], "rows": [[0.25, 650.0], [30.0, 648.0]]}])
    runner = plan.Runner(Machine(gpus=[gpu]), None, [plan.Target(gpu, "cuda:0", "gpu0")], outcome, lambda m: None, None, {})
    idle = [Sample(t=995.0 + i * 0.1, sm_mhz=345, reasons=0x1, power_w=70.0) for i in range(50)]  # setup: 5 s idle
    loaded = [Sample(t=1000.0 + i * 0.1, sm_mhz=1755, reasons=0x4, power_w=690.0) for i in range(301)]
    tail = [Sample(t=1030.5 + i * 0.1, sm_mhz=345, reasons=0x1, power_w=80.0) for i in range(20)]  # waiting for others

    class Sampler:
        interval_s = 0.1

        def stop(self):
            return {0: idle + loaded + tail}

        def energy(self):
            return {}  # a GPU without the energy counter (before Volta): the samples' mean stands

    runner.record_telemetry(Sampler(), "sustained")
    (summary,) = [m["details"] for m in outcome.measurements if m["name"] == "sustained.telemetry"]
    assert summary["count"] == 301 and summary["sm_mhz"]["min"] == 1755
    assert "gpu_idle" not in summary["reasons"]
    (series,) = [s for s in outcome.series if s["name"] == "sustained.telemetry"]
    assert series["t0"] == 1000.0 and len(series["rows"]) == 301


def test_each_cuda_device_is_matched_to_its_own_nvml_gpu():
    """Telemetry and the busy check read the NVML GPU behind each cuda:N. Real two-GPU capture."""
    m = capture.merge(capture.read_captures(str(FIXTURES / "smi_xml/dual-rtx-a5000-590.44.01-v13.xml")))
    first, second = m.gpus
    no_env: dict[str, str] = {}
    assert plan.nvml_gpu(m, {"ordinal": 0, "bus_id": second.pcie.bus_id}, no_env) is second  # bus id wins
    # torch without the bus id: its UUID has no "GPU-" prefix
    assert plan.nvml_gpu(m, {"ordinal": 0, "uuid": second.uuid.removeprefix("GPU-")}, no_env) is second
    # neither: by position, in bus order (gpuvet's worker numbers cuda:N so)
    assert plan.nvml_gpu(m, {"ordinal": 1}, no_env) is second
    # CUDA_VISIBLE_DEVICES=1 in bus order: cuda:0 is NVML GPU 1, not GPU 0 (which stays idle)
    assert plan.nvml_gpu(m, {"ordinal": 0}, {"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}) is second
    assert plan.nvml_gpu(m, {"ordinal": 0}, {"CUDA_VISIBLE_DEVICES": second.uuid, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}) is second
    # a list numbered in the default order (fastest first) can't be mapped by position: no guess
    assert plan.nvml_gpu(m, {"ordinal": 0}, {"CUDA_VISIBLE_DEVICES": "1"}) is None
    assert first is not second


def test_the_worker_numbers_gpus_in_bus_order_unless_the_user_chose_gpus_or_an_order():
    assert plan.worker_env({}) == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert plan.worker_env({"CUDA_VISIBLE_DEVICES": "4,5"}) == {}  # their numbers mean the default order
    assert plan.worker_env({"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}) == {}


def test_the_worker_measures_fp32_as_fp32_even_where_the_environment_forces_tf32(monkeypatch):
    import psutil

    monkeypatch.setenv("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "1")  # set by some containers for training speed
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    changes = plan.worker_env()
    assert changes == {"TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": None}
    worker = Worker(env=changes)
    try:
        seen = psutil.Process(worker.proc.pid).environ()
    finally:
        worker.close()
    assert "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE" not in seen and seen.get("CUDA_VISIBLE_DEVICES") == ""


def test_a_ten_hour_soak_samples_once_a_second_so_the_whole_load_stays_in_the_record(monkeypatch):
    from gpuvet.facts import Gpu

    made = []

    class Sampler:
        def __init__(self, indices, interval_s, max_samples):
            made.append((interval_s, max_samples))

        def start(self):
            pass

    monkeypatch.setattr(plan.telemetry, "Sampler", Sampler)
    gpu = Gpu(index=0)
    for minutes in (None, 600):
        runner = plan.Runner(Machine(gpus=[gpu]), None, [plan.Target(gpu, "cuda:0", "gpu0")], plan.Outcome(),
                              lambda m: None, minutes, {})
        runner.start_sampler(load_s=runner.sustained_duration())
    (default_interval, kept), (soak_interval, soak_kept) = made
    assert default_interval == 0.1  # the 30 s load: 10 Hz
    assert soak_interval >= 1.0 and soak_kept * soak_interval >= 600 * 60  # every second of 10 hours kept


def test_in_an_exclusive_compute_mode_fresh_process_benchmarks_get_a_worker_that_holds_no_gpu(monkeypatch):
    """One context per GPU: after gemm the worker holds it, so context start-up and the all-reduce ranks
    would be refused. The plan restarts the worker first; the workload, whose own training holds the
    GPU, is told to skip its resume with the reason."""
    from gpuvet.facts import Gpu

    started, sent = [], []

    class FakeWorker:
        def __init__(self, env=None):
            started.append(self)
            self.info = {"devices": []}

        def run(self, job, timeout_s, on_progress=None):
            sent.append((started.index(self), job["parallel"][0]))
            return [{"ok": True, "measurements": [], "series": []} for _ in job["parallel"]]

        def close(self, interrupted=False):
            pass

    monkeypatch.setattr(plan, "Worker", FakeWorker)
    gpus = [Gpu(index=0, compute_mode="Exclusive_Process"), Gpu(index=1, compute_mode="Exclusive_Process")]
    targets = [plan.Target(g, f"cuda:{g.index}", f"gpu{g.index}") for g in gpus]
    runner = plan.Runner(Machine(gpus=gpus), FakeWorker(), targets, plan.Outcome(), lambda m: None, None, {})
    for name in ("gemm", "latency", "membw", "workload"):
        runner.run(name)
    assert [(worker, job["module"]) for worker, job in sent] == [(0, "gemm"), (1, "latency"), (1, "membw"), (1, "workload")]
    assert sent[-1][1]["params"]["exclusive_mode"] == "Exclusive_Process"

    default = [Gpu(index=0, compute_mode="Default")]
    started.clear(), sent.clear()
    runner = plan.Runner(Machine(gpus=default), FakeWorker(), [plan.Target(default[0], "cuda:0", "gpu0")], plan.Outcome(),
                          lambda m: None, None, {})
    runner.run("gemm"), runner.run("latency")
    assert [worker for worker, _ in sent] == [0, 0]  # the default mode keeps one worker for the whole run


def test_a_gpu_in_prohibited_compute_mode_is_not_loaded_and_says_why():
    from gpuvet.facts import Gpu

    class Info:
        info = {"devices": [{"ordinal": 0, "bus_id": None}]}

    outcome = plan.Outcome()
    m = Machine(gpus=[Gpu(index=0, compute_mode="Prohibited")])
    assert plan.bench_targets(m, Info(), "cuda", False, outcome, ["gemm"]) == []
    (note,) = outcome.measurements
    assert note["subject"] == "gpu0" and note["details"]["reason"] == "compute mode Prohibited: no process may run CUDA on this GPU"


def test_the_link_under_load_is_the_one_held_while_the_pinned_copies_ran():
    """A link that trains to Gen5 x16 and drops to Gen3 x8 during the copies must show the drop; the
    setup before the copies (context, buffers) reads other values and is left out."""
    from gpuvet.facts import Gpu
    from gpuvet.telemetry import Sample

    def judged(samples, window):
        gpu = Gpu(index=0)
        gpu.pcie.readings = []
        plan.add_loaded_link(gpu, samples, window)
        (loaded,) = gpu.pcie.readings
        assert loaded.under_load and loaded.source == "nvml"
        return loaded.current_gen, loaded.current_width

    setup = [Sample(t=100.0 + i * 0.1, pcie_gen=5, pcie_width=16) for i in range(5)]
    copies = [Sample(t=101.0 + i * 0.1, pcie_gen=3 if i > 1 else 5, pcie_width=8 if i > 1 else 16) for i in range(10)]
    assert judged(setup + copies, (101.0, 102.0)) == (3, 8)
    # without a window (no pinned copies), the fastest reading: idle moments read a power-saving downshift
    assert judged([Sample(t=1.0, pcie_gen=1, pcie_width=16), Sample(t=1.1, pcie_gen=4, pcie_width=16)], None) == (4, 16)

    runner = plan.Runner(Machine(), None, [], plan.Outcome(measurements=[
        {"name": "pcie.h2d_pinned", "subject": "gpu0", "value": 50.0, "unit": "GB/s",
         "details": {"load_window": [101.0, 102.0]}}]), lambda m: None, None, {})
    assert runner.load_window("gpu0") == (100.999, 102.001) and runner.load_window("gpu1") is None


def test_the_cold_context_start_is_measured_before_any_gpuvet_process_holds_the_gpu(monkeypatch):
    """The worker holds a context on every GPU while latency runs, so its children never see the
    first process's start (persistence off, vGPU): the parent, which never creates a context,
    measures one child first, in the worker's environment (GPUs in PCI bus order)."""
    from gpuvet.bench import context_child

    seen = {}

    def child(ordinal, env=None, python=None):
        seen.update(ordinal=ordinal, order=(env or {}).get("CUDA_DEVICE_ORDER"))
        return context_child.InitTiming(cuinit_ms=900.0, context_ms=1150.0, load_ms=2.0)

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    monkeypatch.setattr(context_child, "run_child", child)
    m = plan.cold_context_start()
    assert m["name"] == "latency.context_cold" and m["value"] == 1150.0 and m["subject"] == "gpu0"
    assert m["details"]["before_any_gpuvet_process"] is True
    assert seen == {"ordinal": 0, "order": "PCI_BUS_ID"}


def test_without_a_driver_the_cold_start_says_why():
    m = plan.cold_context_start()  # no libcuda on this machine: the stdlib child says so
    assert m["value"] is None and ("skipped" in m["details"] or "error" in m["details"])


def test_the_sustained_loads_mean_power_comes_from_the_energy_counter():
    from gpuvet.samples import Sample

    samples = [Sample(t=100.0 + i, power_w=400.0, power_limit_w=700.0) for i in range(11)]  # a lagging 1 s average
    energy = [(100.0 + i, 1_000_000 + 650_000 * i) for i in range(11)]  # 650 W really drawn
    assert plan.energy_mean(energy, samples) == {"energy_mean_w": 650.0, "energy_mean_pct_of_limit": 92.86}
    assert plan.energy_mean([], samples) == {}
