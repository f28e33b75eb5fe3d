"""The set-up a new user runs first: scripts/install-test-packages on a machine missing a
package, as root (no sudo) and as a user (through sudo), with stand-ins for dpkg, apt-get, sudo
and id on PATH, so the install branch runs for real without touching the machine."""

import os
import subprocess
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
        "dpkg": f'[ "$2" = "{missing}" ] && exit 1; exit 0',
        "apt-get": f'echo "apt-get $* DEBIAN_FRONTEND=${{DEBIAN_FRONTEND:-}} uid=${{FAKE_UID:-{uid}}}" >> {log}',
        "id": f'[ "$1" = "-u" ] && echo "${{FAKE_UID:-{uid}}}"',
        "sudo": f'echo "sudo $*" >> {log}; FAKE_UID=0 exec "$@"',
    }
    for name, body in tools.items():
        path = bin_dir / name
        path.write_text(f"#!/bin/bash\n{body}\n")
        path.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}
    env.pop("DEBIAN_FRONTEND", None)
    return log, env


@pytest.mark.parametrize("uid", [0, 1000], ids=["root", "user"])
def test_a_missing_package_is_installed_as_root_and_as_a_user(tmp_path, uid):
    log, env = _stand_ins(tmp_path, uid, missing="fio")
    done = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    calls = log.read_text().splitlines()
    installs = [c for c in calls if c.startswith("apt-get install")]
    assert installs == ["apt-get install -y -qq fio DEBIAN_FRONTEND=noninteractive uid=0"]
    assert any(c.startswith("apt-get update") for c in calls)
    assert any(c.startswith("sudo ") for c in calls) == (uid != 0)


def test_nothing_is_installed_when_every_package_is_there(tmp_path):
    log, env = _stand_ins(tmp_path, 0, missing="none")
    done = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert not log.exists()
