"""The set-up a new user runs first: scripts/install-test-packages on a machine missing a
package, as root (no sudo) and as a user (through sudo), with stand-ins for dpkg, apt-get, sudo,
id and systemctl on PATH, so the install branch runs for real without touching the machine; and
the suite's Ctrl-C tests started the way `nohup ./scripts/test &` starts them (SIGINT ignored)."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
SCRIPT = ROOT / "scripts" / "install-test-packages"


def _stand_ins(tmp_path: Path, uid: int, missing: str) -> tuple[Path, dict]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    tools = {
        # dpkg -s NAME: installed unless it is the missing one
        # dpkg -L NAME: the files a package brings, its systemd unit among them (prometheus's)
        "dpkg": (f'[ "$1" = "-L" ] && {{ echo /usr/bin/$2; echo /lib/systemd/system/$2.service; exit 0; }}\n'
                 f'[ "$2" = "{missing}" ] && exit 1; exit 0'),
        # apt-get install: no service may start meanwhile, so policy-rc.d must say no (101)
        "apt-get": (f'echo "apt-get $* DEBIAN_FRONTEND=${{DEBIAN_FRONTEND:-}} uid=${{FAKE_UID:-{uid}}}" >> {log}\n'
                    f'[ "$1" = "install" ] && {{ "$GPUVET_POLICY_RC_D" prometheus start; echo "policy-rc.d: $?" >> {log}; }}; true'),
        "systemctl": f'echo "systemctl $* uid=${{FAKE_UID:-{uid}}}" >> {log}',
        "id": f'[ "$1" = "-u" ] && echo "${{FAKE_UID:-{uid}}}"',
        "sudo": f'echo "sudo $*" >> {log}; FAKE_UID=0 exec "$@"',
    }
    for name, body in tools.items():
        path = bin_dir / name
        path.write_text(f"#!/bin/bash\n{body}\n")
        path.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin", "GPUVET_POLICY_RC_D": str(tmp_path / "policy-rc.d")}
    env.pop("DEBIAN_FRONTEND", None)
    return log, env


@pytest.mark.parametrize("uid", [0, 1000], ids=["root", "user"])
def test_a_missing_package_is_installed_as_root_and_as_a_user(tmp_path, uid):
    log, env = _stand_ins(tmp_path, uid, missing="fio")
    done = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    calls = log.read_text().splitlines()
    installs = [c for c in calls if c.startswith("apt-get install")]
    assert installs == ["apt-get install -y -qq --no-install-recommends fio DEBIAN_FRONTEND=noninteractive uid=0"]
    assert any(c.startswith("apt-get update") for c in calls)
    assert any(c.startswith("sudo ") for c in calls) == (uid != 0)


def test_the_services_it_installs_neither_start_nor_start_at_boot(tmp_path):
    """Prometheus would listen on :9090 on every interface of a rented VM: the install runs with
    a policy-rc.d that refuses every start, and each new package's unit is disabled afterwards."""
    log, env = _stand_ins(tmp_path, 0, missing="prometheus")
    done = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    calls = log.read_text().splitlines()
    assert "policy-rc.d: 101" in calls  # what invoke-rc.d asks while apt-get installs: refused
    assert "systemctl disable --quiet prometheus.service uid=0" in calls
    assert not (tmp_path / "policy-rc.d").exists()  # its own policy is removed once done


def test_a_policy_the_machine_already_has_is_kept(tmp_path):
    log, env = _stand_ins(tmp_path, 0, missing="prometheus")
    own = tmp_path / "policy-rc.d"
    own.write_text("#!/bin/sh\nexit 101\n")
    own.chmod(0o755)
    done = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert own.read_text() == "#!/bin/sh\nexit 101\n"


def test_nothing_is_installed_when_every_package_is_there(tmp_path):
    log, env = _stand_ins(tmp_path, 0, missing="none")
    done = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert not log.exists()


CTRL_C_TESTS = ["tests/test_bench_session.py::test_ctrl_c_stops_gpuvet_bench_at_once_and_leaves_no_worker",
                "tests/test_bench_session.py::test_ctrl_c_the_moment_the_worker_is_forked_still_ends_it",
                "tests/test_interrupted_runs.py::test_signals_wait_while_a_worker_process_starts",
                "tests/test_interrupted_runs.py::test_ctrl_c_during_cleanup_waits_until_every_file_is_gone"]


def _as_a_background_job() -> None:
    """What a shell does to `./scripts/test &`: SIGINT ignored, inherited by everything it starts."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def test_the_ctrl_c_tests_pass_when_the_suite_runs_in_the_background():
    done = subprocess.run([sys.executable, "-m", "pytest", "-o", "addopts=", "-p", "no:cacheprovider", *CTRL_C_TESTS],
                          cwd=ROOT, preexec_fn=_as_a_background_job, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "5 passed" in done.stdout


def test_the_test_command_hands_pytest_a_working_ctrl_c():
    """scripts/test resets SIGINT for pytest itself (env --default-signal), whatever started it."""
    done = subprocess.run(["env", "--default-signal=INT", sys.executable, "-c",
                           "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"],
                          preexec_fn=_as_a_background_job, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "True", done.stderr
    assert 'env --default-signal=INT .venv-test/bin/python -m pytest' in (ROOT / "scripts" / "test").read_text()
