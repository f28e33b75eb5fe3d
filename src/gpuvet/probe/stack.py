"""The software stack a GPU job would run on: Python, torch, the CUDA toolkit.

torch is never imported into gpuvet itself: a broken install can crash or hang on import, and
importing it costs seconds and memory. Its version comes from reading `torch/version.py` as text;
what only a live torch can say (is CUDA usable, which GPU architectures the wheel was built
for) comes from a child interpreter that has a time limit.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from ..facts import Stack, Torch
from . import container_runtime

CUDA_HOME = "/usr/local/cuda"
NVCC_TIMEOUT_S = 10.0

_TORCH_RESULT = "GPUVET_TORCH_RESULT "  # marks the line the child prints its answer on
_TORCH_IMPORTED = "GPUVET_TORCH_IMPORTED"  # printed once `import torch` worked

# Run in the child interpreter. Kept to the standard library and torch.
_TORCH_SCRIPT = f"""
import json, sys
import torch
print({_TORCH_IMPORTED!r}, flush=True)
info = {{
    "version": str(torch.__version__),
    "cuda": getattr(torch.version, "cuda", None),
    "hip": getattr(torch.version, "hip", None),
}}
try:
    info["cuda_available"] = bool(torch.cuda.is_available())
    info["device_count"] = int(torch.cuda.device_count())
    info["arch_list"] = list(torch.cuda.get_arch_list())  # [] when CUDA is not available
    try:
        nccl = torch.cuda.nccl.version()
        info["nccl"] = ".".join(str(n) for n in nccl) if isinstance(nccl, tuple) else str(nccl)
    except Exception:
        pass  # a CPU build or ROCm: no NCCL
except Exception as exc:
    message = str(exc).strip().splitlines()
    info["cuda_error"] = type(exc).__name__ + (": " + message[0] if message else "")
print({_TORCH_RESULT!r} + json.dumps(info), flush=True)
"""

_NVCC_RELEASE = re.compile(r"release (?P<release>\d+(?:\.\d+)+)(?:, V(?P<full>\d+(?:\.\d+)+))?")


def collect_stack(import_torch: bool = True, timeout_s: float = 30, python: str | None = None) -> Stack:
    """What is installed, never raising: failures land in `unavailable` or `torch.error`.

    `python` is the interpreter torch is imported in (default: the one running gpuvet).
    """
    stack = Stack(python=platform.python_version())
    stack.cuda_module_loading = os.environ.get("CUDA_MODULE_LOADING")
    _guarded(stack, "torch", lambda: _fill_torch(stack, import_torch, timeout_s, python or sys.executable))
    _guarded(stack, "nvcc_version", lambda: _fill_nvcc(stack))
    _guarded(stack, "cuda_home", lambda: _fill_cuda_home(stack, CUDA_HOME))
    _guarded(stack, "peermem_loaded", lambda: setattr(stack, "peermem_loaded", container_runtime.peermem_loaded()))
    _guarded(stack, "container", lambda: setattr(stack, "container", container_runtime.collect()))
    return stack


def _guarded(stack: Stack, field: str, fill) -> None:
    try:
        fill()
    except Exception as exc:  # a probe must not take gpuvet down with it
        stack.unavailable[field] = f"{type(exc).__name__}: {exc}"


# -- torch -----------------------------------------------------------------------------------

def _fill_torch(stack: Stack, import_torch: bool, timeout_s: float, python: str) -> None:
    stack.torch = find_torch()
    if not stack.torch.installed:
        return
    if not import_torch:
        stack.unavailable["torch.cuda_available"] = "not checked: torch was not imported"
        return
    query_torch(stack.torch, python, timeout_s)


def find_torch() -> Torch:
    """Where torch is and which version, from its files alone (torch's code does not run)."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError) as exc:
        return Torch(installed=False, error=f"looking for torch failed: {exc}")
    if spec is None:
        return Torch(installed=False)
    torch = Torch(installed=True)
    version_py = _torch_version_py(spec)
    if version_py is not None:
        fields = parse_torch_version_py(version_py.read_text(errors="replace"))
        torch.version, torch.cuda, torch.hip = fields["version"], fields["cuda"], fields["hip"]
    if torch.version is None:
        torch.version = _distribution_version("torch")
    return torch


def _torch_version_py(spec) -> Path | None:
    for location in spec.submodule_search_locations or ():
        candidate = Path(location) / "version.py"
        if candidate.is_file():
            return candidate
    return None


def _distribution_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def parse_torch_version_py(text: str) -> dict[str, str | None]:
    """`__version__`, `cuda` and `hip` from torch/version.py; literal values only, nothing runs."""
    wanted = {"__version__": "version", "cuda": "cuda", "hip": "hip"}
    found: dict[str, str | None] = dict.fromkeys(wanted.values())
    try:
        module = ast.parse(text)
    except SyntaxError:
        return found
    for node in module.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:  # cuda: Optional[str] = '12.8'
            target, value = node.target, node.value
        else:
            continue
        if isinstance(target, ast.Name) and target.id in wanted:
            literal = _literal(value)
            if literal is None or isinstance(literal, str):
                found[wanted[target.id]] = literal
    return found


def _literal(node: ast.expr):
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def query_torch(torch: Torch, python: str, timeout_s: float) -> None:
    """Ask a child interpreter what torch says at run time; on failure set `torch.error`."""
    try:
        returncode, stdout, stderr, timed_out = _run_isolated([python, "-c", _TORCH_SCRIPT], timeout_s)
    except OSError as exc:
        torch.error = f"could not run {python}: {exc.strerror or exc}"
        return
    imported = _TORCH_IMPORTED in stdout
    if timed_out:
        step = "querying torch.cuda" if imported else "importing torch"
        torch.error = f"timed out after {timeout_s:g} s {step}"
        return
    result = next((line for line in stdout.splitlines() if line.startswith(_TORCH_RESULT)), None)
    if returncode != 0 or result is None:
        torch.error = _failure(imported, returncode, stderr)
        return
    try:
        info = json.loads(result[len(_TORCH_RESULT):])
    except ValueError:
        torch.error = f"the torch probe printed an unreadable result: {result[:80]!r}"
        return
    torch.version = info.get("version") or torch.version
    torch.cuda, torch.hip = info.get("cuda"), info.get("hip")
    torch.cuda_available = info.get("cuda_available")
    torch.device_count = info.get("device_count")
    torch.arch_list = info.get("arch_list")
    torch.nccl = info.get("nccl")
    if info.get("cuda_error"):
        torch.error = f"torch.cuda query failed: {info['cuda_error']}"


def _failure(imported: bool, returncode: int, stderr: str) -> str:
    """One line saying what went wrong in the child."""
    what = "torch failed after import" if imported else "import torch failed"
    last = last_line(stderr)
    if returncode < 0:
        signal_name = _signal_name(-returncode)
        return f"{what}: killed by {signal_name}" + (f" ({last})" if last else "")
    return f"{what}: {last}" if last else f"{what} with exit code {returncode}"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _run_isolated(command: list[str], timeout_s: float) -> tuple[int, str, str, bool]:
    """Run `command` in its own process group; on timeout kill the whole group (torch may have
    started helpers that would keep the pipes open). Returns (returncode, stdout, stderr, timed_out)."""
    own_group = hasattr(os, "killpg")
    with subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        start_new_session=own_group,
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout_s)
            return process.returncode, stdout, stderr, False
        except subprocess.TimeoutExpired:
            if own_group:
                os.killpg(process.pid, signal.SIGKILL)
            else:
                process.kill()
            try:
                stdout, stderr = process.communicate(timeout=5)
            except subprocess.TimeoutExpired:  # a helper left the group and still holds the pipes
                stdout, stderr = "", ""
            return process.returncode, stdout, stderr, True


