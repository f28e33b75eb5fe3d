"""gpuvet doctor: every symptom of the seeds, found from its words, answered with and without a record."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from rich.console import Console

from gpuvet import judge, runner
from gpuvet.doctor import CONFIRMED, RULED_OUT, SYMPTOMS, UNKNOWN, diagnose, find_symptom, render_doctor
from gpuvet.facts import Audit, Listener, Stack, Torch
from gpuvet.record import Finding, Measurement, RunRecord

RECORDS = Path(__file__).parent / "fixtures" / "records"

# Every row of seed 1's table 5.1 and the cases of seed 2, by short name.
SEED_CASES = ["slow-from-start", "slower-and-slower", "gpu-low-cpu-high", "multi-gpu-scaling", "container-no-gpu",
              "data-lost-after-restart", "day-night", "cuda-init-slow", "no-kernel-image", "nccl-hang", "busy-but-slow",
              "gpu-errors", "ssh-drops", "jupyter-slow", "memory-mismatch"]


def record(name: str) -> RunRecord:
    return RunRecord.from_dict(json.loads((RECORDS / f"{name}.json").read_text()))


def symptom(name: str):
    found = find_symptom(name)
    assert found is not None and found.name == name
    return found


def results(name: str, r: RunRecord | None) -> dict:
    return {result.cause.name: result for result in diagnose(symptom(name), r).results}


def one(found: dict, words: str):
    (match,) = [result for cause, result in found.items() if words in cause]
    return match


def test_the_seed_cases_are_all_there():
    assert [s.name for s in SYMPTOMS] == SEED_CASES
    assert all(s.causes and s.description and s.seed for s in SYMPTOMS)


@pytest.mark.parametrize("s", SYMPTOMS, ids=lambda s: s.name)
def test_a_symptom_is_found_by_name_description_and_the_seed_words(s):
    assert find_symptom(s.name) is s and find_symptom(s.name.replace("-", " ").upper()) is s
    assert find_symptom(s.description) is s
    assert find_symptom(s.seed) is s


@pytest.mark.parametrize(("words", "name"), [
    ("my training gets slower over time", "slower-and-slower"),
    ("越来越慢", "slower-and-slower"),
    ('docker: Error response from daemon: could not select device driver "" with capabilities: [[gpu]]', "container-no-gpu"),
    ("RuntimeError: CUDA error: no kernel image is available for execution on the device", "no-kernel-image"),
    ("NCCL version mismatch", "nccl-hang"),
    ("model.to('cuda') hangs for 30 seconds", "cuda-init-slow"),
    ("GPU utilization low but CPU high", "gpu-low-cpu-high"),
    ("low gpu util", "gpu-low-cpu-high"),
    ("fast at night, slow by day", "day-night"),
    ("加速比", "multi-gpu-scaling"),
    ("checkpoint lost after reboot", "data-lost-after-restart"),
    ("torch memory_allocated disagrees with nvidia-smi", "memory-mismatch"),
])
def test_a_symptom_is_found_from_what_people_type(words, name):
    assert find_symptom(words).name == name


def test_nonsense_finds_nothing():
    assert find_symptom("") is None and find_symptom("xyzzy plugh") is None


@pytest.mark.parametrize("s", SYMPTOMS, ids=lambda s: s.name)
def test_without_a_record_every_cause_is_open_and_says_how_to_check_it(s):
    d = diagnose(s)
    assert d.record is None and [r.cause for r in d.results] == list(s.causes)
    for result in d.results:
        assert result.state == UNKNOWN and result.figures == [] and result.next_step


def with_latency(ms: float) -> RunRecord:
    """Synthetic: a CUDA context time measured on the real H100 bundle capture, judged by the rules."""
    r = record("h100-bundle-nvlink")
    r.options = {"benchmarks": ["latency"]}
    r.measurements = [Measurement("latency.context_init", ms, "ms", "gpu0", {"runs": [ms] * 10})]
    r.findings = judge.judge(r.machine, r.measurements, r.options)
    return r


def without_kernels() -> RunRecord:
    """Synthetic: the real H100 capture with a PyTorch built only up to sm_80."""
    r = record("h100-bundle-nvlink")
    r.machine.gpus[0].compute_capability = "9.0"
    r.machine.stack = Stack(python="3.11", torch=Torch(installed=True, version="2.1.0+cu118", cuda="11.8", cuda_available=True,
                                                        device_count=1, arch_list=["sm_50", "sm_60", "sm_70", "sm_80"]))
    r.findings = judge.judge(r.machine, r.measurements, r.options)
    return r


def on_a_volume() -> RunRecord:
    """Synthetic: the real cpu-quick record with its working directory on a network block volume."""
    r = record("cpu-quick")
    r.machine.host.workdir.kind, r.machine.host.workdir.model = "nvme", "Amazon Elastic Block Store"
    r.findings = judge.judge(r.machine, r.measurements, r.options)
    return r


def preemptible_cpu_run() -> RunRecord:
    r = record("cpu-quick")
    r.options["preemptible"] = True
    return rejudged(r)


def ssh_without_keepalive() -> RunRecord:
    """Synthetic: the real cpu-quick record with an sshd listening and no ClientAliveInterval."""
    r = record("cpu-quick")
    r.machine.audit = Audit(sshd={"ClientAliveInterval": "0"},
                            listeners=[Listener("0.0.0.0", 22, pid=300, process="sshd", all_interfaces=True, kind="ssh", protected=True)])
    return rejudged(r)


def rejudged(r: RunRecord) -> RunRecord:
    """What `gpuvet doctor` answers from: the record's facts judged by today's rules."""
    r.findings = judge.judge(r.machine, r.measurements, r.options)
    return r


# (symptom, record, words in the cause, state, words in a figure): every symptom answered from a record.
ANSWERS = [
    ("slow-from-start", lambda: record("gtx1070-6x-x1-riser"), "PCIe link", CONFIRMED, "x1 of x16 lanes"),
    ("slow-from-start", lambda: record("gtx1070-6x-x1-riser"), "Power limit", RULED_OUT, "180 W, at the 180 W default"),
    ("slow-from-start", lambda: record("h100-8x-throttle"), "heat or a power brake", CONFIRMED, "gpu2: clocks cut: HW power brake"),
    ("slower-and-slower", lambda: record("h100-8x-synthetic-sustained"), "heat or a power brake", CONFIRMED, "throughput fell 40%"),
    ("slower-and-slower", lambda: record("cpu-quick"), "stolen by the hypervisor", RULED_OUT, "steal"),
    ("gpu-low-cpu-high", lambda: record("cpu-quick"), "/dev/shm", RULED_OUT, "/dev/shm 23.5 GiB"),
    ("gpu-low-cpu-high", lambda: record("cpu-quick"), "Too few CPU cores", UNKNOWN, "not tested by this run"),
    ("multi-gpu-scaling", lambda: record("h100-bundle-nvlink"), "No NVLink", RULED_OUT, "18 NVLinks active"),
    ("multi-gpu-scaling", lambda: record("h100-8x-throttle"), "Mixed GPUs", RULED_OUT, "8 x NVIDIA H100 80GB HBM3"),
    ("container-no-gpu", lambda: record("cpu-quick"), "not reachable here", CONFIRMED, "no GPU visible (inside docker)"),
    ("container-no-gpu", lambda: record("h100-8x-throttle"), "not reachable here", RULED_OUT, "8 GPU(s) visible"),
    ("data-lost-after-restart", preemptible_cpu_run, "preemptible", CONFIRMED, "host: preemptible (as you stated)"),
    ("data-lost-after-restart", lambda: rejudged(record("cpu-quick")), "preemptible", UNKNOWN,
     "not visible from inside the machine"),
    ("data-lost-after-restart", lambda: rejudged(record("cpu-quick")), "ephemeral storage", UNKNOWN, "cannot tell whether"),
    ("data-lost-after-restart", on_a_volume, "ephemeral storage", RULED_OUT, "a network block volume"),
    ("data-lost-after-restart", lambda: record("cpu-quick"), "installed into the container", UNKNOWN, "running in docker"),
    ("day-night", lambda: record("gtx1070-6x-x1-riser"), "The GPU is shared", CONFIRMED, "ethminer"),
    ("cuda-init-slow", lambda: with_latency(850), "Slow CUDA context", CONFIRMED, "850 ms"),
    ("cuda-init-slow", lambda: with_latency(95), "Slow CUDA context", RULED_OUT, "95 ms"),
    ("cuda-init-slow", lambda: record("gtx1070-6x-x1-riser"), "Persistence mode", CONFIRMED, "persistence mode off on gpu0-5"),
    ("no-kernel-image", without_kernels, "without kernels", CONFIRMED, "no kernels for compute capability 9.0"),
    ("no-kernel-image", lambda: record("h100-8x-throttle"), "different GPU", RULED_OUT, "NVIDIA H100 80GB HBM3"),
    # no GPU visible cannot confirm a mixed fleet (nor rule it out): it is another problem
    ("no-kernel-image", lambda: record("cpu-quick"), "different GPU", UNKNOWN, "this run saw no NVIDIA GPU"),
    ("slow-from-start", lambda: record("cpu-quick"), "weaker or cut-down GPU", UNKNOWN, "this run saw no NVIDIA GPU"),
    # one run at one time of day rules out nothing that comes by day
    ("day-night", lambda: record("cpu-quick"), "stolen by the hypervisor", UNKNOWN,
     "not tested: one run at one time of day cannot rule out a day-time cause; compare runs at different times with "
     "`gpuvet history --machine 9a5d8f1b4c46`"),
    ("nccl-hang", lambda: record("cpu-quick"), "/dev/shm", RULED_OUT, "/dev/shm 23.5 GiB"),
    ("nccl-hang", lambda: record("h100-bundle-nvlink"), "NVLink down", RULED_OUT, "18 NVLinks active"),
    ("busy-but-slow", lambda: record("h100-8x-throttle"), "time-sliced with a neighbour", CONFIRMED, "9.0 GiB in use"),
    ("gpu-errors", lambda: record("h100-8x-throttle"), "Memory errors", RULED_OUT, "no uncorrectable errors"),
    ("ssh-drops", ssh_without_keepalive, "No keep-alive on the server side", CONFIRMED, "no SSH keep-alive on the server side"),
    ("jupyter-slow", lambda: with_latency(850), "Slow CUDA context", CONFIRMED, "850 ms"),
    ("memory-mismatch", lambda: record("gtx1070-6x-x1-riser"), "old driver", CONFIRMED, "driver 384.66"),
    ("memory-mismatch", lambda: record("h100-8x-throttle"), "old driver", RULED_OUT, "driver 535.183.01"),
    ("memory-mismatch", lambda: record("h100-8x-throttle"), "another process", CONFIRMED, "9.0 GiB in use"),
]


@pytest.mark.parametrize(("name", "make", "cause", "state", "figure"), ANSWERS,
                         ids=[f"{a[0]}-{a[2]}-{a[3]}".replace(" ", "_") for a in ANSWERS])
def test_a_record_confirms_or_rules_out_causes_with_figures(name, make, cause, state, figure):
    result = one(results(name, make()), cause)
    assert result.state == state
    assert any(figure in f for f in result.figures), result.figures
    if state == CONFIRMED:
        assert result.next_step  # the remedy or the command that confirms it


def test_every_symptom_is_answered_by_some_record():
    assert {a[0] for a in ANSWERS} == set(SEED_CASES)


def test_confirmed_causes_come_first_then_open_then_ruled_out():
    states = [r.state for r in diagnose(symptom("slow-from-start"), record("gtx1070-6x-x1-riser")).results]
    assert states == sorted(states, key=[CONFIRMED, UNKNOWN, RULED_OUT].index) and states[0] == CONFIRMED


def test_a_cause_no_record_can_show_says_so_and_how_to_check_by_hand():
    result = one(results("nccl-hang", record("cpu-quick")), "Different PyTorch/NCCL versions")
    assert result.state == UNKNOWN and result.figures == ["a run record cannot show this; check it by hand"]
    assert result.next_step.startswith("by hand: python -c 'import torch; print(torch.__version__, torch.cuda.nccl.version())'")


def test_a_cause_not_measured_says_what_to_run():
    result = one(results("multi-gpu-scaling", record("h100-bundle-nvlink")), "Slow all-reduce")
    assert result.state == UNKNOWN and result.figures == ["not measured in this run"]
    assert result.next_step.startswith("`gpuvet bench allreduce`; by hand: NCCL_DEBUG=INFO")


def doctor_text(diagnosis=None) -> str:
    console = Console(record=True, width=300, highlight=False, soft_wrap=True, color_system=None)
    render_doctor(console, diagnosis)
    return console.export_text()


def test_the_terminal_lists_the_symptoms_and_renders_a_diagnosis():
    listing = doctor_text()
    for s in SYMPTOMS:
        assert s.name in listing and s.description in listing
    assert not re.search("[\u4e00-\u9fff]", listing)  # English without a CJK font; the Chinese words still find it
    out = doctor_text(diagnose(symptom("slow-from-start"), record("gtx1070-6x-x1-riser")))
    assert "Answered from the run of" in out and "FOUND      PCIe link narrower" in out and "ruled out  Power limit" in out
    assert "fix/confirm: confirm under load" in out and "Whatever the cause:" in out
    bare = doctor_text(diagnose(symptom("nccl-hang")))
    assert "No run record" in bare and "check: `gpuvet bench p2p allreduce`" in bare
    assert "by hand: python -c 'import torch; print(torch.__version__, torch.cuda.nccl.version())' on every node" in bare


# -- a pass rules a cause out only where the check tests it ----------------------------------------

def test_an_idle_snapshot_does_not_rule_out_clocks_cut_under_load():
    result = one(results("slower-and-slower", record("h100-bundle-nvlink")), "heat or a power brake")
    assert result.state == UNKNOWN
    assert result.figures[0].startswith("not tested by this run: clocks and temperature were read once, not under minutes of load")
    assert "seen: gpu0: idle; no slowdown active" in result.figures
    assert result.next_step.startswith("`gpuvet run --soak 10`")


def test_a_sustained_load_that_held_rules_out_clocks_cut():
    r = record("h100-8x-synthetic-sustained")  # gpu0 held 655 TFLOPS for 90 s; gpu2 braked
    found = one(results("slower-and-slower", r), "heat or a power brake")
    assert found.state == CONFIRMED
    r.findings = [f for f in r.findings if not (f.check in ("gpu.sustained", "gpu.throttle") and f.subject == "gpu2")]
    held = one(results("slower-and-slower", r), "heat or a power brake")
    assert held.state == RULED_OUT and any("held 655.2 TFLOPS for 90.0 s" in f for f in held.figures)


def test_a_quick_run_rules_out_neither_cpu_feed_nor_disk_nor_the_dataloader():
    found = results("gpu-low-cpu-high", record("cpu-quick"))  # `gpuvet run --quick`: facts, no benchmark
    cores = one(found, "Too few CPU cores")
    assert cores.state == UNKNOWN and cores.next_step.startswith("`gpuvet bench cpu`")
    assert "seen: host: 2 usable cores (2 physical, 2 logical), AMD EPYC" in cores.figures
    disk = one(found, "Slow disk")
    assert disk.state == UNKNOWN and disk.next_step.startswith("`gpuvet bench disk --path /your/dataset/dir`")
    assert disk.figures[0].startswith("not tested by this run: only where the working directory lives was read")
    loader = one(found, "DataLoader too slow")
    assert loader.state == UNKNOWN and loader.next_step.startswith("by hand: time one epoch of the DataLoader alone")
    assert one(found, "/dev/shm too small").state == RULED_OUT  # its size is the very thing at fault


def test_a_cpu_feed_measurement_rules_out_too_few_cores():
    r = record("cpu-quick")  # synthetic: a passing CPU feed benchmark on the real record
    r.findings.append(Finding("host.cpu_feed", "host", "pass", "the CPU prepares 1,850 images/s (no GPU here to feed)"))
    result = one(results("gpu-low-cpu-high", r), "Too few CPU cores")
    assert result.state == RULED_OUT and result.figures == ["host: the CPU prepares 1,850 images/s (no GPU here to feed)"]


def test_passthrough_gpus_do_not_rule_out_a_slow_context_that_was_never_timed():
    result = one(results("cuda-init-slow", record("h100-8x-throttle")), "Slow CUDA context")
    assert result.state == UNKNOWN
    assert result.figures == ["not tested by this run: the time to create a CUDA context was not measured",
                              "whole GPUs (passthrough), not a vGPU guest"]
    assert result.next_step.startswith("`gpuvet bench latency`")


def test_a_link_read_at_idle_below_its_generation_leaves_pcie_open():
    r = runner.inspect([str(RECORDS.parent / "smi_text/q-8x-rtx4090-all-idle-535.154.05.txt")])
    result = one(results("slow-from-start", r), "PCIe link")
    assert result.state == UNKNOWN and result.figures[0].startswith("not tested by this run: the link was read idle")
    assert one(results("slow-from-start", record("h100-bundle-nvlink")), "PCIe link").figures == [
        "gpu0: the full Gen5 x16 link, read under load"]


def test_unknown_persistence_is_checked_by_hand():
    result = one(results("data-lost-after-restart", rejudged(record("cpu-quick"))), "ephemeral storage")
    assert "/tmp on ext4: cannot tell whether a virtual or unknown disk (kvm guest, in docker) is kept" in " ".join(result.figures)
    assert result.next_step == "by hand: findmnt -T .; lsblk -o NAME,TYPE,ROTA,MODEL; the provider's docs on instance storage"


def test_the_terminal_says_what_was_not_tested():
    out = doctor_text(diagnose(symptom("gpu-low-cpu-high"), record("cpu-quick")))
    assert "?          Too few CPU cores" in out and "not tested by this run: the cores were counted" in out
    assert "check: `gpuvet bench cpu`" in out


def test_a_day_time_cause_seen_in_one_run_still_shows_what_that_run_saw():
    steal = one(results("day-night", record("cpu-quick")), "stolen by the hypervisor")
    assert "seen at 2026-11-29 16:45 UTC: host: 1.0% steal over 0.5 s, 0.3% since boot (kvm guest)" in steal.figures
    assert steal.next_step == "run `gpuvet run` by day and at night, then `gpuvet history --machine 9a5d8f1b4c46`"


def test_the_terminal_names_the_run_it_answered_from():
    console = Console(record=True, width=200, color_system=None)
    render_doctor(console, diagnose(symptom("day-night"), record("cpu-quick"), "run #3", "this machine's latest full `gpuvet run`"))
    assert ("Answered from run #3 (started 2026-11-29T16:45:04Z, live, verdict pass): this machine's latest full "
            "`gpuvet run`.") in console.export_text()
