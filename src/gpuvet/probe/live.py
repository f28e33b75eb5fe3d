"""The live machine's facts: NVML + sysfs for the GPUs, /proc and /sys for the host, a
subprocess for the software stack. Each probe runs isolated, with its own time limit; a probe
that breaks or hangs is recorded in `machine.probe_errors` and the others still report.
"""

from __future__ import annotations

import socket
import threading
from typing import Any, Callable

from ..facts import Driver, Gpu, Host, Machine, Topology
from . import host as host_probe
from . import audit, fabric_manager, kernel_log, network, nvml, proc_version, stack, sysfs_pcie


# Reading the kernel log is a file read or one subprocess; a journal of a long boot can take a
# second or two, a hung journald longer: past this, gpu.xid says it could not be read in time.
KERNEL_LOG_DEADLINE_S = 5.0


def collect(workdir: str | None = None, steal_window_s: float = 0.5, import_torch: bool | None = None) -> Machine:
    """Facts of this machine. `import_torch=None` imports torch (in a subprocess) only when a GPU
    is present: without one, its arch list is empty anyway and the import costs seconds."""
    replayed = nvml.replayed_from()
    # GPUVET_NVML_REPLAY: the GPU facts are a capture's, so the record must not call them live.
    machine = Machine(source=f"replay: {replayed}" if replayed else "live")
    if replayed:
        machine.captures.append({"path": replayed, "kind": "nvml-replay"})
    host_job = _Isolated("host", lambda: _host(workdir, steal_window_s), timeout_s=steal_window_s + 10)
    audit_job = _Isolated("audit", audit.collect_audit, timeout_s=15)
    kernel_job = _Isolated("kernel_log", lambda: kernel_log.read_kernel_log(KERNEL_LOG_DEADLINE_S),
                           timeout_s=KERNEL_LOG_DEADLINE_S + 2)
    gpu_facts = _Isolated("gpu", _gpus, timeout_s=30).result(machine)
    if gpu_facts is None:
        machine.gpu_error = f"GPU probe failed: {machine.probe_errors.get('gpu')}"
    else:
        machine.driver, machine.gpus, machine.topology, machine.gpu_error = gpu_facts
    want_torch = bool(machine.gpus) if import_torch is None else import_torch
    stack_job = _Isolated("stack", lambda: stack.collect_stack(import_torch=want_torch, timeout_s=30), timeout_s=45)
    machine.host = host_job.result(machine)
    machine.stack = stack_job.result(machine)
    machine.audit = audit_job.result(machine)
    machine.kernel_log = kernel_job.result(machine)
    return machine


# `gpuvet health` must answer within node-problem-detector's default 5 s plugin timeout on an
# 8-GPU node, Python's start-up included: each probe gets its own deadline, and one that passes
# it is abandoned (its thread left behind) and recorded in `machine.probe_errors`.
# The probes run at once: the answer takes the longest of them, not their sum.
HEALTH_BUDGETS_S = {"gpu": 3.0, "kernel_log": 2.0}
_KERNEL_LOG_MARGIN_S = 0.5  # the reader stops itself this much before its thread is abandoned


def collect_passive(budgets_s: dict[str, float] | None = None,
                    read_gpus: Callable[[], tuple[Driver, list[Gpu], Topology | None, str | None]] | None = None) -> Machine:
    """The GPU facts `gpuvet health` judges, read without load and without writing anything:
    NVML, the PCI bus in sysfs, the kernel module's version, the kernel log's NVIDIA events; each
    probe under its deadline. `read_gpus` replaces the NVML + sysfs reader (tests: a reader that
    hangs like a dying GPU)."""
    budgets = {**HEALTH_BUDGETS_S, **(budgets_s or {})}
    machine = Machine(source="live", host=Host(hostname=socket.gethostname()))  # names the node in the history
    log_budget = budgets["kernel_log"]
    kernel_job = _Isolated("kernel_log", lambda: kernel_log.read_kernel_log(max(log_budget - _KERNEL_LOG_MARGIN_S, 0.1)),
                           timeout_s=log_budget)
    gpu_facts = _Isolated("gpu", read_gpus or _gpus, timeout_s=budgets["gpu"]).result(machine)
    if gpu_facts is None:
        machine.gpu_error = f"GPU probe failed: {machine.probe_errors.get('gpu')}"
    else:
        machine.driver, machine.gpus, machine.topology, machine.gpu_error = gpu_facts
    machine.kernel_log = kernel_job.result(machine)
    return machine


def _host(workdir: str | None, steal_window_s: float) -> Host:
    host = host_probe.collect_host(workdir, steal_window_s)
    host.nics = network.collect_nics()
    host.rdma = network.collect_rdma()
    return host


def _gpus() -> tuple[Driver, list[Gpu], Topology | None, str | None]:
    driver, topology = Driver(), None
    gpus: list[Gpu] = []
    error = nvml.init_error()
    if error is None:
        try:
            driver, gpus, topology, error = nvml.collect()
        finally:
            nvml.shutdown()
    if nvml.replayed_from():
        return driver, gpus, topology, error  # this machine's sysfs and kernel module are not the capture's
    driver.kernel_module_version = proc_version.read_kernel_module_version()
    _add_sysfs(gpus, error)
    if any(g.fabric is not None for g in gpus):  # an NVSwitch system: its fabric manager must run
        driver.fabric_manager_state, driver.fabric_manager_version = fabric_manager.read_state()
    return driver, gpus, topology, error


def _add_sysfs(gpus: list[Gpu], nvml_error: str | None) -> None:
    """The host's own view of each GPU's link and driver; also GPUs NVML cannot see (vfio, nouveau)."""
    by_bus = {g.pcie.bus_id: g for g in gpus if g.pcie.bus_id}
    for bus in sysfs_pcie.nvidia_gpu_bus_ids():
        gpu = by_bus.get(bus)
        if gpu is None:
            gpu = Gpu(index=len(gpus))
            gpu.pcie.bus_id = bus
            gpu.unavailable["name"] = f"NVML does not see this GPU ({nvml_error or 'not managed by the nvidia driver'})"
            gpus.append(gpu)
        link = sysfs_pcie.read_link(bus)
        if link is not None:
            gpu.pcie.readings.append(link)
        gpu.pcie.kernel_driver = sysfs_pcie.kernel_driver(bus)
        gpu.pcie.aer_counts = sysfs_pcie.aer_counts(bus)


class _Isolated:
    """Runs `fn` in a daemon thread so a hung probe can be abandoned at its deadline."""

    def __init__(self, name: str, fn: Callable[[], Any], timeout_s: float):
        self.name, self.timeout_s = name, timeout_s
        self.value: Any = None
        self.error: str | None = None
        self.thread = threading.Thread(target=self._run, args=(fn,), name=f"gpuvet-{name}", daemon=True)
        self.thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.value = fn()
        except Exception as err:
            self.error = f"{type(err).__name__}: {err}"

    def result(self, machine: Machine) -> Any:
        self.thread.join(self.timeout_s)
        if self.thread.is_alive():
            machine.probe_errors[self.name] = f"timed out after {self.timeout_s:g} s"
            return None
        if self.error:
            machine.probe_errors[self.name] = self.error
        return self.value

