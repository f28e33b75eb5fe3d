"""Where am I: the launcher's environment (torchrun or Slurm), Slurm's compressed host lists, the
command line that starts gpuvet on every node, and the network interface towards rank 0."""

from __future__ import annotations

import hashlib
import os
import re
import socket
import sys
from dataclasses import dataclass, field


class LaunchError(Exception):
    """Not started by a launcher gpuvet understands, or started wrongly; the message says how."""


@dataclass
class Launch:
    kind: str  # "torchrun" or "slurm"
    rank: int
    world_size: int
    master_addr: str
    master_port: int
    agent_store: bool = False  # torchrun's agent hosts the store: no rank starts one
    job_id: str | None = None
    expected_nodes: list[str] = field(default_factory=list)  # host per rank, where the launcher says
    node_name: str | None = None  # this node's name as the launcher knows it (Slurm: SLURMD_NODENAME)
    node_index: int | None = None  # its place in expected_nodes (Slurm: SLURM_NODEID)

    @property
    def cluster_id(self) -> str:
        return self.job_id or f"{self.master_addr}-{self.master_port}"


def expand_hostlist(text: str) -> list[str]:
    """Slurm's compressed host list: "node[01-04,07],gpu-a[1-2]-x" -> node01..node04, node07,
    gpu-a1-x, gpu-a2-x (zero padding kept; several bracket groups multiply), as `scontrol show
    hostnames` reads it (the tests hold it against python-hostlist). Anything else (an unclosed
    bracket, a range that runs backwards, a name with a space or a port) is refused: it would
    otherwise become a rendezvous endpoint no node can reach."""
    if text.count("[") != text.count("]") or re.search(r"\[[^\]]*\[|\][^\[]*\]", text):
        raise LaunchError("unbalanced brackets")
    hosts: list[str] = []
    for item in _split_top_level(text.strip()):
        hosts += _expand_one(item)
    for host in hosts:
        if not HOST_NAME.fullmatch(host):
            raise LaunchError(f"{host!r} is not a host name (letters, digits, '.', '-', '_')")
    if not hosts:
        raise LaunchError("no host in it")
    return hosts


HOST_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")


def _split_top_level(text: str) -> list[str]:
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return [item.strip() for item in items if item.strip()]


def _expand_one(item: str) -> list[str]:
    match = re.search(r"\[([^\]]*)\]", item)
    if not match:
        return [item]
    head, tail = item[:match.start()], item[match.end():]
    return [head + value + rest for value in _range_values(match.group(1)) for rest in _expand_one(tail)]


def _range_values(spec: str) -> list[str]:
    values = []
    for part in spec.split(","):
        low, dash, high = part.strip().partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise LaunchError(f"cannot read the host range [{spec}]")
        if not dash:
            values.append(low)
            continue
        if int(low) > int(high):
            raise LaunchError(f"the host range [{spec}] runs backwards")
        width = len(low) if low.startswith("0") else 0
        values += [str(n).zfill(width) for n in range(int(low), int(high) + 1)]
    return values


def launch_from_env(env: dict[str, str] | os._Environ = os.environ, port: int | None = None) -> Launch:
    """The rank, world size and master from torchrun's or Slurm's variables."""
    if "RANK" in env and "WORLD_SIZE" in env:
        return _torchrun_launch(env, port)
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        return _slurm_launch(env, port)
    raise LaunchError("not started by torchrun or srun (no RANK/WORLD_SIZE or SLURM_PROCID/SLURM_NTASKS); "
                      f"start it on every node with:\n  {print_launch(env)}")


def _torchrun_launch(env: dict[str, str] | os._Environ, port: int | None) -> Launch:
    if int(env.get("LOCAL_WORLD_SIZE", "1")) > 1:
        raise LaunchError(f"one gpuvet process per node vets all its GPUs: use --nproc-per-node 1 "
                          f"(this node has {env['LOCAL_WORLD_SIZE']})")
    if "MASTER_ADDR" not in env or "MASTER_PORT" not in env:
        raise LaunchError("torchrun did not set MASTER_ADDR and MASTER_PORT")
    run_id = env.get("TORCHELASTIC_RUN_ID")
    attempt = env.get("TORCHELASTIC_RESTART_COUNT", "0")
    return Launch("torchrun", int(env["RANK"]), int(env["WORLD_SIZE"]), env["MASTER_ADDR"], port or int(env["MASTER_PORT"]),
                  agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
                  job_id=f"{run_id}-{attempt}" if run_id else None)


def _slurm_launch(env: dict[str, str] | os._Environ, port: int | None) -> Launch:
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
    hosts = expand_hostlist(nodelist) if nodelist else []
    world_size = int(env["SLURM_NTASKS"])
    if hosts and world_size > len(hosts):
        raise LaunchError(f"{world_size} tasks on {len(hosts)} nodes: one gpuvet process per node vets all its GPUs; "
                          "use srun --ntasks-per-node=1")
    master = env.get("MASTER_ADDR") or (hosts[0] if hosts else None)
    if not master:
        raise LaunchError("no SLURM_JOB_NODELIST and no MASTER_ADDR: cannot tell which node is rank 0")
    job = env.get("SLURM_JOB_ID")
    if port is None:
        port = int(env["MASTER_PORT"]) if env.get("MASTER_PORT") else 20000 + (int(job) % 20000 if job and job.isdigit() else 0)
    step = env.get("SLURM_STEP_ID")
    index = env.get("SLURM_NODEID")
    return Launch("slurm", int(env["SLURM_PROCID"]), world_size, master, port,
                  job_id=f"slurm-{job}" + (f".{step}" if step else "") if job else None,
                  expected_nodes=hosts if len(hosts) == world_size else [],
                  node_name=env.get("SLURMD_NODENAME") or None, node_index=int(index) if index and index.isdigit() else None)


