"""`gpuvet health`: the passive fleet check. Real captures of failing and healthy GPUs, this
machine (no GPU), and a GPU reader that hangs the way NVML does on a dying GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from gpuvet.facts import Driver, Gpu
from gpuvet.fleet import health
from gpuvet.judge.health import PROBLEM, UNKNOWN
from gpuvet.probe import capture, live
from gpuvet.record import RunRecord
from gpuvet.report.health import SUMMARY_MAX, summary_line
from gpuvet.store import Store

FIXTURES = Path(__file__).parent / "fixtures"
POWER_BRAKE = FIXTURES / "smi_text" / "q-8x-h100-sxm-vm-swpowercap-535.183.01.txt"  # gpu2: HW power brake
HEALTHY = FIXTURES / "smi_text" / "q-8x-a100-sxm4-40gb-azure-ndv4-460.32.03.txt"
FOUR_K80 = FIXTURES / "smi_xml" / "tesla-k80-x4-azure-ecc-retired-430.26-v10.xml"
BUSY_RTX = FIXTURES / "smi_text" / "q-8x-rtx4090-all-idle-535.154.05.txt"  # a job's processes on every GPU


def gpuvet(*args: str, db: Path | None = None) -> subprocess.CompletedProcess:
    store = ["--db", str(db)] if db else ["--no-save"]
    return subprocess.run([sys.executable, "-m", "gpuvet", "health", *store, *args], check=False, capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)


def _summary_fits(line: str) -> None:
    """What node-problem-detector and scontrol keep: one ASCII line of at most 80 bytes."""
    assert line.startswith("gpuvet: ") and len(line.encode()) <= SUMMARY_MAX and line.isascii()


def test_this_machine_answers_fast_with_a_scheduler_exit_code(tmp_path):
    done = gpuvet("--json", "--out", str(tmp_path / "health.json"), db=tmp_path / "runs.sqlite3")
    verdict, record = json.loads(done.stdout), json.loads((tmp_path / "health.json").read_text())
    assert done.returncode == verdict["exit_code"] in (0, 1, 2)
    assert record["duration_s"] < 5 and record["options"]["profile"] == "health"
    if not record["machine"]["gpus"]:  # like CI: no GPU, so it cannot tell, and says why
        assert done.returncode == 2 and verdict["status"] == "unknown"
        assert verdict["summary"].startswith("gpuvet: cannot tell: no GPU to check")
        assert any(u["check"] == "gpu.reachable" for u in verdict["unread"])  # never a silent pass
    _summary_fits(verdict["summary"])


def test_a_failing_gpu_exits_1_with_the_reason_on_the_first_line():
    done = gpuvet("--from", str(POWER_BRAKE))
    assert done.returncode == 1
    first, *rest = done.stdout.splitlines()
    _summary_fits(first)
    # The check and the action first (`sinfo -R` shows 20 characters of a drain reason), then the GPU.
    assert first.startswith("gpuvet: gpu.throttle ask_provider gpu2: slowdown flagged in the snapshot: HW")
    assert any(line.split()[:3] == ["FAIL", "gpu.throttle", "gpu2"] for line in rest)


def test_a_healthy_capture_exits_0_and_brief_prints_one_line():
    done = gpuvet("--from", str(HEALTHY), "--brief")
    assert done.returncode == 0 and done.stdout == "gpuvet: healthy, 8 GPU(s)\n"


def test_a_running_job_is_not_a_problem():
    """Processes and memory of someone's job on every GPU: `gpuvet run --quick` warns about them,
    health leaves them out (it runs on busy nodes)."""
    done = gpuvet("--from", str(BUSY_RTX))
    assert done.returncode == 0 and "gpu.isolation" not in done.stdout


def test_fewer_gpus_than_the_node_has_is_a_problem():
    done = gpuvet("--from", str(FOUR_K80), "--expect-gpus", "8", "--brief")
    assert done.returncode == 1 and done.stdout == "gpuvet: gpu.reachable reboot_node: 4 of 8 GPUs visible\n"


def test_a_gpu_fallen_off_the_bus_is_named():
    """Stand-in: the healthy A100 capture with one GPU answering NVML as a lost GPU does
    (NVML_ERROR_GPU_IS_LOST on its calls)."""
    machine = capture.merge(capture.read_captures(str(HEALTHY)))
    machine.gpus[3].unavailable["power.draw_w"] = "the GPU has fallen off the bus"
    record = health.check(machine=machine)
    assert health.outcome(record) == PROBLEM
    assert summary_line(record, PROBLEM) == "gpuvet: gpu.reachable reboot_node gpu3: fallen off the bus (NVML reports the..."


def test_a_hung_gpu_probe_is_cut_at_its_deadline_and_is_itself_a_problem():
    stuck = threading.Event()

    def hangs_like_a_dying_gpu() -> tuple[Driver, list[Gpu], None, None]:
        stuck.wait(30)
        return Driver(), [], None, None

    t0 = time.monotonic()
    try:
        machine = live.collect_passive({"gpu": 0.2}, read_gpus=hangs_like_a_dying_gpu)
        record = health.check(machine=machine, budgets_s={"gpu": 0.2})
    finally:
        stuck.set()
    assert time.monotonic() - t0 < 5  # cut at the deadline, not after the reader's 30 s
    assert health.outcome(record) == PROBLEM
    assert summary_line(record, PROBLEM) == "gpuvet: health.probe reboot_node: NVML hung past its 0.2 s deadline: GPU or d..."


def test_no_gpu_facts_is_could_not_tell_not_healthy():
    machine = live.collect_passive(read_gpus=lambda: (Driver(), [], None, "no NVIDIA driver"))
    record = health.check(machine=machine)
    assert health.outcome(record) == UNKNOWN


def test_a_health_record_judged_again_keeps_the_health_rules(tmp_path):
    saved = tmp_path / "health.json"
    gpuvet("--from", str(BUSY_RTX), "--out", str(saved))
    again = subprocess.run([sys.executable, "-m", "gpuvet", "inspect", str(saved), "--json"], check=False, capture_output=True,
                           text=True, timeout=60)
    checks = {f["check"] for f in json.loads(again.stdout)["findings"]}
    assert "gpu.reachable" in checks and "gpu.isolation" not in checks


def test_history_lists_health_runs_as_their_own_kind(tmp_path):
    db = tmp_path / "runs.sqlite3"
    gpuvet("--from", str(POWER_BRAKE), db=db)
    gpuvet("--from", str(HEALTHY), db=db)
    listed = subprocess.run([sys.executable, "-m", "gpuvet", "history", "--db", str(db)], check=False, capture_output=True, text=True,
                            timeout=60, env={**os.environ, "COLUMNS": "200"})
    assert listed.stdout.count("│ health ") == 2  # the kind column of each row (the header is ┃ health)
    assert "gpu.throttle ask_provider gpu2: slowdown" in listed.stdout and "healthy, 8 GPU(s)" in listed.stdout  # what each said
    only = subprocess.run([sys.executable, "-m", "gpuvet", "history", "--kind", "quick", "--json", "--db", str(db)],
                          check=False, capture_output=True, text=True, timeout=60)
    assert json.loads(only.stdout) == []


def test_slurm_without_scontrol_says_so_and_keeps_the_answer(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    env = {**os.environ, "PATH": str(bin_dir)}
    done = subprocess.run([sys.executable, "-m", "gpuvet", "health", "--no-save", "--slurm", "--node", "n1", "--from",
                           str(POWER_BRAKE), "--brief"], check=False, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 1
    assert "gpuvet: slurm: n1 not drained: scontrol not found on PATH" in done.stderr


def test_keep_changes_stores_a_health_run_when_its_summary_changes_or_hourly(tmp_path):
    """A scheduler checks every minute: the history keeps the moments the answer changed."""
    machine = capture.merge(capture.read_captures(str(HEALTHY)))

    def run_at(started_at: str, summary: str) -> RunRecord:
        return RunRecord(machine=machine, started_at=started_at, options={"profile": "health", "summary": summary})

    with Store(str(tmp_path / "runs.sqlite3")) as store:
        assert health.worth_keeping(store, run_at("2026-12-01T10:00:00Z", "gpuvet: healthy, 8 GPU(s)"))
        store.save(run_at("2026-12-01T10:00:00Z", "gpuvet: healthy, 8 GPU(s)"))
        assert not health.worth_keeping(store, run_at("2026-12-01T10:01:00Z", "gpuvet: healthy, 8 GPU(s)"))
        assert health.worth_keeping(store, run_at("2026-12-01T10:02:00Z", "gpuvet: gpu3 gpu.reachable: fallen off"))
        assert health.worth_keeping(store, run_at("2026-12-01T11:00:00Z", "gpuvet: healthy, 8 GPU(s)"))


def test_gpus_on_the_bus_with_the_driver_not_loaded_are_a_problem():
    """Stand-in: what the GPU probe returns when NVML cannot start but sysfs lists the GPUs."""
    def driver_not_loaded() -> tuple[Driver, list[Gpu], None, str]:
        gpus = [Gpu(index=i, unavailable={"name": "NVML does not see this GPU (the NVIDIA kernel driver is not loaded)"})
                for i in range(2)]
        return Driver(), gpus, None, "the NVIDIA kernel driver is not loaded"

    record = health.check(machine=live.collect_passive(read_gpus=driver_not_loaded))
    assert health.outcome(record) == PROBLEM
    assert summary_line(record, PROBLEM).startswith("gpuvet: gpu.reachable reboot_node gpu0 (+1 more): not answering: NVML")


XID79_ON_GPU3 = FIXTURES / "edited" / "dmesg-tesla-k40m-xid79-390.30-edited-bus-86-as-h100-gpu3.txt"


def test_an_xid_in_the_kernel_log_names_the_gpu_first():
    """The H100 report's gpu2 is power-braked; the kernel log (edited to name its gpu3's bus)
    says gpu3 fell off the bus: that is what the drain reason must say."""
    done = gpuvet("--from", str(POWER_BRAKE), "--from", str(XID79_ON_GPU3), "--brief")
    assert done.returncode == 1
    _summary_fits(done.stdout.strip())
    assert done.stdout.startswith("gpuvet: gpu.xid reboot_node gpu3 (+2 more): Xid 79 (GPU has fallen off the bu")


def test_a_skipped_check_is_said_and_not_judged():
    done = gpuvet("--from", str(POWER_BRAKE), "--skip", "gpu.throttle", "-v")
    assert done.returncode == 0
    assert any(line.split()[:2] == ["SKIP", "gpu.throttle"] and "(--skip)" in line for line in done.stdout.splitlines())


def test_a_health_record_matches_the_shipped_run_schema():
    from record_schemas import problems

    def run(out: Path) -> dict:
        gpuvet("--from", str(POWER_BRAKE), "--from", str(XID79_ON_GPU3), "--skip", "gpu.temperature",
               "--expect-gpus", "8", "--out", str(out))
        return json.loads(out.read_text())

    record = run(Path(os.environ.get("TMPDIR", "/tmp")) / f"gpuvet-health-{os.getpid()}.json")
    assert record["options"]["skip"] == ["gpu.temperature"] and record["options"]["summary"].startswith("gpuvet: gpu.xid")
    assert record["action"] == "reboot_node"  # Xid 79: NVIDIA's RESTART_BM
    assert problems("run", record) == []


def test_the_live_nvml_path_under_replay_judges_a_riser_at_x1():
    """GPUVET_NVML_REPLAY: NVML answers from a real capture (six GTX 1070 on x1 risers), so the
    live probe health runs on a node is the one exercised, deadline and all."""
    riser = FIXTURES / "smi_xml" / "gtx-1070-x6-riser-pcie-x1-384.66-v9.xml"
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "health.json"
        done = subprocess.run([sys.executable, "-m", "gpuvet", "health", "--no-save", "--out", str(out)], check=False,
                              capture_output=True, text=True, timeout=60, env={**os.environ, "GPUVET_NVML_REPLAY": str(riser)})
        record = json.loads(out.read_text())
    assert done.returncode == 1 and len(record["machine"]["gpus"]) == 6 and record["duration_s"] < 5
    assert record["machine"]["probe_errors"] == {}
    assert record["options"]["summary"].startswith("gpuvet: gpu.pcie_link ask_provider gpu0 (+5 more): x1 of x16")


# -- the verdict object: what a remediator acts on without parsing text -------------------------

def _verdict(*args: str) -> tuple[int, dict]:
    done = gpuvet(*args, "--json")
    return done.returncode, json.loads(done.stdout)


def test_the_verdict_names_the_action_and_the_gpu_by_index_and_uuid():
    from record_schemas import problems

    code, verdict = _verdict("--from", str(POWER_BRAKE), "--from", str(XID79_ON_GPU3))
    assert problems("health", verdict) == []
    assert code == verdict["exit_code"] == 1 and verdict["status"] == "problem"
    assert verdict["action"] == "reboot_node"  # the worst asked for: Xid 79 (RESTART_BM) over a power brake
    affected = {g["index"]: g for g in verdict["gpus"]}
    assert set(affected) == {2, 3}
    assert affected[3]["action"] == "reboot_node" and affected[3]["uuid"].startswith("GPU-")
    assert affected[2]["action"] == "ask_provider" and affected[2]["checks"] == ["gpu.throttle"]
    assert all(f["action"] == "none" for f in verdict["findings"] if f["status"] == "pass")


def test_a_healthy_node_asks_for_nothing_and_lists_what_it_could_not_read():
    code, verdict = _verdict("--from", str(HEALTHY))
    assert code == 0 and verdict["status"] == "healthy" and verdict["action"] == "none" and verdict["gpus"] == []
    # No kernel log among the captures: gpu.xid is listed as not read, never counted as passed.
    assert any(u["check"] == "gpu.xid" for u in verdict["unread"])
    assert not any(f["check"] == "gpu.xid" and f["status"] == "pass" for f in verdict["findings"])


def test_a_warning_never_asks_for_a_reset_or_a_reboot():
    from gpuvet.actions import WARN_CEILING, rank

    for capture in (POWER_BRAKE, BUSY_RTX, FOUR_K80, HEALTHY):
        _, verdict = _verdict("--from", str(capture))
        assert all(rank(f["action"]) <= rank(WARN_CEILING) for f in verdict["findings"] if f["status"] == "warn")
