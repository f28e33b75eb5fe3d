"""The layering promises, checked on the real import graph (indirect imports included).

judge/ and report/ decide and render from a record: they must run on a laptop that has no GPU,
no driver and no torch, so nothing they import (directly or through another gpuvet module) may
touch the machine. probe/ reads facts and must never depend on how they are judged or shown.
Each package is imported, every module of it, in a fresh interpreter, and sys.modules is read.
"""

from __future__ import annotations

import json
import os
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
