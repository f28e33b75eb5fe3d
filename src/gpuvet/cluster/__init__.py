"""Cluster mode (D4): every node of a multi-node job vetted at once, the network between the nodes
measured, the stragglers named.

Started by the launcher the user already has, one process per node:

    torchrun --nnodes N --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint HOST:PORT -m gpuvet.cluster [options]
    srun --ntasks-per-node=1 --kill-on-bad-exit=0 python -m gpuvet.cluster [options]

Rank, world size and the master address come from the environment either way (`Launch`).
Each node:
  1. joins: connects to the launcher's TCPStore (rank 0 hosts one under Slurm; torchrun's agent
     hosts it under torchrun), says who it is, and beats a heartbeat from a thread;
  2. runs the standard local vet (`runner.run_live`: facts, and benchmarks unless --quick) under a
     deadline, saves the record in its own store, and posts it, time series summarised;
  3. meets the others: rank 0 waits until every node is ready, failed, silent or missing, then
     posts a plan; the members start one process per GPU (NCCL; one process with gloo on nodes
     without GPU) that together sweep an all-reduce (nccl-tests bus bandwidth) and run a ring of
     node-to-node transfers, shuffled every round;
  4. rank 0 collects the cross-node results and the records by a deadline, judges the cluster
     (judge/cluster/), writes the cluster record (gpuvet.cluster/1) and prints the report.

Why the store and not gather_object: a collective needs every rank and blocks on a dead one; with
keys in the store rank 0 takes whoever posted by the deadline and names the rest. Why the
cross-node ranks are child processes: a hung NCCL call cannot be interrupted from Python, and the
NCCL watchdog aborts the process it runs in; in a child, the node kills it at its deadline and
still reports what was measured.

Store keys (under gpuvet/cluster/<cluster id>/): joined/R, beat/R (a counter: rank 0 watches it
change on its own clock, so clocks need not agree), step/R, record/R (zlib JSON), ready/R,
failed/R, cross/R, plan, abort, final; the logs log/{joined,record,ready,failed,cross,bye} list
ranks, so rank 0 reads six keys per poll, not one per node.

Modules, one concern each:
  launch.py        the launcher's environment, Slurm host lists, --print-launch
  torchrun.py      the torchrun agent's settings, and closing its rendezvous once the run started
  options.py       the run options every node gets
  rendezvous.py    the store, its keys and the heartbeat
  vet.py           the local vet under a deadline
  plan.py          what rank 0 decides for the meeting
  cross_rank.py    one cross-node rank: the all-reduce sweep and the ring rounds
  cross.py         one node's cross-node ranks: started, watched, stopped, combined
  roster.py        rank 0's view of every node
  record.py        the cluster record: shipped node records, measurements, judging, --out
  node.py          one node's steps
  coordinator.py   rank 0's part: plan, abort, gather, report
  flow.py          one node, start to end
The command that starts it (click options, main, finish; the store and the report it hands a
node as Outputs) is gpuvet.cli.cluster; `python -m gpuvet.cluster` runs it.
"""


from .coordinator import BYE_WAIT_S, GATHER_GRACE_S, Coordinator
from .cross import ABORT_CHECK_S, RankThread, combine_rank_reports, run_cross_node
from .cross_rank import CHILD_GRACE_S, CrossRankConfig, child_main, run_rank
from .flow import run_node
from .launch import Launch, LaunchError, expand_hostlist, interface_towards, launch_from_env, launch_help, print_launch
from .node import EXIT_FAIL, EXIT_LOST, EXIT_OK, EXIT_USAGE, Node
from .options import (CPU_ALLREDUCE_MAX_MIB, CPU_RING_MIB, GPU_ALLREDUCE_MAX_MIB, GPU_RING_MIB, RING_ROUNDS,
                      Options, Outputs)
from .plan import RING_REPEATS, Plan, make_plan, shuffled_rings
from .record import (CLUSTER_SCHEMA, check_out_path, cluster_record, cross_measurements, node_entries,
                     rejudge_cluster, summarise_record, summarise_series)
from .rendezvous import POLL_S, PREFIX, Heartbeat, Rendezvous
from .roster import NodeState, Roster, Settled, unique_names
from .torchrun import Agent, agent_from_argv, close_rendezvous
from .vet import VetOutcome, vet_with_deadline

__all__ = [
    "ABORT_CHECK_S", "BYE_WAIT_S", "CHILD_GRACE_S", "CLUSTER_SCHEMA", "CPU_ALLREDUCE_MAX_MIB", "CPU_RING_MIB",
    "EXIT_FAIL", "EXIT_LOST", "EXIT_OK", "EXIT_USAGE", "GATHER_GRACE_S", "GPU_ALLREDUCE_MAX_MIB", "GPU_RING_MIB",
    "POLL_S", "PREFIX", "RING_REPEATS", "RING_ROUNDS",
    "Agent", "Coordinator", "CrossRankConfig", "Heartbeat", "Launch", "LaunchError", "Node", "NodeState", "Options", "Plan",
    "RankThread", "Rendezvous", "Roster", "Settled", "VetOutcome", "agent_from_argv", "close_rendezvous",
    "check_out_path", "child_main", "cluster_record", "combine_rank_reports", "cross_measurements",
    "expand_hostlist", "interface_towards", "launch_from_env", "launch_help", "make_plan", "node_entries", "Outputs",
    "print_launch", "rejudge_cluster", "run_cross_node", "run_node", "run_rank", "shuffled_rings",
    "summarise_record", "summarise_series", "unique_names", "vet_with_deadline",
]
