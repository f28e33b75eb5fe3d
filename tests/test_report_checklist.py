"""The seeds' checklist, ticked from real run records (tests/fixtures/records/README.md)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from gpuvet import judge, runner
from gpuvet.facts import PcieLink
from gpuvet.record import FAIL, MEASURED, PASS, Finding, Measurement, RunRecord
from gpuvet.report.checklist import CROSSED, ITEMS, TICKED, UNKNOWN, WARNED, checklist, grouped, subject_range

from cli_runner import gpuvet

FIXTURES = Path(__file__).parent / "fixtures"
RECORDS = FIXTURES / "records"


def record(name: str) -> RunRecord:
    return RunRecord.from_dict(json.loads((RECORDS / f"{name}.json").read_text()))


def lines(r: RunRecord) -> dict:
    return {line.item.key: line for line in checklist(r)}


def rejudged(r: RunRecord) -> RunRecord:
    """What `gpuvet report` shows of a record: its facts judged by today's rules."""
    r.findings = judge.judge(r.machine, r.measurements, r.options)
    return r


def test_every_item_of_both_seed_tables_is_there_in_order():
    keys = [item.key for item in ITEMS]
    assert keys == ["whole_card", "power_limit", "pcie_link", "storage_io", "rdma", "software_stack", "preemptible",
                    "checkpoints", "pcie_driver_view", "power_wall", "nvlink", "cpu", "context_init", "tcp_latency"]
    groups = dict(grouped(checklist(record("cpu-quick"))))
    assert [line.item.key for line in groups["acceptance"]][-1] == "checkpoints" and len(groups["hidden"]) == 6


def test_8x_h100_power_brake_crosses_the_power_wall_and_the_process_warns_whole_card():
    found = lines(record("h100-8x-throttle"))
    wall = found["power_wall"]
    assert wall.state == CROSSED
    # The snapshot flagged the brake while the SM clock read its max: said so, not "SM 1980 of 1980 MHz".
    assert wall.figure.startswith("gpu2: HW power brake flagged in the snapshot (SM clock at its full 1980 MHz then: "
                                  "watch it under load)") and "limit 700 W of 700 W default" in wall.figure
    assert "SW thermal" not in wall.figure and "SM 1980 of 1980" not in wall.figure
    assert wall.figure.endswith("; performance state P0 at SM 345-1980 of 1980 MHz: gpu0-7")  # the seeds' first look
    whole = found["whole_card"]
    assert whole.state == WARNED and whole.figure.startswith("gpu2: 9.0 GiB in use") and "python" in whole.figure
    assert found["power_limit"].state == TICKED and found["power_limit"].figure == "gpu0-7: 700 W, at the 700 W default"
    # Stored before gpu.pcie_under_load existed: the line needs that finding and says so.
    assert found["pcie_link"].state == UNKNOWN
    assert found["pcie_link"].figure == "gpu.pcie_under_load not checked (run `gpuvet bench pcie`)"
    # Judged again: read at idle, but already the full Gen5 x16 link, which never trains up past its max under load.
    judged = lines(rejudged(record("h100-8x-throttle")))["pcie_link"]
    assert judged.state == TICKED
    assert judged.figure == "gpu0-7: Gen5 x16 at idle, already the link's maximum: load cannot raise it"


def test_x1_riser_crosses_both_pcie_items_with_the_lane_count():
    found = lines(record("gtx1070-6x-x1-riser"))
    for key in ("pcie_link", "pcie_driver_view"):
        assert found[key].state == CROSSED
        # the other GPUs' own figures, where they differ from gpu0's, not a bare "(+5 more)"
        assert found[key].figure.startswith("gpu0: x1 of x16 lanes") and found[key].figure.endswith("; gpu1-5: ~0 GB/s … ~8 GB/s")
    assert found["power_wall"].state == TICKED
    assert found["power_wall"].figure == ("limit 180 W of 180 W default, settable to 200 W on all 6 GPUs; "
                                          "performance state P2 at SM 1885-1936 of 1961 MHz: gpu0-5")