RDZV_PORT = 29400


def print_launch(env: dict[str, str] | os._Environ = os.environ, options: list[str] | None = None,
                 python: str | None = None, nodes: list[str] | None = None, join_timeout_s: float = 300.0,
                 expect_nodes: int | None = None, run_id: str | None = None) -> str:
    """The command line that starts gpuvet on every node from here, with the run options given
    (`options`, already quoted): srun inside a Slurm allocation, else torchrun, with the node count
    and first host from `nodes` or `expect_nodes` (placeholders without).

    The line is the same wherever it is printed (its --rdzv-id comes from `run_id`, or from the
    nodes), so that nodes that each print their own still meet. torchrun's rendezvous is elastic
    (`--nnodes 1:N`): it starts as soon as all N nodes are there, or `last_call_timeout` after the
    last arrival with the nodes that came; a fixed --nnodes would instead end in a rendezvous
    traceback before gpuvet runs, and nobody would be named. Once gpuvet runs, rank 0 closes the
    rendezvous (torchrun.py): a late node is refused instead of restarting everyone. gpuvet is told
    how many nodes to expect (--expect-nodes, or --nodes), so that the ones that never came are
    reported missing."""
    extra = list(options or [])
    out = [] if "--out" in extra else ["--out", "gpuvet-cluster" + (f"-{env['SLURM_JOB_ID']}" if env.get("SLURM_JOB_ID") else "")
                                        + ".json"]
    job = env.get("SLURM_JOB_ID")
    if job:
        count = env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES")
        if not count and env.get("SLURM_JOB_NODELIST"):
            count = str(len(expand_hostlist(env["SLURM_JOB_NODELIST"])))
        line = [f"srun --nodes={count or '<NODES>'} --ntasks-per-node=1 --kill-on-bad-exit=0 {python or sys.executable} "
                "-m gpuvet.cluster"]
        return " ".join(line + extra + out)
    count = str(len(nodes)) if nodes else str(expect_nodes) if expect_nodes else "<NUMBER_OF_NODES>"
    first = nodes[0] if nodes else "<FIRST_NODE_HOST>"
    wait = int(join_timeout_s)
    rdzv_id = run_id or "gpuvet-" + hashlib.sha256(" ".join([first, count, *(nodes or [])]).encode()).hexdigest()[:10]
    # join_timeout: how long a node waits for the rendezvous to complete, which is last_call_timeout
    # after the last arrival; it leaves the nodes `wait` seconds more to come one after another.
    line = [f"{torchrun_command(python)} --nnodes 1:{count} --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint {first}:{RDZV_PORT} "
            f"--rdzv-id {rdzv_id} --rdzv-conf join_timeout={2 * wait + 60},last_call_timeout={wait} "
            "--max-restarts 0 -m gpuvet.cluster"]
    expect = [] if nodes or "--expect-nodes" in extra else ["--expect-nodes", count]
    return " ".join(line + extra + expect + out)


def torchrun_command(python: str | None = None) -> str:
    """torchrun as the printed line must call it: by name when it is on PATH, else the one in
    gpuvet's own environment by path (a virtual environment not activated), else torch's module
    through that Python."""
    import shlex
    import shutil

    python = python or sys.executable
    if shutil.which("torchrun"):
        return "torchrun"
    beside = os.path.join(os.path.dirname(python), "torchrun")
    if os.access(beside, os.X_OK):
        return shlex.quote(beside)
    return f"{shlex.quote(python)} -m torch.distributed.run"


def launch_help(env: dict[str, str] | os._Environ = os.environ, join_timeout_s: float = 300.0) -> str:
    """What to do with the printed line (printed to stderr, so that the line alone goes to stdout)."""
    if env.get("SLURM_JOB_ID"):
        return "# Run this line once, inside the allocation: srun starts gpuvet on every node of it."
    wait = int(join_timeout_s)
    return (f"# Run this same line on every node (the first node hosts the rendezvous on port {RDZV_PORT}), each within "
            f"{wait} s of the previous one.\n"
            f"# The run starts when all have come, or {wait} s after the last arrival with the nodes there; the report "
            "names the others MISSING.\n"
            "# A node started after the run began is refused by torchrun (RendezvousClosedError), not let in: the "
            "running nodes are not restarted.")


def interface_towards(address: str) -> str | None:
    """The local network interface the kernel routes `address` through (gloo otherwise picks the
    interface of the hostname, which on multi-NIC nodes and in containers is often wrong)."""
    import psutil

    try:
        family, kind, proto, _, target = socket.getaddrinfo(address, 9, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.connect(target)  # UDP: no packet is sent, the kernel only picks the route
            local = probe.getsockname()[0]
    except OSError:
        return None
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address.split("%")[0] == local for a in addresses):
            return name
    return None
