"""The software-stack probe (python, torch, nvcc, CUDA home) and the kernel-module version files."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
import textwrap
from pathlib import Path

import pytest

from gpuvet.probe import stack as stack_probe
from gpuvet.probe.proc_version import (
    looks_like_proc_version,
    parse_kernel_module_version,
    read_kernel_module_version,
)
from gpuvet.probe.stack import collect_stack, parse_nvcc_version, parse_torch_version_py

FIXTURES = Path(__file__).parent / "fixtures"
PROC = FIXTURES / "proc_sysfs"
posix_only = pytest.mark.skipif(os.name != "posix", reason="uses /bin/sh scripts")

NVCC_12_4 = """nvcc: NVIDIA (R) Cuda compiler driver
Copyright (c) 2005-2024 NVIDIA Corporation
Built on Thu_Mar_28_02:18:24_PDT_2024
Cuda compilation tools, release 12.4, V12.4.131
Build cuda_12.4.r12.4/compiler.34097967_0
"""


# -- pure parsers ----------------------------------------------------------------------------

def test_nvcc_version_full_and_release_only():
    assert parse_nvcc_version(NVCC_12_4) == "12.4.131"
    assert parse_nvcc_version("Cuda compilation tools, release 11.8") == "11.8"
    assert parse_nvcc_version("bash: nvcc: command not found") is None


def test_torch_version_py_literals():
    text = textwrap.dedent("""\
        from typing import Optional

        __all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip']
        __version__ = '2.6.0+cu124'
        debug = False
        cuda: Optional[str] = '12.4'
        git_version = '2236df1770800ffea5697b11b0bb0d910b2e59e1'
        hip: Optional[str] = None
    """)
    assert parse_torch_version_py(text) == {"version": "2.6.0+cu124", "cuda": "12.4", "hip": None}


def test_torch_version_py_never_runs_code():
    text = "import os\n__version__ = os.getenv('HOME')\ncuda = '12.1'\n"
    assert parse_torch_version_py(text) == {"version": None, "cuda": "12.1", "hip": None}
    assert parse_torch_version_py("__version__ = (") == {"version": None, "cuda": None, "hip": None}


# -- kernel module version -------------------------------------------------------------------

def test_proc_version_stale_module_versus_fixed():
    stale = (PROC / "proc-driver-nvidia-version-470.103.01-stale-loaded-module.txt").read_text()
    fixed = (PROC / "proc-driver-nvidia-version-470.63.01.txt").read_text()
    assert parse_kernel_module_version(stale) == "470.103.01"
    assert parse_kernel_module_version(fixed) == "470.63.01"


def test_sys_module_bare_version():
    assert parse_kernel_module_version((PROC / "sys-module-nvidia-version-470.103.01.txt").read_text()) == "470.103.01"


def test_open_kernel_module_line():
    # The open-module form (reference 3.2); "x86_64" must not be taken for the version.
    text = (
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  575.57.08  Release Build  "
        "(dvs-builder@U16-I3-B03-4-3)  Wed May 21 23:42:31 UTC 2025\n"
        "GCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)\n"
    )
    assert parse_kernel_module_version(text) == "575.57.08"
    assert looks_like_proc_version(text)


def test_not_a_version_file():
    assert parse_kernel_module_version("Failed to initialize NVML: Driver/library version mismatch\n") is None
    assert parse_kernel_module_version("") is None


def test_read_kernel_module_version_prefers_proc_and_tolerates_absence(tmp_path):
    proc = tmp_path / "version"
    proc.write_text((PROC / "proc-driver-nvidia-version-470.63.01.txt").read_text())
    sys_module = tmp_path / "sys-version"
    sys_module.write_text("470.103.01\n")
    missing = tmp_path / "absent"
    assert read_kernel_module_version((missing, proc, sys_module)) == "470.63.01"
    assert read_kernel_module_version((missing, sys_module)) == "470.103.01"
    assert read_kernel_module_version((missing,)) is None


@pytest.mark.parametrize("path", sorted(p for p in FIXTURES.rglob("*") if p.is_file()),
                         ids=lambda p: str(p.relative_to(FIXTURES)))
def test_looks_like_proc_version_claims_only_proc_sysfs(path):
    assert looks_like_proc_version(path.read_text(errors="replace")) == (path.parent.name == "proc_sysfs")


# -- collect_stack ---------------------------------------------------------------------------

def installed_torch_version() -> str | None:
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def test_without_import_torch_is_not_loaded_and_agrees_with_metadata():
    torch_was_loaded = "torch" in sys.modules
    stack = collect_stack(import_torch=False)
    assert ("torch" in sys.modules) == torch_was_loaded
    assert stack.python == platform.python_version()
    expected = installed_torch_version()
    assert stack.torch.installed == (expected is not None)
    assert stack.torch.version == expected
    assert stack.torch.cuda_available is None and stack.torch.arch_list is None
    assert stack.torch.error is None


@pytest.mark.skipif(installed_torch_version() is None, reason="torch is not installed")
def test_real_torch_in_a_child_interpreter():
    stack = collect_stack(import_torch=True)
    torch = stack.torch
    assert torch.error is None
    assert torch.version == installed_torch_version()
    assert isinstance(torch.cuda_available, bool)
    assert isinstance(torch.device_count, int)
    assert isinstance(torch.arch_list, list)
    if not torch.cuda_available:
        assert torch.arch_list == []


def write_fake_torch(root: Path, init_body: str) -> None:
    package = root / "torch"
    package.mkdir()
    (package / "version.py").write_text(
        "from typing import Optional\n__version__ = '9.9.9+fake'\ncuda: Optional[str] = '12.8'\nhip = None\n"
    )
    (package / "__init__.py").write_text(textwrap.dedent(init_body))


@pytest.fixture
def fake_torch_path(tmp_path, monkeypatch):
    """A directory that shadows any real torch, here (sys.path) and in child interpreters (PYTHONPATH)."""
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return tmp_path


def test_version_is_read_without_running_torch(fake_torch_path):
    marker = fake_torch_path / "torch-was-executed"
    write_fake_torch(fake_torch_path, f"open({str(marker)!r}, 'w').close()\n")
    stack = collect_stack(import_torch=False)
    assert (stack.torch.installed, stack.torch.version, stack.torch.cuda) == (True, "9.9.9+fake", "12.8")
    assert not marker.exists()
    assert "torch" not in sys.modules


def test_child_reports_what_torch_says(fake_torch_path):
    write_fake_torch(fake_torch_path, """\
        import types
        from . import version
        __version__ = version.__version__
        cuda = types.SimpleNamespace(
            is_available=lambda: True,
            device_count=lambda: 2,
            get_arch_list=lambda: ["sm_80", "sm_90", "compute_90"],
        )
    """)
    torch = collect_stack(import_torch=True).torch
    assert torch.error is None
    assert (torch.version, torch.cuda, torch.hip) == ("9.9.9+fake", "12.8", None)
    assert (torch.cuda_available, torch.device_count) == (True, 2)
    assert torch.arch_list == ["sm_80", "sm_90", "compute_90"]


def test_broken_torch_import_gives_one_line(fake_torch_path):
    write_fake_torch(fake_torch_path, """\
        raise ImportError("libcudart.so.12: cannot open shared object file: No such file or directory")
    """)
    torch = collect_stack(import_torch=True).torch
    assert torch.installed is True and torch.version == "9.9.9+fake"  # still known from version.py
    assert torch.error == (
        "import torch failed: ImportError: libcudart.so.12: cannot open shared object file: No such file or directory"
    )


def test_failing_cuda_query_is_reported(fake_torch_path):
    write_fake_torch(fake_torch_path, """\
        from . import version
        __version__ = version.__version__
        class cuda:
            @staticmethod
            def is_available():
                raise RuntimeError("CUDA driver initialization failed")
    """)
    torch = collect_stack(import_torch=True).torch
    assert torch.error == "torch.cuda query failed: RuntimeError: CUDA driver initialization failed"
    assert torch.cuda_available is None


def fake_interpreter(tmp_path: Path, body: str) -> str:
    script = tmp_path / "python"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return str(script)


@posix_only
def test_interpreter_that_cannot_import_torch(tmp_path, fake_torch_path):
    write_fake_torch(fake_torch_path, "")
    python = fake_interpreter(tmp_path, (
        "echo 'Traceback (most recent call last):' >&2\n"
        "echo \"ModuleNotFoundError: No module named 'torch'\" >&2\n"
        "exit 1\n"
    ))
    torch = collect_stack(import_torch=True, python=python).torch
    assert torch.error == "import torch failed: ModuleNotFoundError: No module named 'torch'"
    assert "\n" not in torch.error


@posix_only
def test_hanging_torch_is_killed_with_its_children(tmp_path, fake_torch_path):
    write_fake_torch(fake_torch_path, "")
    # A helper that keeps stdout open: only killing the whole process group ends the wait.
    python = fake_interpreter(tmp_path, "sleep 60 &\nsleep 60\n")
    torch = collect_stack(import_torch=True, timeout_s=0.3, python=python).torch
    assert torch.error == "timed out after 0.3 s importing torch"


def test_missing_interpreter(tmp_path, fake_torch_path):
    write_fake_torch(fake_torch_path, "")
    torch = collect_stack(import_torch=True, python=str(tmp_path / "no-such-python")).torch
    assert torch.error.startswith("could not run ")


@posix_only
def test_nvcc_from_cuda_home_when_not_on_path(tmp_path, monkeypatch):
    cuda = tmp_path / "cuda-12.4"
    (cuda / "bin").mkdir(parents=True)
    nvcc = cuda / "bin" / "nvcc"
    # Shell built-ins only: PATH is emptied below.
    nvcc.write_text("#!/bin/sh\n" + "".join(f"echo '{line}'\n" for line in NVCC_12_4.splitlines()))
    nvcc.chmod(0o755)
    home = tmp_path / "cuda"
    home.symlink_to(cuda)
    monkeypatch.setattr(stack_probe, "CUDA_HOME", str(home))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("CUDA_MODULE_LOADING", "LAZY")
    stack = collect_stack(import_torch=False)
    assert stack.nvcc_version == "12.4.131"
    assert (stack.cuda_home, stack.cuda_home_target) == (str(home), str(cuda.resolve()))
    assert stack.cuda_module_loading == "LAZY"


def test_no_cuda_toolkit(tmp_path, monkeypatch):
    monkeypatch.setattr(stack_probe, "CUDA_HOME", str(tmp_path / "no-cuda"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    stack = collect_stack(import_torch=False)
    assert stack.nvcc_version is None and "not on PATH" in stack.unavailable["nvcc_version"]
    assert stack.cuda_home is None and "does not exist" in stack.unavailable["cuda_home"]


def test_a_failing_probe_does_not_raise(monkeypatch):
    def broken():
        raise PermissionError("site-packages unreadable")

    monkeypatch.setattr(stack_probe, "find_torch", broken)
    stack = collect_stack(import_torch=False)
    assert stack.unavailable["torch"] == "PermissionError: site-packages unreadable"
    assert stack.python == platform.python_version()