def test_a_capture_leaves_host_items_unknown_and_says_why():
    found = lines(record("h100-8x-throttle"))
    assert found["storage_io"].state == UNKNOWN and found["storage_io"].figure == "not checked (run `gpuvet run`)"
    assert found["context_init"].figure == "not checked (run `gpuvet bench latency`)"
    assert found["software_stack"].state == UNKNOWN and "not in the capture" in found["software_stack"].figure
    assert found["checkpoints"].state == UNKNOWN and "host facts not in the capture" in found["checkpoints"].figure
    assert found["nvlink"].state == UNKNOWN and "nvlink -s" in found["nvlink"].figure  # H100 SXM has NVLink: not read


def test_a_cpu_run_cannot_tick_checkpoints_on_a_vm_disk_and_explains_the_missing_gpu():
    r = rejudged(record("cpu-quick"))  # made when a pass of storage.workdir meant any local disk
    found = lines(r)
    checkpoints = found["checkpoints"]
    # storage.persistence could not tell, so the checkpoint that was written and read ticks nothing
    (persistence,) = [f for f in r.findings if f.check == "storage.persistence"]
    assert persistence.status == "skip" and checkpoints.state == UNKNOWN and checkpoints.figure == persistence.summary
    assert checkpoints.figure.startswith(
        "/tmp on ext4: cannot tell whether a virtual or unknown disk (kvm guest, in docker) is kept when the instance stops")
    assert "`findmnt -T /tmp`" in checkpoints.figure and "instance storage" in checkpoints.figure
    assert found["whole_card"].state == UNKNOWN and "NVML" in found["whole_card"].figure
    assert found["preemptible"].state == UNKNOWN and "--preemptible" in found["preemptible"].figure


def test_a_stored_record_without_the_persistence_finding_ticks_no_checkpoints():
    # Read as stored (no rejudging): the line needs storage.persistence's own finding, which the
    # record predates; it never falls back to deciding from the facts itself.
    line = lines(record("cpu-quick"))["checkpoints"]
    assert line.state == UNKNOWN and line.figure == "storage.persistence not checked (run `gpuvet run`)"


def test_checkpoints_on_storage_of_unknown_persistence_warn_on_a_preemptible_instance():
    r = record("cpu-quick")
    r.options["preemptible"] = True
    line = lines(rejudged(r))["checkpoints"]
    assert line.state == WARNED and "cannot tell whether" in line.figure
    assert line.figure.endswith("; the instance is preemptible (as you stated)")


def test_a_spot_instance_named_by_the_clouds_metadata_is_flagged_with_its_source():
    r = record("cpu-quick")  # synthetic change: the facts of an AWS spot instance
    host = r.machine.host
    host.cloud, host.preemptible, host.lifecycle = "aws", True, "spot"
    host.lifecycle_source = "EC2 instance metadata /latest/meta-data/instance-life-cycle"
    found = lines(rejudged(r))
    assert found["preemptible"].state == WARNED
    assert "spot per the EC2 instance metadata /latest/meta-data/instance-life-cycle" in found["preemptible"].figure
    assert found["checkpoints"].state == WARNED  # unknown persistence on an instance that can be reclaimed
    (spot,) = [f for f in r.findings if f.check == "host.preemptible"]
    assert (spot.evidence.measured, spot.evidence.source) == (
        "spot", "the cloud's instance metadata (EC2 instance metadata /latest/meta-data/instance-life-cycle)")
    r.options["preemptible"] = False  # what the user says wins
    assert lines(rejudged(r))["preemptible"].state == TICKED and "as you stated" in lines(r)["preemptible"].figure
    host.preemptible, host.unavailable["lifecycle"] = None, "EC2 instance metadata: no answer within 0.5 s"
    r.options.pop("preemptible")
    assert "no answer within 0.5 s" in lines(rejudged(r))["preemptible"].figure


