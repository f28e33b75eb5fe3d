"""The seeds' checklist, ticked from real run records (tests/fixtures/records/README.md)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from gpuvet import judge
from gpuvet.facts import PcieLink
from gpuvet.record import FAIL, Finding, Measurement, RunRecord
from gpuvet.report.checklist import CROSSED, ITEMS, TICKED, UNKNOWN, WARNED, checklist, grouped, subject_range

RECORDS = Path(__file__).parent / "fixtures" / "records"


def record(name: str) -> RunRecord:
    return RunRecord.from_dict(json.loads((RECORDS / f"{name}.json").read_text()))


def lines(r: RunRecord) -> dict:
    return {line.item.key: line for line in checklist(r)}


def test_every_item_of_both_seed_tables_is_there_in_order():
    keys = [item.key for item in ITEMS]
    assert keys == ["whole_card", "power_limit", "pcie_link", "storage_io", "rdma", "software_stack", "preemptible",
                    "checkpoints", "pcie_driver_view", "power_wall", "nvlink", "context_init", "tcp_latency"]
    groups = dict(grouped(checklist(record("cpu-quick"))))
    assert [line.item.key for line in groups["acceptance"]][-1] == "checkpoints" and len(groups["hidden"]) == 5


def test_8x_h100_power_brake_crosses_the_power_wall_and_the_process_warns_whole_card():
    found = lines(record("h100-8x-throttle"))
    wall = found["power_wall"]
    assert wall.state == CROSSED
    assert wall.figure.startswith("gpu2: clocks cut: HW power brake") and "limit 700 W of 700 W default" in wall.figure
    whole = found["whole_card"]
    assert whole.state == WARNED and whole.figure.startswith("gpu2: 9.0 GiB in use") and "python" in whole.figure
    assert found["power_limit"].state == TICKED and found["power_limit"].figure == "gpu0-7: 700 W, at the 700 W default"
    # The link was read at idle, and the figure says so rather than claiming "under load".
    assert found["pcie_link"].state == TICKED and "Gen5 x16 at idle" in found["pcie_link"].figure


def test_x1_riser_crosses_both_pcie_items_with_the_lane_count():
    found = lines(record("gtx1070-6x-x1-riser"))
    for key in ("pcie_link", "pcie_driver_view"):
        assert found[key].state == CROSSED
        assert found[key].figure.startswith("gpu0: x1 of x16 lanes") and found[key].figure.endswith("(+5 more)")
    assert found["power_wall"].state == TICKED
    assert found["power_wall"].figure == "limit 180 W of 180 W default, settable to 200 W on all 6 GPUs"


def test_a_capture_leaves_host_items_unknown_and_says_why():
    found = lines(record("h100-8x-throttle"))
    assert found["storage_io"].state == UNKNOWN and found["storage_io"].figure == "not checked (run `gpuvet run`)"
    assert found["context_init"].figure == "not checked (run `gpuvet bench latency`)"
    assert found["software_stack"].state == UNKNOWN and "not in the capture" in found["software_stack"].figure
    assert found["checkpoints"].state == UNKNOWN and "host facts not in the capture" in found["checkpoints"].figure
    assert found["nvlink"].state == UNKNOWN and "nvlink -s" in found["nvlink"].figure


def test_a_cpu_run_ticks_the_checkpoint_path_and_explains_the_missing_gpu():
    found = lines(record("cpu-quick"))
    assert found["checkpoints"].state == TICKED and found["checkpoints"].figure.startswith("/tmp on ext4")
    assert found["whole_card"].state == UNKNOWN and "NVML" in found["whole_card"].figure
    assert found["preemptible"].state == UNKNOWN and "--preemptible" in found["preemptible"].figure


@pytest.mark.parametrize(("stated", "state"), [(True, WARNED), (False, TICKED), ("spot", WARNED), ("on-demand", TICKED),
                                               (None, UNKNOWN), ("maybe", UNKNOWN)])
def test_preemptible_is_what_the_user_stated(stated, state):
    r = record("cpu-quick")
    r.options["preemptible"] = stated
    assert lines(r)["preemptible"].state == state


def test_sustained_load_shows_what_the_gpus_drew_against_their_limit():
    figure = lines(record("h100-8x-synthetic-sustained"))["power_limit"].figure
    assert figure.startswith("gpu0-7: 700 W, at the 700 W default; under sustained load the GPUs drew 77-98% of their limit")
    assert figure.endswith("(lowest gpu2: 538 W)")


def test_nvlink_ticked_from_the_link_state():
    found = lines(record("h100-bundle-nvlink"))
    assert found["nvlink"].state == TICKED and found["nvlink"].figure == "gpu0: 18 NVLinks active at 26.562 GB/s each"
    assert found["pcie_link"].figure == "gpu0: Gen5 x16 under load (nvidia-smi), max Gen5 x16"


def test_context_init_from_a_synthetic_latency_measurement_on_a_real_capture():
    r = record("h100-bundle-nvlink")
    r.options = {"benchmarks": ["latency"]}
    r.measurements = [Measurement("latency.context_init", 850.0, "ms", "gpu0", {"runs": [850.0] * 10})]
    r.findings = judge.judge(r.machine, r.measurements, r.options)
    line = lines(r)["context_init"]
    assert line.state == WARNED and line.figure.startswith("gpu0: a new process needs 850 ms to get a CUDA context")


def test_two_pcie_views_that_disagree_warn_even_when_the_judge_passes():
    r = record("h100-bundle-nvlink")  # synthetic change: lspci reports a wider link than the driver does
    gpu = r.machine.gpus[0]
    for reading in gpu.pcie.readings:
        reading.max_width = 8
        reading.current_width = 8
    gpu.pcie.readings.append(PcieLink(current_gen=5, max_gen=5, current_width=16, max_width=16, source="lspci"))
    line = lines(r)["pcie_driver_view"]
    assert line.state == WARNED and "gpu0 driver Gen5 x8, lspci Gen5 x16" in line.figure
    agreeing = record("h100-bundle-nvlink")
    agreeing.machine.gpus[0].pcie.readings.append(PcieLink(current_gen=5, max_gen=5, current_width=16, max_width=16, source="sysfs"))
    assert lines(agreeing)["pcie_driver_view"].state == TICKED
    assert "driver and sysfs agree (max Gen5 x16)" in lines(agreeing)["pcie_driver_view"].figure


def test_checks_from_other_areas_fill_their_items_and_worst_decides():
    r = copy.deepcopy(record("cpu-quick"))
    r.findings += [
        Finding("storage.write", "/data", "pass", "1.9 GB/s sequential write"),
        Finding("storage.small_files", "/mnt/shared", FAIL, "210 files/s on nfs4: 40x slower than local"),
        Finding("net.rdma", "host", "skip", "no RDMA device (single node)"),
        Finding("net.loopback", "host", "pass", "TCP round trip 22 us over loopback"),
    ]
    found = lines(r)
    assert found["storage_io"].state == CROSSED and found["storage_io"].figure == "210 files/s on nfs4: 40x slower than local"
    assert found["rdma"].state == UNKNOWN and found["rdma"].figure == "no RDMA device (single node)"
    assert found["tcp_latency"].state == TICKED and "22 us" in found["tcp_latency"].figure
    assert found["checkpoints"].state == TICKED  # storage.workdir stays its own item


@pytest.mark.parametrize(("subjects", "text"), [(["gpu0", "gpu1", "gpu2"], "gpu0-2"), (["gpu0", "gpu2", "gpu3"], "gpu0,2,3"),
                                                (["host"], "host"), (["gpu1", "host"], "gpu1,host")])
def test_subject_range(subjects, text):
    assert subject_range(subjects) == text