# -- CUDA toolkit ----------------------------------------------------------------------------

def parse_nvcc_version(text: str) -> str | None:
    """ "Cuda compilation tools, release 12.4, V12.4.131" -> "12.4.131" (or "12.4" without V...)."""
    m = _NVCC_RELEASE.search(text)
    if not m:
        return None
    return m.group("full") or m.group("release")


def find_nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    fallback = os.path.join(CUDA_HOME, "bin", "nvcc")
    return fallback if os.access(fallback, os.X_OK) else None


def _fill_nvcc(stack: Stack) -> None:
    nvcc = find_nvcc()
    if nvcc is None:
        stack.unavailable["nvcc_version"] = f"nvcc is not on PATH nor in {CUDA_HOME}/bin"
        return
    try:
        returncode, stdout, stderr, timed_out = _run_isolated([nvcc, "--version"], NVCC_TIMEOUT_S)
    except OSError as exc:
        stack.unavailable["nvcc_version"] = f"could not run {nvcc}: {exc.strerror or exc}"
        return
    if timed_out:
        stack.unavailable["nvcc_version"] = f"{nvcc} --version timed out after {NVCC_TIMEOUT_S:g} s"
        return
    stack.nvcc_version = parse_nvcc_version(stdout)
    if stack.nvcc_version is None:
        said = last_line(stderr) or last_line(stdout) or f"exit code {returncode}"
        stack.unavailable["nvcc_version"] = f"{nvcc} --version gave no version: {said}"


def _fill_cuda_home(stack: Stack, path: str) -> None:
    if not os.path.exists(path):
        stack.unavailable["cuda_home"] = f"{path} does not exist"
        return
    stack.cuda_home = path
    stack.cuda_home_target = os.path.realpath(path)
    stack.cuda_home_version = read_toolkit_version(stack.cuda_home_target)
    if stack.cuda_home_version is None:
        stack.unavailable["cuda_home_version"] = f"no version.json or version.txt with a version in {stack.cuda_home_target}"


_VERSION_TXT = re.compile(r"CUDA Version\s+(\d+\.\d+(?:\.\d+)?)")


def read_toolkit_version(folder: str) -> str | None:
    """The CUDA toolkit's version from `folder`/version.json ({"cuda": {"version": "12.1.1"}},
    CUDA 11.1 on) or version.txt ("CUDA Version 10.2.89", before); the SDK's third part can be a
    date ("11.8.20220929"), so only major.minor is kept."""
    try:
        with open(os.path.join(folder, "version.json"), encoding="utf-8") as f:
            version = str((json.load(f).get("cuda") or {}).get("version") or "")
    except (OSError, ValueError, AttributeError):
        version = ""
    if not version:
        try:
            with open(os.path.join(folder, "version.txt"), encoding="utf-8") as f:
                m = _VERSION_TXT.search(f.read(4096))
            version = m.group(1) if m else ""
        except OSError:
            version = ""
    m = re.match(r"(\d+)\.(\d+)", version)
    return f"{m.group(1)}.{m.group(2)}" if m else None