def test_checkpoints_ticked_where_the_facts_show_persistent_storage():
    r = record("cpu-quick")  # synthetic change: the working directory on a network block volume
    r.machine.host.workdir.kind, r.machine.host.workdir.model = "nvme", "Amazon Elastic Block Store"
    line = lines(rejudged(r))["checkpoints"]
    assert line.state == TICKED
    # storage.persistence's words first (the item's order), then the working directory's own
    assert line.figure.startswith("/tmp on ext4: Amazon Elastic Block Store: a network block volume, kept when the "
                                  "instance stops; storage: ")


@pytest.mark.parametrize(("stated", "state"), [(True, WARNED), (False, TICKED), ("spot", WARNED), ("on-demand", TICKED),
                                               (None, UNKNOWN), ("maybe", UNKNOWN)])
def test_preemptible_is_what_the_user_stated(stated, state):
    r = record("cpu-quick")
    r.options["preemptible"] = stated
    line = lines(rejudged(r))["preemptible"]
    (f,) = [f for f in r.findings if f.check == "host.preemptible"]
    assert line.state == state and line.figure == f.summary  # the finding's words, nothing decided here


def test_sustained_load_shows_what_the_gpus_drew_against_their_limit():
    figure = lines(record("h100-8x-synthetic-sustained"))["power_limit"].figure
    assert figure.startswith("gpu0-7: 700 W, at the 700 W default; under sustained load the GPUs drew 77-98% of their limit")
    assert figure.endswith("(lowest gpu2: 538 W)")


def test_a_power_brake_under_load_crosses_the_power_wall_even_when_the_snapshot_was_clean():
    r = record("h100-8x-synthetic-sustained")  # synthetic change: no clock-event reason in the idle snapshot
    for gpu in r.machine.gpus:
        gpu.clocks.event_reasons = []
    r.findings = judge.judge(r.machine, r.measurements, r.options)
    wall = lines(r)["power_wall"]
    assert wall.state == CROSSED
    assert wall.figure == ("gpu2: HW power brake during 56% of the load at 538 W (77% of its limit); "
                           "limit 700 W of 700 W default, settable to 700 W on all 8 GPUs; "
                           "performance state P0 at SM 345-1980 of 1980 MHz: gpu0-7")


def test_a_thermal_slowdown_alone_does_not_cross_the_power_wall():
    r = record("h100-8x-synthetic-sustained")  # synthetic change: heat only, in the snapshot and under load
    for gpu in r.machine.gpus:
        gpu.clocks.event_reasons = ["sw_thermal_slowdown"] if gpu.index == 2 else []
    for m in r.measurements:
        if m.name == "sustained.telemetry":
            m.details["reasons"] = {k: v for k, v in (m.details.get("reasons") or {}).items() if "power" not in k}
    r.findings = judge.judge(r.machine, r.measurements, r.options)
    assert any(f.check == "gpu.sustained" and f.status == FAIL for f in r.findings)
    assert lines(r)["power_wall"].state == TICKED


def inspected(capture: str) -> RunRecord:
    """A record made now from a real capture, as `gpuvet inspect` makes it."""
    return runner.inspect([str(FIXTURES / capture)])


def test_a_link_read_only_at_idle_below_its_generation_is_unknown_not_ticked():
    found = lines(inspected("smi_text/q-8x-rtx4090-all-idle-535.154.05.txt"))
    r = inspected("smi_text/q-8x-rtx4090-all-idle-535.154.05.txt")
    found = lines(r)
    assert found["pcie_link"].state == UNKNOWN
    assert found["pcie_link"].figure == ("gpu0-7: read only at idle (Gen1 x16, the power-saving downshift); under load it "
                                         "should show Gen4 x16: run `gpuvet bench pcie`")
    # decided in judge/: measured, not passed, against the link's own maximum
    (f, *_) = [f for f in r.findings if f.check == "gpu.pcie_under_load"]
    assert f.status == MEASURED and (f.evidence.measured, f.evidence.expected) == (
        "Gen1 x16 at idle (nvidia-smi)", "Gen4 x16 under load")
    assert f.evidence.source == "PCIe link capability (nvidia-smi)"


