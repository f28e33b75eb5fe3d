"""torchrun's side of a cluster run: the agent's own settings (read from its command line, which
its workers are not told) and closing its rendezvous once gpuvet has started.

Why close it: torchrun's c10d rendezvous is elastic (`--nnodes 1:N`) so that a node that never
comes does not stop the others (a fixed `--nnodes N` ends in a rendezvous timeout before gpuvet
runs). But an elastic group that is not full puts a node arriving later on a wait list, and every
running agent then restarts its workers to take it in ("membership changes do not count as
retries": `--max-restarts 0` does not prevent it): the vet in progress would be killed everywhere.
Once closed, the rendezvous refuses a late node at once (its torchrun ends with
RendezvousClosedError) and the running nodes go on; rank 0 reports it as missing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

# The names torchrun is started by: the console script, or `python -m torch.distributed.run`.
_LAUNCHER_NAMES = ("torchrun", "torch.distributed.run", "torch.distributed.launch")


@dataclass
class Agent:
    """What the torchrun agent that started this worker was told."""

    min_nodes: int
    max_nodes: int
    rdzv_backend: str
    rdzv_endpoint: str
    run_id: str

    @property
    def elastic(self) -> bool:
        return self.min_nodes < self.max_nodes


def agent_from_argv(argv: list[str], env: dict[str, str] | os._Environ = os.environ) -> Agent | None:
    """The agent's settings from its command line, parsed by torchrun's own parser (None when
    `argv` is not a torchrun command line)."""
    start = next((i + 1 for i, word in enumerate(argv) if os.path.basename(word) in _LAUNCHER_NAMES), None)
    if start is None:
        return None
    from torch.distributed.run import get_args_parser, parse_min_max_nnodes

    try:
        args, _ = get_args_parser().parse_known_args(argv[start:])
        low, high = parse_min_max_nnodes(str(args.nnodes))
    except (SystemExit, ValueError, RuntimeError):
        return None
    return Agent(int(low), int(high), args.rdzv_backend, args.rdzv_endpoint or "",
                 env.get("TORCHELASTIC_RUN_ID") or args.rdzv_id)


def this_agent() -> Agent | None:
    """The torchrun agent that started this process (its parent), or None."""
    import psutil

    try:
        return agent_from_argv(psutil.Process().parent().cmdline())
    except (psutil.Error, AttributeError):
        return None


def close_rendezvous(agent: Agent, timeout_s: float = 30.0) -> str | None:
    """Close the agent's c10d rendezvous so that a node arriving now is refused instead of
    restarting everyone; None when closed, else why not."""
    if agent.rdzv_backend != "c10d":
        return f"the {agent.rdzv_backend} rendezvous is not closed by gpuvet (use --rdzv-backend c10d)"
    if not agent.rdzv_endpoint:
        return "torchrun was given no --rdzv-endpoint"
    from torch.distributed import TCPStore
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

    host, _, port = agent.rdzv_endpoint.rpartition(":")
    try:
        store = TCPStore(host or agent.rdzv_endpoint, int(port or 29400), None, False, timeout=timedelta(seconds=timeout_s))
        backend = C10dRendezvousBackend(store, agent.run_id)
        DynamicRendezvousHandler.from_backend(agent.run_id, store, backend, agent.min_nodes, agent.max_nodes).set_closed()
    except Exception as err:  # torch raises its own errors (RendezvousError, DistError, ValueError)
        return f"{type(err).__name__}: {err}".splitlines()[0]
    return None
