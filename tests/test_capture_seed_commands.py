"""The seed documents' own nvidia-smi commands, in their order: `-q -d PERFORMANCE` then `-q -d
POWER` (cut from a real `-q` the way `-q -d` prints them, tests/fixtures/edited/make_edited_seeds.py),
judged together as one machine whatever their order; and memory-health fields nvidia-smi could not
read, which are never a pass."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli_runner import gpuvet

EDITED = Path(__file__).parent / "fixtures" / "edited"
PERFORMANCE = EDITED / "q-d-performance-8x-rtx4090-swpowercap-535.154.05-cut-d-performance.txt"
POWER = EDITED / "q-d-power-8x-rtx4090-swpowercap-535.154.05-cut-d-power.txt"
POWER_300W = EDITED / "q-d-power-8x-rtx4090-535.154.05-edited-limit-300w-cut-d-power.txt"
ECC_UNKNOWN = EDITED / "q-8x-h100-sxm-vm-535.183.01-edited-ecc-unknown-error.txt"


def _inspect(capsys, *paths: Path) -> tuple[int, dict]:
    code, out, _ = gpuvet(capsys, "inspect", *map(str, paths), "--json")
    return code, json.loads(out)


def _statuses(record: dict, check: str) -> dict[str, str]:
    return {f["subject"]: f["status"] for f in record["findings"] if f["check"] == check}


@pytest.mark.parametrize("order", [(PERFORMANCE, POWER_300W), (POWER_300W, PERFORMANCE)])
def test_a_300w_cap_fails_with_the_performance_report_beside_it_in_either_order(capsys, order):
    alone_code, alone = _inspect(capsys, POWER_300W)
    code, record = _inspect(capsys, *order)
    assert alone_code == code == 1
    assert set(_statuses(record, "gpu.power_limit").values()) == {"fail"} == set(_statuses(alone, "gpu.power_limit").values())
    # The performance report's facts are kept too: its clock-event reasons are judged.
    assert _statuses(record, "gpu.throttle") and "skip" not in _statuses(record, "gpu.throttle").values()


def test_the_performance_report_alone_leaves_the_power_wall_open_and_shows_the_p_states(capsys):
    code, out, _ = gpuvet(capsys, "inspect", str(PERFORMANCE))
    wall = next(line for line in out.splitlines() if "Power wall" in line)
    assert "✓" not in wall and "power limit not available" in wall
    assert "P2" in wall and "P8" in wall  # the seeds' first check, shown where the wall is judged


def test_an_ecc_field_that_reads_unknown_error_fails_the_gpu_and_the_node(capsys):
    code, record = _inspect(capsys, ECC_UNKNOWN)
    ecc = _statuses(record, "gpu.ecc")
    assert ecc["gpu0"] == "fail" and set(ecc[f"gpu{i}"] for i in range(1, 8)) == {"pass"}
    gpu0 = next(f for f in record["findings"] if f["check"] == "gpu.ecc" and f["subject"] == "gpu0")
    assert "ECC Errors > Volatile > DRAM Uncorrectable" in gpu0["evidence"]["measured"]
    assert "Remapped Rows > Uncorrectable Error" in gpu0["evidence"]["measured"]
    assert code == 1
    health_code, _, _ = gpuvet(capsys, "health", "--from", str(ECC_UNKNOWN))
    assert health_code != 0


LOOP = EDITED / "csv-h100-load-590.48.01-edited-indexed-loop-l5-heating.csv"
DMON = EDITED / "dmon-h100-vm-load-590.48.01-edited-hot-clock-falling.txt"
RTX4090_Q = Path(__file__).parent / "fixtures" / "smi_text" / "q-8x-rtx4090-swpowercap-535.154.05.txt"


@pytest.mark.parametrize("loop", [LOOP, DMON])
def test_a_monitoring_loop_taken_during_a_job_does_not_judge_isolation(capsys, loop):
    _, record = _inspect(capsys, loop)
    (isolation,) = [f for f in record["findings"] if f["check"] == "gpu.isolation"]
    assert isolation["status"] == "skip" and "watches a running job" in isolation["summary"]
    assert _statuses(record, "gpu.trend")  # the loop itself is judged as a time series


def test_a_report_keeps_its_own_timestamp_and_says_how_old_it_is(capsys):
    _, record = _inspect(capsys, RTX4090_Q)
    (entry,) = record["machine"]["captures"]
    assert entry["note"].startswith("taken Mon Jul 08 08:11:21 2024 by its own timestamp, ")
    assert "years before this inspection" in entry["note"]


HELD_320W = EDITED / "csv-seed-loop-l5-edited-rtx4090-held-320w.csv"
INTERLEAVED = EDITED / "csv-seed-loop-l5-edited-two-gpus-interleaved.csv"


def _trend(record: dict) -> dict:
    (f,) = [f for f in record["findings"] if f["check"] == "gpu.trend"]
    return f


def test_the_seed_loop_of_a_card_held_at_320w_is_the_power_wall_once_the_model_is_known(capsys):
    _, record = _inspect(capsys, HELD_320W)
    alone = _trend(record)
    assert alone["status"] == "measured" and "power wall is not judged" in alone["summary"]  # no model, no limit: not a pass
    code, out, _ = gpuvet(capsys, "inspect", str(HELD_320W), "--expect", "RTX 4090", "--json")
    f = _trend(json.loads(out))
    assert f["status"] == "warn" and "318-322 W" in f["summary"] and "71% of 450 W" in f["summary"]
    assert "power wall" in f["summary"]


def test_a_loop_of_two_gpus_without_an_index_is_said_to_interleave(capsys):
    _, record = _inspect(capsys, INTERLEAVED)
    f = _trend(record)
    assert f["status"] == "warn" and "rows of 2 GPUs interleaved" in f["summary"] and "2745 / 2235 MHz" in f["summary"]
    assert "held steady" not in f["summary"] and "index" in f["remedy"]


BRIDGED = EDITED / "dgx-a100-8gpu-topo-m-edited-nv4-bridged-pairs.txt"
DGX_A100 = Path(__file__).parent / "fixtures" / "topo" / "dgx-a100-8gpu-nv12-12nics-topo-m.txt"


def test_nvlink_only_in_bridged_pairs_warns_and_names_what_the_all_reduce_crosses(capsys):
    _, record = _inspect(capsys, BRIDGED)
    nvlink = [f for f in record["findings"] if f["check"] == "gpu.nvlink"]
    assert {f["status"] for f in nvlink} == {"warn"} and len(nvlink) == 8
    assert "4 NVLink groups" in nvlink[0]["summary"] and "(SYS)" in nvlink[0]["summary"]
    _, whole = _inspect(capsys, DGX_A100)  # the real NVSwitch box: one group, a pass
    assert {f["status"] for f in whole["findings"] if f["check"] == "gpu.nvlink"} == {"pass"}


def test_an_unknown_error_in_an_xml_report_fails_gpu_ecc_too(tmp_path):
    from gpuvet import judge
    from gpuvet.probe import capture

    real = (Path(__file__).parent / "fixtures" / "smi_xml" / "v100-pcie-32gb-passthrough-loaded-460.39-v11.xml").read_text()
    # edited in the test: the volatile double-bit device-memory counter reads "Unknown Error"
    head, sep, tail = real.partition("<double_bit>")
    edited = tmp_path / "v100-edited-ecc-unknown-error.xml"
    edited.write_text(head + sep + tail.replace("<device_memory>0</device_memory>",
                                                "<device_memory>Unknown Error</device_memory>", 1))
    machine = capture.merge(capture.read_captures(str(edited)))
    (ecc,) = [f for f in judge.judge(machine) if f.check == "gpu.ecc"]
    assert ecc.status == "fail" and "ecc_errors/device_memory" in ecc.evidence.measured