def test_an_lspci_capture_ticks_neither_pcie_item():
    found = lines(inspected("lspci/lspci-vvv-rtx6000ada-idle-gen1-downgraded-spaces.txt"))
    assert found["pcie_link"].state == UNKNOWN
    assert found["pcie_link"].figure == ("gpu0: read only with the load unknown (Gen1 x16); under load it should show "
                                         "Gen4 x16: run `gpuvet bench pcie`")
    driver = found["pcie_driver_view"]
    assert driver.state == UNKNOWN and driver.figure == ("gpu0: the driver's view was not read (only lspci): the driver may "
                                                         "see a narrower link than the host: run `gpuvet run`")
    assert found["nvlink"].state == TICKED
    assert found["nvlink"].figure == "not applicable: one GPU: NVLink not in play, nothing to link it to"


def test_a_pcie_copy_measurement_settles_the_generation():
    r = inspected("smi_text/q-8x-rtx4090-all-idle-535.154.05.txt")  # synthetic: copies at ~Gen4 x16 rate on every GPU
    r.options = {"benchmarks": ["pcie"], "device": "cuda"}
    r.measurements = [Measurement(name, value, "GB/s", f"gpu{i}") for i in range(8)
                      for name, value in (("pcie.h2d_pinned", 24.1), ("pcie.d2h_pinned", 25.3))]
    rejudged(r)
    line = lines(r)["pcie_link"]
    assert line.state == TICKED
    assert line.figure.startswith("gpu0-7: the copy benchmark ran at the full link's rate: H2D 24.1, D2H 25.3 GB/s (pinned)")
    (f, *_) = [f for f in r.findings if f.check == "gpu.pcie_under_load"]
    assert f.status == PASS and f.evidence.measured == "pinned H2D 24.1 / D2H 25.3 GB/s"


def test_gpus_without_nvlink_are_a_known_answer():
    r = inspected("smi_text/q-8x-rtx4090-all-idle-535.154.05.txt")
    line = lines(r)["nvlink"]
    assert line.state == WARNED
    assert line.figure == ("gpu0-7: PCIe only: NVIDIA GeForce RTX 4090 has no NVLink, so the GPUs talk over PCIe and "
                           "all-reduce is limited to ~PCIe rate (measure it: `gpuvet bench p2p allreduce`)")
    (f, *_) = [f for f in r.findings if f.check == "gpu.nvlink"]  # decided in judge/, with its source
    assert f.status == MEASURED and f.evidence.measured == "8 GPUs, no NVLink on the model"
    assert "row RTX-4090, column nvlink_gen" in (f.evidence.source or "")


def disk_run(path: str = "/tmp", kind: str = "unknown", **options) -> RunRecord:
    """Synthetic: the real cpu-quick record with disk figures shaped like `gpuvet bench disk` gave on this
    machine (/tmp/fix/reports, KVM guest), judged by today's rules."""
    r = record("cpu-quick")
    details = {"engine": "builtin", "cache": "O_DIRECT", "fs_type": "nfs4" if kind == "network" else "ext4", "kind": kind,
               "mount_point": "/", "bytes": 1006632960, "runtime_s": 1.0, "block_size": 1048576, "queue_depth": 8}
    r.measurements = [
        Measurement("disk.seq_write", 1997.5, "MB/s", path, dict(details)),
        Measurement("disk.seq_read", 786.6, "MB/s", path, dict(details)),
        Measurement("disk.rand_read_iops", 37624, "IOPS", path, {**details, "block_size": 4096, "queue_depth": 32,
                                                                 "p50_us": 474.3, "p99_us": 4125.0}),
        Measurement("disk.small_files", 13115.7, "files/s", path, {**details, "files": 4096, "file_bytes": 16384,
                                                                   "readers": 4, "read_mb_s": 214.9, "write_files_s": 4653.5}),
    ]
    r.options = {"benchmarks": ["disk"], "device": "cpu", **options}
    r.findings = judge.judge(r.machine, r.measurements, r.options)
    return r


