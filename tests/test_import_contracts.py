"""The layering promises, checked on the real import graph (indirect imports included).

judge/ and report/ decide and render from a record: they must run on a laptop that has no GPU,
no driver and no torch, so nothing they import (directly or through another gpuvet module) may
touch the machine. probe/ reads facts and must never depend on how they are judged or shown.
Each package is imported, every module of it, in a fresh interpreter, and sys.modules is read.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).parent.parent / "src"

# Modules that read or drive the machine: the NVML sampler, the probes, the benchmarks, and the
# libraries that talk to the GPU.
MACHINE = ("gpuvet.probe", "gpuvet.bench", "gpuvet.telemetry", "gpuvet.watch", "gpuvet.cluster",
           "pynvml", "torch")

CONTRACTS = {
    "gpuvet.catalog": ("gpuvet.probe", "gpuvet.bench", "gpuvet.judge", "gpuvet.report", "gpuvet.record", "pynvml", "torch"),
    "gpuvet.judge": MACHINE,
    "gpuvet.report": MACHINE,
    "gpuvet.samples": MACHINE,
    "gpuvet.occupancy": MACHINE + ("gpuvet.judge", "gpuvet.report"),
    "gpuvet.specs": MACHINE + ("gpuvet.judge", "gpuvet.report"),
    "gpuvet.record": MACHINE + ("gpuvet.judge", "gpuvet.report"),
    "gpuvet.probe": ("gpuvet.judge", "gpuvet.report"),
}

_LOADER = """
import importlib, json, pkgutil, sys
root = importlib.import_module(sys.argv[1])
names = [root.__name__]
if hasattr(root, "__path__"):
    names += [m.name for m in pkgutil.walk_packages(root.__path__, root.__name__ + ".")]
for name in (sys.argv[2:] or names):
    importlib.import_module(name)
print(json.dumps({"modules": names, "loaded": sorted(sys.modules)}))
"""


def _load(package: str, *only: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", _LOADER, package, *only], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _forbidden(loaded: list[str], banned: tuple[str, ...]) -> list[str]:
    return [m for m in loaded if any(m == b or m.startswith(b + ".") for b in banned)]


@pytest.mark.parametrize("package", sorted(CONTRACTS))
def test_package_imports_nothing_it_must_not(package):
    banned = CONTRACTS[package]
    result = _load(package)
    if not _forbidden(result["loaded"], banned):
        return
    # Name the culprits: which of the package's own modules pulls the banned ones in.
    culprits = {}
    for name in result["modules"]:
        bad = _forbidden(_load(package, name)["loaded"], banned)
        if bad:
            culprits[name] = sorted({b for b in bad if b.count(".") <= 2})[:6]
    pytest.fail(f"{package} imports what its contract forbids: {culprits}")


def test_the_contract_sees_indirect_imports():
    # The checker itself: gpuvet.telemetry loads pynvml through probe.nvml, never by its own name.
    loaded = _load("gpuvet.telemetry")["loaded"]
    assert "pynvml" in _forbidden(loaded, ("pynvml",))


# The same promises (and the README's whole Layout table) as import-linter contracts in
# pyproject.toml: a static check of every import statement, function-local ones included, which a
# run of the code only sees when the function runs.
def _lint_imports(cwd: Path, src: Path) -> subprocess.CompletedProcess:
    tool = Path(sys.executable).parent / "lint-imports"
    env = {**os.environ, "PYTHONPATH": str(src)}
    return subprocess.run([str(tool), "--config", str(SRC.parent / "pyproject.toml"), "--no-cache"], cwd=cwd,
                          capture_output=True, text=True, env=env, timeout=300)


def test_every_import_keeps_the_layering():
    done = _lint_imports(SRC.parent, SRC)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "BROKEN" not in done.stdout and " KEPT" in done.stdout


def test_a_function_local_import_that_breaks_the_layering_fails(tmp_path):
    # A probe import inside a judge rule: the import contracts of the first test above missed it.
    shutil.copytree(SRC / "gpuvet", tmp_path / "gpuvet", ignore=shutil.ignore_patterns("__pycache__"))
    rule = tmp_path / "gpuvet" / "judge" / "host.py"
    rule.write_text(rule.read_text() + "\n\ndef _reads_the_machine():\n    from ..probe import host\n\n    return host\n")
    done = _lint_imports(tmp_path, tmp_path)
    assert done.returncode != 0
    assert "gpuvet.judge.host -> gpuvet.probe.host" in done.stdout
