"""The plan `gpuvet run --plan` shows is the run's own: budgets, order, what runs alongside, and
the two-minute promise for 8 GPUs, held on real captures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuvet import runner
from gpuvet.bench import host_plan, schedule
from gpuvet.bench import plan as bench_plan
from gpuvet.facts import Machine
from gpuvet.probe import capture

from cli_runner import gpuvet

FIXTURES = Path(__file__).parent / "fixtures"
H100_8X = FIXTURES / "smi_text/q-8x-h100-sxm-vm-swpowercap-535.183.01.txt"  # gpu2 runs someone's process


def machine_of(path: Path) -> Machine:
    return capture.merge(capture.read_captures(str(path)))


def default_plan(machine: Machine, **options) -> schedule.Plan:
    return schedule.plan(machine, list(runner.ALL_BENCHMARKS), "cuda", "default",
                         workload_steps=schedule.RUN_WORKLOAD_STEPS, **options)


def with_gpus(machine: Machine, count: int) -> Machine:
    return Machine(gpus=machine.gpus[:count])


def test_the_default_run_on_an_8x_h100_fits_two_minutes():
    planned = default_plan(machine_of(H100_8X), force=True)
    assert planned.gpus == list(range(8))
    assert planned.total_s <= schedule.RUN_TARGET_S
    names = [s.name for s in planned.steps if not s.skipped]
    assert names == ["facts", "cpu", "worker", "gemm", "membw", "pcie", "latency", "sustained", "p2p", "allreduce",
                     "workload"]
    sustained = next(s for s in planned.steps if s.name == "sustained")
    assert sustained.alongside == ["disk", "net"]  # storage and network share the load's time


@pytest.mark.parametrize("count", [1, 2, 4])
def test_fewer_gpus_plan_less_time(count):
    eight = default_plan(machine_of(H100_8X), force=True).total_s
    fewer = default_plan(with_gpus(machine_of(H100_8X), count), force=True)
    assert fewer.total_s < eight
    skipped = {s.name for s in fewer.steps if s.skipped}
    assert skipped == ({"p2p", "allreduce"} if count == 1 else set())


def test_a_gpu_someone_uses_is_not_planned_and_the_plan_says_why():
    planned = default_plan(machine_of(H100_8X))
    assert 2 not in planned.gpus and len(planned.gpus) == 7
    assert any(n.startswith("gpu2:") and "--force" in n for n in planned.notes)


def test_without_pytorch_the_gpu_steps_skip_and_the_host_still_runs():
    planned = default_plan(machine_of(H100_8X), cannot_run="PyTorch is not installed")
    ran = [s.name for s in planned.steps if not s.skipped]
    assert ran == ["facts", "cpu", "disk", "net"]
    assert all(s.skipped == "PyTorch is not installed" for s in planned.steps if s.name in schedule.GPU_BENCHMARKS)


def test_a_soak_plans_its_minutes():
    planned = default_plan(machine_of(H100_8X), force=True, soak_minutes=10)
    sustained = next(s for s in planned.steps if s.name == "sustained")
    assert sustained.budget_s == 600 + schedule.SUSTAINED_SETUP_S


def test_the_run_takes_the_plans_budgets():
    """The worker's deadlines come from the same table the plan prints."""
    runner_ = bench_plan.Runner(Machine(), None, [], bench_plan.Outcome(), print, None,
                                 {"steps": schedule.RUN_WORKLOAD_STEPS}, profile="default")
    runner_.cpu = False
    for name in schedule.GPU_BENCHMARKS:
        assert runner_.budget(name) == schedule.gpu_budget_s(name, "cuda", "default",
                                                             workload_steps=schedule.RUN_WORKLOAD_STEPS)
    assert runner_.budget("gemm") < schedule.BENCH_BUDGET_S["gemm"]  # `gpuvet bench gemm` measures longer


def test_the_run_follows_the_plans_order(monkeypatch, tmp_path):
    """A default run on this machine (no GPU): the host steps in the order the plan lists them."""
    order: list[str] = []
    monkeypatch.setattr(host_plan, "run", lambda names, *a, **k: order.extend(names) or [])

    def gpu_run(machine, names, alongside_sustained=None, **kwargs):
        order.append("gpu")
        if alongside_sustained is not None:  # the load ran: the host work shares its time
            alongside_sustained()
        return bench_plan.Outcome()

    monkeypatch.setattr(bench_plan, "run", gpu_run)
    monkeypatch.chdir(tmp_path)
    runner.run_live(quick=False)
    assert order == ["cpu", "gpu", "disk", "net"]
    planned = runner.plan_live(quick=False)
    host_steps = [s.name for s in planned.steps if s.name in schedule.HOST_BENCHMARKS]
    assert host_steps == ["cpu", "disk", "net"]


def test_inspect_plan_prints_the_forecast_of_a_captured_machine(capsys):
    code, out, err = gpuvet(capsys, "inspect", str(H100_8X), "--plan", "--json")
    assert code == 0, err
    planned = json.loads(out)
    assert planned["total_s"] <= 120 and len(planned["gpus"]) == 7
    code, text, _ = gpuvet(capsys, "inspect", str(H100_8X), "--plan")
    assert code == 0 and "planned total" in text and "meanwhile disk then net" in text and "gpu2:" in text


def test_host_work_runs_while_the_sustained_load_holds(monkeypatch):
    """For real on the CPU build: the host benchmarks' slot opens while the load runs."""
    import time

    from gpuvet.probe import live

    monkeypatch.setitem(schedule.CPU_BUDGET_S, "sustained", 1.5)
    started: list[float] = []
    outcome = bench_plan.run(live.collect(steal_window_s=0.05, import_torch=False), ["sustained"], device="cpu",
                             alongside_sustained=lambda: started.append(time.time()))
    (load,) = [s for s in outcome.series if s["name"] == "sustained.throughput"]
    assert len(started) == 1
    assert load["start"] - 10 < started[0] < load["start"] + load["rows"][-1][0]


def test_the_cpu_feed_server_starts_while_the_facts_are_read(monkeypatch, tmp_path):
    """Its server imports torch (3 s of the 6 s budget on this 2-core VM, leaving 1 s of decoding):
    started before the facts are read, the budget goes to decoding. Only a run with the CPU feed
    starts it."""
    from gpuvet.bench import cpufeed
    from gpuvet.probe import live

    order: list[str] = []
    monkeypatch.setattr(cpufeed, "warm_up", lambda: order.append("cpu server"))
    collect = live.collect
    monkeypatch.setattr(live, "collect", lambda **k: order.append("facts") or collect(**k))
    monkeypatch.setattr(host_plan, "run", lambda names, *a, **k: order.extend(names) or [])
    monkeypatch.chdir(tmp_path)
    runner.run_live(quick=False, benchmarks=["cpu"])
    assert order == ["cpu server", "facts", "cpu"]
    order.clear()
    runner.run_live(quick=False, benchmarks=["net"])
    assert order == ["facts", "net"]