def test_local_disk_only_does_not_tick_shared_storage():
    r = disk_run()
    line = lines(r)["storage_io"]
    (shared,) = [f for f in r.findings if f.check == "storage.shared"]  # judged in judge/, read here
    assert line.state == UNKNOWN and shared.status == "skip" and line.figure == shared.summary
    assert line.figure == ("local disk only: /tmp (virtual or unknown disk) tested; no shared or network storage tested: "
                           "run `gpuvet run --path /your/dataset/mount`")


def test_a_tested_network_path_or_a_separate_volume_ticks_storage_naming_the_paths():
    network = disk_run("/mnt/datasets", kind="network")
    shared = lines(network)["storage_io"]
    assert shared.state == TICKED and shared.figure.startswith("tested /mnt/datasets; ")
    (found,) = [f for f in network.findings if f.check == "storage.shared"]
    assert found.status == "pass" and found.summary == "shared storage tested: /mnt/datasets"
    assert found.evidence.measured == "tested /mnt/datasets (network file system); /mnt/datasets: nfs4 at mount /"
    volume = disk_run("/data", paths=["/data"])  # synthetic: /data mounted on its own volume
    for m in volume.measurements:
        m.details["mount_point"] = "/data"
    line = lines(rejudged(volume))["storage_io"]
    assert line.state == TICKED and line.figure.startswith("tested /data; ")


def test_a_chosen_path_on_the_working_directorys_disk_is_not_shared_storage():
    line = lines(disk_run("/data", paths=["/data"]))["storage_io"]  # mount "/", as the workdir /tmp
    assert line.state == UNKNOWN
    assert line.figure == ("local disk only: /data (virtual or unknown disk) tested (/data is on the working directory's "
                           "own disk: mount / on ext4); no shared or network storage tested: "
                           "run `gpuvet run --path /your/dataset/mount`")


def test_other_gpus_figures_show_where_they_differ():
    found = lines(record("gtx1070-6x-x1-riser"))
    assert found["whole_card"].figure == ("gpu0: 2.4 GiB in use, 100% busy by 1 process(es) already running: ./ethminer "
                                          "(pid 3093); gpu1-5: 2.2 GiB")


def test_nvlink_ticked_from_the_link_state():
    found = lines(record("h100-bundle-nvlink"))
    assert found["nvlink"].state == TICKED and found["nvlink"].figure == "gpu0: 18 NVLinks active at 26.562 GB/s each"
    assert lines(rejudged(record("h100-bundle-nvlink")))["pcie_link"].figure == "gpu0: Gen5 x16 under load, the full link"


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
    line = lines(rejudged(r))["pcie_driver_view"]
    assert line.state == WARNED and line.figure.startswith(
        "gpu0: the driver reports a max of Gen5 x8 (nvidia-smi) but the host shows Gen5 x16 (lspci LnkCap)")
    agreeing = record("h100-bundle-nvlink")
    agreeing.machine.gpus[0].pcie.readings.append(PcieLink(current_gen=5, max_gen=5, current_width=16, max_width=16, source="sysfs"))
    assert lines(rejudged(agreeing))["pcie_driver_view"].state == TICKED
    assert lines(agreeing)["pcie_driver_view"].figure == "gpu0: driver and sysfs agree: max Gen5 x16"
    other_gen = record("h100-bundle-nvlink")  # synthetic change: the host reads a Gen4 maximum, the driver Gen5
    other_gen.machine.gpus[0].pcie.readings.append(PcieLink(current_gen=4, max_gen=4, current_width=16, max_width=16, source="sysfs"))
    line = lines(rejudged(other_gen))["pcie_driver_view"]
    assert line.state == WARNED and "the driver reports a max of Gen5 x16 (nvidia-smi) but the host shows Gen4 x16" in line.figure


