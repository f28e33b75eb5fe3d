"""`gpuvet health --slurm` and `gpuvet cluster` against a real Slurm: munged, slurmctld and slurmd
from Debian's packages (scripts/test installs them), started on localhost with a minimal
slurm.conf in a temporary folder, one node named after this host. The health check runs as
Slurm's HealthCheckProgram would (deploy/slurm/gpuvet-healthcheck, as root, no terminal), and
the node's state and reason are read back from `scontrol show node`."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
WRAPPER = ROOT / "deploy" / "slurm" / "gpuvet-healthcheck"
FAILING = FIXTURES / "smi_text" / "q-8x-h100-sxm-vm-swpowercap-535.183.01.txt"  # gpu2: HW power brake
HEALTHY = FIXTURES / "smi_text" / "q-8x-a100-sxm4-40gb-azure-ndv4-460.32.03.txt"
DAEMONS = ("munged", "slurmctld", "slurmd", "scontrol", "srun")
READY_S = 30.0  # a loaded 2-core machine: slurmctld answers and slurmd registers within seconds


def _which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")


def _missing() -> str | None:
    if sys.platform != "linux":
        return "Slurm's daemons run on Linux only"
    if os.geteuid() != 0:
        return "slurmd and munged must run as root here (no SlurmUser account to switch to)"
    absent = [d for d in DAEMONS if _which(d) is None]
    if absent:
        return f"not installed: {', '.join(absent)} (scripts/test installs munge, slurmctld, slurmd, slurm-client)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalSlurm:
    """One controller and one node on localhost; every daemon a child of the test process, in
    the foreground, so teardown stops and reaps each one by its own handle."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.node = socket.gethostname().split(".")[0]
        self.conf = folder / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.daemons: list[subprocess.Popen] = []

    def start(self) -> None:
        f = self.folder
        for sub in ("state", "spool", "log"):
            (f / sub).mkdir()
        key = f / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        sock = f / "munge.sock"
        self._spawn([_which("munged"), "-F", f"--socket={sock}", f"--key-file={key}", f"--pid-file={f / 'munged.pid'}",
                     f"--log-file={f / 'log' / 'munged.log'}", f"--seed-file={f / 'munge.seed'}", "--force"])
        self._wait(lambda: sock.exists(), "munged's socket")
        self.conf.write_text(f"""ClusterName=gpuvettest
SlurmctldHost=localhost
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/munge
AuthInfo=socket={sock}
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={f / 'state'}
SlurmdSpoolDir={f / 'spool'}
SlurmctldPidFile={f / 'slurmctld.pid'}
SlurmdPidFile={f / 'slurmd.pid'}
SlurmctldLogFile={f / 'log' / 'slurmctld.log'}
SlurmdLogFile={f / 'log' / 'slurmd.log'}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SchedulerType=sched/builtin
ReturnToService=1
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName={self.node} NodeHostname=localhost NodeAddr=127.0.0.1 CPUs=1 State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
        self._spawn([_which("slurmctld"), "-D", "-i", "-f", str(self.conf)])
        self._spawn([_which("slurmd"), "-D", "-f", str(self.conf), "-N", self.node])
        self._wait(lambda: "State=IDLE" in self._show_quietly(), f"node {self.node} idle")

    def _spawn(self, argv: list) -> None:
        self.daemons.append(subprocess.Popen([str(a) for a in argv], env=self.env, stdout=subprocess.DEVNULL,
                                             stderr=subprocess.DEVNULL))

    def _wait(self, ready, what: str) -> None:
        deadline = time.monotonic() + READY_S
        while not ready():
            dead = [d.args[0] for d in self.daemons if d.poll() is not None]
            if dead or time.monotonic() > deadline:
                logs = "\n".join(p.read_text()[-1500:] for p in (self.folder / "log").glob("*.log"))
                raise RuntimeError(f"local Slurm not ready ({what}); exited: {dead}\n{logs}")
            time.sleep(0.1)  # polling a daemon's start-up, not timing anything

    def _show_quietly(self) -> str:
        done = subprocess.run(["scontrol", "show", "node", self.node, "-o"], env=self.env, check=False, capture_output=True,
                              text=True, timeout=10)
        return done.stdout

    def show(self) -> tuple[str, str | None]:
        """(State, Reason without Slurm's [user@time]) as `scontrol show node` prints them."""
        line = self._show_quietly()
        state = line.split("State=", 1)[1].split()[0]
        reason = line.split(" Reason=", 1)[1].rsplit(" [", 1)[0].strip() if " Reason=" in line else None
        return state, reason

    def wait_for(self, ready, what: str) -> None:
        self._wait(ready, what)

    def scontrol(self, *args: str) -> None:
        subprocess.run(["scontrol", *args], env=self.env, check=True, capture_output=True, timeout=10)

    def stop(self) -> None:
        for daemon in reversed(self.daemons):
            daemon.terminate()
        for daemon in reversed(self.daemons):
            try:
                daemon.wait(timeout=15)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait(timeout=5)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    why = _missing()
    if why:
        pytest.skip(why)
    cluster = LocalSlurm(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def resumed(slurm):
    """Each test starts from an undrained node."""
    state, _ = slurm.show()
    if "DRAIN" in state:
        slurm.scontrol("update", f"NodeName={slurm.node}", "State=RESUME")
    yield slurm


def _healthcheck(slurm: LocalSlurm, tmp_path: Path, capture: Path, *extra: str) -> subprocess.CompletedProcess:
    """deploy/slurm/gpuvet-healthcheck as slurmd runs it: root, no terminal, a bare environment
    (here: SLURM_CONF for the test's controller, and gpuvet from this checkout)."""
    env = {"PATH": os.environ["PATH"], "SLURM_CONF": str(slurm.conf), "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
           "GPUVET": f"{sys.executable} -m gpuvet", "GPUVET_DB": str(tmp_path / "runs.sqlite3"),
           "GPUVET_HEALTH_OPTS": " ".join(["--from", str(capture), *extra])}
    return subprocess.run(["sh", str(WRAPPER)], env=env, check=False, capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)


def test_a_failing_gpu_drains_the_node_with_the_summary_as_reason_and_health_resumes_it(resumed, tmp_path):
    bad = _healthcheck(resumed, tmp_path, FAILING)
    assert bad.returncode == 1, bad.stderr
    summary = bad.stdout.strip()
    assert summary.startswith("gpuvet: gpu.throttle ask_provider gpu2") and "\n" not in summary
    state, reason = resumed.show()
    # The check and the action first: `sinfo -R` shows 20 characters; gpuvet's mark last.
    assert "DRAIN" in state and reason == summary.removeprefix("gpuvet: ") + " (gpuvet)"
    assert reason[:20] == "gpu.throttle ask_pro"
    assert f"drained {resumed.node}" in bad.stderr

    again = _healthcheck(resumed, tmp_path, FAILING)  # idempotent: the same drain, said so
    assert again.returncode == 1 and "already drained by gpuvet" in again.stderr
    assert resumed.show() == (state, reason)

    good = _healthcheck(resumed, tmp_path, HEALTHY)
    assert good.returncode == 0, good.stderr
    state, _ = resumed.show()
    assert "DRAIN" not in state and f"resumed {resumed.node}" in good.stderr


def test_an_admins_drain_is_never_undone(resumed, tmp_path):
    resumed.scontrol("update", f"NodeName={resumed.node}", "State=DRAIN", "Reason=admin: PSU swap ticket 42")
    good = _healthcheck(resumed, tmp_path, HEALTHY)
    assert good.returncode == 0 and "left drained" in good.stderr
    bad = _healthcheck(resumed, tmp_path, FAILING)
    assert bad.returncode == 1 and "drained or down by someone else" in bad.stderr
    state, reason = resumed.show()
    assert "DRAIN" in state and reason == "admin: PSU swap ticket 42"


def test_a_drain_an_older_gpuvet_made_is_still_resumed(resumed, tmp_path):
    # Before actions were named, gpuvet's drain reasons started with "gpuvet:".
    resumed.scontrol("update", f"NodeName={resumed.node}", "State=DRAIN", "Reason=gpuvet: gpu2 gpu.throttle: HW power brake")
    good = _healthcheck(resumed, tmp_path, HEALTHY)
    assert good.returncode == 0 and f"resumed {resumed.node}" in good.stderr
    assert "DRAIN" not in resumed.show()[0]


def test_scontrol_refusing_is_one_clear_line_and_the_health_answer_stands(resumed, tmp_path):
    bad = _healthcheck(resumed, tmp_path, FAILING, "--node", "no-such-node")
    assert bad.returncode == 1
    assert "slurm: no-such-node not drained: scontrol show node refused" in bad.stderr
    assert "Traceback" not in bad.stderr
    assert "DRAIN" not in resumed.show()[0]


def test_health_runs_are_kept_and_listed_as_their_own_kind(resumed, tmp_path):
    _healthcheck(resumed, tmp_path, FAILING)
    _healthcheck(resumed, tmp_path, HEALTHY)
    listed = subprocess.run([sys.executable, "-m", "gpuvet", "history", "--kind", "health", "--json",
                             "--db", str(tmp_path / "runs.sqlite3")], check=False, capture_output=True, text=True, timeout=60)
    runs = json.loads(listed.stdout)
    assert [(r["kind"], r["verdict"]) for r in runs] == [("health", "pass"), ("health", "fail")]


def test_cluster_mode_runs_under_srun_on_the_slurm_node(resumed, tmp_path):
    out = tmp_path / "cluster.json"
    done = subprocess.run(["srun", "--nodes=1", "--ntasks-per-node=1", "--kill-on-bad-exit=0", sys.executable, "-m",
                           "gpuvet.cluster", "--quick", "--device", "cpu", "--no-save", "--no-cross", "-q",
                           "--out", str(out)], env=resumed.env, check=False, capture_output=True, text=True, timeout=240,
                          stdin=subprocess.DEVNULL)
    assert done.returncode in (0, 1), done.stderr[-2000:]
    record = json.loads(out.read_text())
    assert record["launcher"]["kind"] == "slurm" and record["cluster_id"].startswith("slurm-")
    assert [row["name"] for row in record["summary"]["rows"]] == [resumed.node]


def test_slurmd_itself_runs_the_health_check_and_drains_then_resumes(resumed, tmp_path):
    """HealthCheckProgram in slurm.conf, run by slurmd every 2 s with its bare environment (only
    SLURMD_NODENAME): a stand-in program sets what this test's Slurm and checkout need, then
    execs the wrapper as an admin's slurm.conf would."""
    program = tmp_path / "healthcheck"
    capture = tmp_path / "capture.txt"
    env = {"PYTHONPATH": os.environ.get("PYTHONPATH", ""), "GPUVET": f"{sys.executable} -m gpuvet",
           "GPUVET_DB": str(tmp_path / "runs.sqlite3"), "GPUVET_HEALTH_OPTS": f"--from {capture}",
           "SLURM_CONF": str(resumed.conf)}
    program.write_text("#!/bin/sh\n" + "".join(f"export {k}='{v}'\n" for k, v in env.items()) + f"exec sh {WRAPPER}\n")
    program.chmod(0o755)
    _replace(capture, FAILING)
    plain = resumed.conf.read_text()
    resumed.conf.write_text(plain + f"HealthCheckProgram={program}\nHealthCheckInterval=2\nHealthCheckNodeState=ANY\n")
    try:
        resumed.scontrol("reconfigure")
        resumed.wait_for(lambda: "DRAIN" in resumed.show()[0], "slurmd's health check to drain the node")
        assert resumed.show()[1].startswith("gpu.throttle ask_provider gpu2")
        _replace(capture, HEALTHY)  # the GPU is fixed
        resumed.wait_for(lambda: "DRAIN" not in resumed.show()[0], "slurmd's health check to resume the node")
    finally:
        resumed.conf.write_text(plain)
        resumed.scontrol("reconfigure")


def _replace(target: Path, source: Path) -> None:
    """Whole or not at all: slurmd may be reading `target` at that moment."""
    partial = target.with_suffix(".partial")
    partial.write_bytes(source.read_bytes())
    os.replace(partial, target)


def test_slurms_own_down_reason_is_left_alone(resumed, tmp_path):
    """A node Slurm (or an admin) set DOWN with a reason: draining it would replace that reason,
    and gpuvet's later resume would bring back a node it did not take out."""
    resumed.scontrol("update", f"NodeName={resumed.node}", "State=DOWN", "Reason=Kill task failed")
    try:
        bad = _healthcheck(resumed, tmp_path, FAILING)
        assert bad.returncode == 1 and "left as is" in bad.stderr
        good = _healthcheck(resumed, tmp_path, HEALTHY)
        assert good.returncode == 0
        state, reason = resumed.show()
        assert state.startswith("DOWN") and reason == "Kill task failed"
    finally:
        resumed.scontrol("update", f"NodeName={resumed.node}", "State=RESUME")
        resumed.wait_for(lambda: resumed.show()[0].startswith("IDLE"), "the node back to idle")


# -- slurmd's SLURM_NODE_IS_HEALTHY (26.05.2+) and real faults' actions --------------------------

XID79_ON_GPU3 = FIXTURES / "edited" / "dmesg-tesla-k40m-xid79-390.30-edited-bus-86-as-h100-gpu3.txt"
SXID_FABRIC = FIXTURES / "kernel_log" / "dmesg-iso-sxid-12028-nvswitch.txt"


def _counting_scontrol(tmp_path: Path) -> tuple[str, Path]:
    """A PATH whose scontrol logs each call, then runs the real one: how many questions gpuvet asked."""
    folder, log = tmp_path / "bin", tmp_path / "scontrol-calls.log"
    folder.mkdir()
    shim = folder / "scontrol"
    shim.write_text(f'#!/bin/sh\necho "$*" >> {log}\nexec {_which("scontrol")} "$@"\n')
    shim.chmod(0o755)
    return f"{folder}:{os.environ['PATH']}", log


def _healthcheck_as_slurmd(slurm: LocalSlurm, tmp_path: Path, captures: list[Path], node_is_healthy: str | None,
                           textfile: Path | None = None) -> tuple[subprocess.CompletedProcess, list[str]]:
    """The wrapper as a 26.05.2+ slurmd runs it: SLURM_NODE_IS_HEALTHY set (None: unset, as 22.05 does)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    path, log = _counting_scontrol(tmp_path)
    env = {"PATH": path, "SLURM_CONF": str(slurm.conf), "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
           "GPUVET": f"{sys.executable} -m gpuvet", "GPUVET_DB": str(tmp_path / "runs.sqlite3"),
           "SLURMD_NODENAME": slurm.node, "GPUVET_HEALTH_OPTS": " ".join(f"--from {c}" for c in captures)}
    if node_is_healthy is not None:
        env["SLURM_NODE_IS_HEALTHY"] = node_is_healthy
    if textfile is not None:
        env["GPUVET_TEXTFILE"] = str(textfile)
    done = subprocess.run(["sh", str(WRAPPER)], env=env, check=False, capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    return done, log.read_text().splitlines() if log.exists() else []


def test_a_node_slurmd_calls_in_service_costs_no_scontrol_call_when_healthy(resumed, tmp_path):
    done, calls = _healthcheck_as_slurmd(resumed, tmp_path, [HEALTHY], "yes")
    assert done.returncode == 0 and calls == [] and "in service (slurmd says so): nothing to do" in done.stderr
    assert resumed.show()[0].startswith("IDLE")


def test_xid79_drains_with_reboot_node_first_in_one_scontrol_call_and_writes_the_textfile(resumed, tmp_path):
    """A real Xid 79 (gpu3's bus edited in) beside gpu2's power brake, the node in service: one
    call, the drain; the reason's first 20 characters say what to do; the textfile says it too."""
    folder = tmp_path / "text file dir"  # a space: the wrapper quotes it
    folder.mkdir()
    done, calls = _healthcheck_as_slurmd(resumed, tmp_path, [FAILING, XID79_ON_GPU3], "yes", textfile=folder)
    assert done.returncode == 1 and len(calls) == 1 and calls[0].startswith(f"update NodeName={resumed.node} State=DRAIN")
    state, reason = resumed.show()
    assert "DRAIN" in state and reason[:20] == "gpu.xid reboot_node " and reason.endswith("(gpuvet)")
    assert 'gpuvet_health_action{action="reboot_node"} 1.0' in (folder / "gpuvet.prom").read_text()


def test_a_node_slurmd_calls_out_of_service_is_read_first_and_resumed_only_if_gpuvet_drained_it(resumed, tmp_path):
    bad, _ = _healthcheck_as_slurmd(resumed, tmp_path / "a", [SXID_FABRIC], "yes")  # a fabric error (SXid 12028)
    assert bad.returncode == 1 and resumed.show()[1].startswith("gpu.xid reboot_node nvswitch")
    good, calls = _healthcheck_as_slurmd(resumed, tmp_path / "b", [HEALTHY], "no")
    assert good.returncode == 0 and [c.split()[:2] for c in calls] == [["show", "node"], ["update", f"NodeName={resumed.node}"]]
    assert "DRAIN" not in resumed.show()[0]
    resumed.scontrol("update", f"NodeName={resumed.node}", "State=DRAIN", "Reason=admin: PSU swap ticket 42")
    kept, _ = _healthcheck_as_slurmd(resumed, tmp_path / "c", [HEALTHY], "no")
    assert "left drained" in kept.stderr and resumed.show()[1] == "admin: PSU swap ticket 42"


def test_this_slurmd_says_nothing_and_the_check_reads_the_node(resumed, tmp_path):
    """Debian's slurmd (22.05) sets no SLURM_NODE_IS_HEALTHY: gpuvet reads the node's state first."""
    done, calls = _healthcheck_as_slurmd(resumed, tmp_path, [HEALTHY], None)
    assert done.returncode == 0 and calls == [f"show node {resumed.node} -o"]