def test_checks_from_other_areas_fill_their_items_and_worst_decides():
    r = rejudged(copy.deepcopy(record("cpu-quick")))
    r.findings += [
        Finding("storage.write", "/data", "pass", "1.9 GB/s sequential write"),
        Finding("storage.small_files", "/mnt/shared", FAIL, "210 files/s on nfs4: 40x slower than local"),
        Finding("net.rdma", "host", "skip", "no RDMA device (single node)"),
        Finding("net.loopback", "host", "pass", "TCP round trip 22 us over loopback"),
    ]
    found = lines(r)
    assert found["storage_io"].state == CROSSED
    assert found["storage_io"].figure == "210 files/s on nfs4: 40x slower than local; tested /data, /mnt/shared"
    assert found["rdma"].state == UNKNOWN and found["rdma"].figure == "no RDMA device (single node)"
    assert found["tcp_latency"].state == TICKED and "22 us" in found["tcp_latency"].figure
    assert found["checkpoints"].state == UNKNOWN and found["checkpoints"].figure.startswith("/tmp on ext4")  # not the storage FAIL


@pytest.mark.parametrize(("subjects", "text"), [(["gpu0", "gpu1", "gpu2"], "gpu0-2"), (["gpu0", "gpu2", "gpu3"], "gpu0,2,3"),
                                                (["host"], "host"), (["gpu1", "host"], "gpu1,host")])
def test_subject_range(subjects, text):
    assert subject_range(subjects) == text


def healthy_sustained_record(duration_s: float) -> RunRecord:
    """The synthetic 8x H100 sustained run with its one bad GPU left out (synthetic change), its
    load lasting `duration_s`."""
    r = record("h100-8x-synthetic-sustained")
    r.machine.gpus = [g for g in r.machine.gpus if g.index != 2]
    r.measurements = [m for m in r.measurements if m.subject != "gpu2"]
    for gpu in r.machine.gpus:
        gpu.clocks.event_reasons = []
    for m in r.measurements:
        if m.name == "sustained.tflops":
            m.details["duration_s"] = duration_s
    r.findings = judge.judge(r.machine, r.measurements, r.options)
    return r


def test_a_short_load_says_what_it_could_not_prove():
    r = healthy_sustained_record(30.0)
    passes = [f for f in r.findings if f.check == "gpu.sustained"]
    assert passes and all(f.status == PASS and "gpuvet run --soak 10" in f.summary for f in passes)
    wall = lines(r)["power_wall"]
    assert wall.state == TICKED and "30 s does not heat-soak a GPU" in wall.figure and "--soak 10" in wall.figure


def test_a_soak_long_enough_claims_the_long_job():
    r = healthy_sustained_record(900.0)
    assert all("heat-soak" not in f.summary for f in r.findings if f.check == "gpu.sustained")
    assert "heat-soak" not in lines(r)["power_wall"].figure


def test_a_busy_reading_on_a_gpu_without_a_context_is_not_a_reading_under_load():
    """One PCIe rule: the checklist reads the link as gpu.pcie_link does. A GPU that reports 100%
    utilization with no process and no context's memory is the driver waking it, not load, so its
    idle Gen1 says nothing about the generation under load."""
    r = inspected("smi_text/q-8x-rtx4090-all-idle-535.154.05.txt")
    for gpu in r.machine.gpus:  # edited: as a report taken while the driver woke the GPUs
        gpu.utilization_pct, gpu.processes, gpu.memory_used_mib = 100, [], 2
        assert all(reading.under_load is None for reading in gpu.pcie.readings)
    r.findings = judge.judge(r.machine, r.measurements, r.options)
    assert all(f.status == PASS and "idle power-saving downshift" in f.summary for f in r.findings if f.check == "gpu.pcie_link")
    assert all(f.status == MEASURED for f in r.findings if f.check == "gpu.pcie_under_load")
    found = lines(r)
    assert found["pcie_link"].state == UNKNOWN
    assert found["pcie_link"].figure.startswith("gpu0-7: read only at idle (Gen1 x16, the power-saving downshift)")


def test_gpuvet_report_shows_the_preemptible_and_persistence_findings_the_checklist_reads(capsys, tmp_path, monkeypatch):
    # The real cpu-quick record, edited: its options say the user ran it with --preemptible.
    monkeypatch.setenv("COLUMNS", "400")  # whole lines: a finding's words are not folded
    data = json.loads((RECORDS / "cpu-quick.json").read_text())
    data["options"]["preemptible"] = True
    edited = tmp_path / "cpu-quick-preemptible.json"
    edited.write_text(json.dumps(data))
    code, out, _ = gpuvet(capsys, "report", str(edited))
    assert code == 0
    rows = [" ".join(row.split()) for row in out.splitlines()]
    # the findings, made in judge/ with their evidence ...
    assert "WARN host.preemptible host preemptible (as you stated): it can be reclaimed at any time; make the job " \
           "resumable and keep checkpoints on persistent storage" in rows
    assert any(row.startswith("WARN storage.persistence storage /tmp on ext4: cannot tell whether a virtual or unknown "
                              "disk (kvm guest, in docker) is kept") and row.endswith("the instance is preemptible (as you stated)")
               for row in rows)
    assert any(row.startswith("measured preemptible · expected an instance that is not reclaimed mid-job") for row in rows)
    # ... and the checklist lines read from them, word for word
    assert "! Not preemptible preemptible (as you stated): it can be reclaimed at any time; make the job resumable and " \
           "keep checkpoints on persistent storage" in rows
    (checkpoints,) = [row for row in rows if row.startswith("! Checkpoints on persistent storage ")]
    assert checkpoints.endswith("on instance storage; the instance is preemptible (as you stated)")


def test_a_machine_without_a_gpu_says_each_reason_once(capsys, tmp_path, monkeypatch):
    # The real cpu-quick record (no NVIDIA driver), edited: run with GPU benchmarks planned, which the
    # planner skipped as it does without a GPU ("no NVIDIA GPU: <why>"). gpu.pcie_link skips with the
    # same root ("no GPU facts: <why>"): one reason, said once on each line.
    monkeypatch.setenv("COLUMNS", "400")
    data = json.loads((RECORDS / "cpu-quick.json").read_text())
    names = ["pcie", "latency", "p2p", "allreduce", "workload"]
    why = f"no NVIDIA GPU: {data['machine']['gpu_error']}"
    data["options"].update(benchmarks=names, device="cuda")
    data["measurements"] = [{"name": f"bench.{n}", "value": None, "unit": "", "subject": "gpu",
                             "details": {"outcome": "skipped", "reason": why}} for n in names]
    edited = tmp_path / "cpu-quick-gpu-benchmarks-skipped.json"
    edited.write_text(json.dumps(data))
    code, out, _ = gpuvet(capsys, "report", str(edited))
    assert code == 0
    rows = {row.split("  ")[2].strip(): " ".join(row.split()) for row in out.splitlines()
            if row.startswith("  ?  ") and len(row.split("  ")) > 2}
    for title in ("PCIe width and generation under load", "NVLink between the GPUs", "PCIe width as the driver sees it"):
        assert rows[title].endswith(f"{title} no GPU facts: no NVIDIA driver (see GPUs above)")
        assert rows[title].count("no NVIDIA driver") == 1
