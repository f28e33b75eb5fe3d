"""Cluster mode (gpuvet.cluster): the launcher environment, the plan and the cross-node results,
and the whole flow for real: several `python -m gpuvet.cluster` processes on this machine, each a
"node" with its own name and store, meeting over torch.distributed's TCPStore and gloo.

The processes use --quick (facts only) and a tiny cross-node all-reduce and ring (1 MiB) so the
file stays fast; most of its time is each process importing PyTorch. Waits are bounded by
generous timeouts that only guard against a hang: no assertion depends on how long anything took.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest

from gpuvet import cluster
from gpuvet.record import check_run
from gpuvet.cli.cluster import command as cluster_command
from gpuvet.cluster import (LaunchError, NodeState, Options, Plan, combine_rank_reports, cross_measurements,
                            expand_hostlist, launch_from_env, make_plan, print_launch, shuffled_rings, summarise_record)
from gpuvet.cluster.launch import torchrun_command
from gpuvet.judge.cluster import ALLREDUCE_BUSBW, NOTE, RING
from gpuvet.store import Store

from cluster_stubs import JoinedStore

SRC = str(Path(__file__).resolve().parents[1] / "src")
GUARD_S = 180  # a process still running after this is hung: the test fails (never reached when healthy)


# == unit: where am I ==========================================================================

@pytest.mark.parametrize("text, hosts", [
    ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
    ("a1,b[2-3]", ["a1", "b2", "b3"]),
    ("gpu[008-010]", ["gpu008", "gpu009", "gpu010"]),
    ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
    ("single", ["single"]),
    ("x[9-11]y,z", ["x9y", "x10y", "x11y", "z"]),
])
def test_slurm_host_lists_expand(text, hosts):
    assert expand_hostlist(text) == hosts


SLURM_LISTS = ["node[01-04,07],gpu-a[1-2]-x", "n[1-2][3-4]", "node[1-3]-ib", "node[001-010]", "n[9-11]",
               "rack[1-2]-n[01-02]", "node[1-2,5-6]x", "n[01-1]", "a,,b", "gpu-01.cluster.local,gpu-02.cluster.local",
               "x[7]", "n[0-0]"]


@pytest.mark.parametrize("text", SLURM_LISTS)
def test_host_lists_read_as_slurm_reads_them(text):
    hostlist = pytest.importorskip("hostlist")  # python-hostlist (LLNL's Slurm syntax), the oracle
    assert expand_hostlist(text) == hostlist.expand_hostlist(text)


@pytest.mark.parametrize("text", ["node[a-c]", "node[1-4", "node[4-1]", "node[]", "n[1-2]]", "node01:29400", "a b",
                                  "n[1-[2]]", ","])
def test_a_malformed_host_list_is_refused(text):
    with pytest.raises(LaunchError):
        expand_hostlist(text)


def test_a_malformed_nodes_option_is_a_usage_error_not_an_endpoint():
    from click.testing import CliRunner

    result = CliRunner().invoke(cluster_command, ["--print-launch", "--nodes", "node[1-4"])
    assert result.exit_code == 2 and "unbalanced brackets" in result.output and "--rdzv-endpoint" not in result.output


def test_the_printed_line_calls_torchrun_by_path_when_it_is_not_on_path(monkeypatch, tmp_path):
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "torchrun").write_text("#!/bin/sh\n")
    (venv / "torchrun").chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert print_launch({}, python=str(venv / "python")).startswith(f"{venv / 'torchrun'} --nnodes ")
    (venv / "torchrun").unlink()  # no torchrun at all: torch's module through gpuvet's Python
    assert print_launch({}, python=str(venv / "python")).startswith(f"{venv / 'python'} -m torch.distributed.run --nnodes ")


def test_torchrun_environment():
    env = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29400",
           "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RUN_ID": "abc", "TORCHELASTIC_RESTART_COUNT": "0"}
    launch = launch_from_env(env)
    assert (launch.kind, launch.rank, launch.world_size, launch.master_addr, launch.master_port) == ("torchrun", 3, 8, "10.0.0.1", 29400)
    assert launch.agent_store and launch.cluster_id == "abc-0"


def test_torchrun_with_several_processes_per_node_is_refused():
    env = {"RANK": "0", "WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8", "MASTER_ADDR": "h", "MASTER_PORT": "1"}
    with pytest.raises(LaunchError, match="--nproc-per-node 1"):
        launch_from_env(env)


def test_slurm_environment_takes_the_first_host_as_master():
    env = {"SLURM_PROCID": "2", "SLURM_NTASKS": "5", "SLURM_LOCALID": "0", "SLURM_NODEID": "2", "SLURM_JOB_ID": "123456",
           "SLURM_JOB_NODELIST": "gpu[01-04,07]"}
    launch = launch_from_env(env)
    assert (launch.kind, launch.rank, launch.world_size, launch.master_addr) == ("slurm", 2, 5, "gpu01")
    assert launch.master_port == 20000 + 123456 % 20000 and launch.cluster_id == "slurm-123456"
    assert launch.expected_nodes == ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07"]
    assert launch_from_env({**env, "MASTER_PORT": "4000"}).master_port == 4000
    assert launch_from_env(env, port=5000).master_port == 5000


def test_slurm_with_more_tasks_than_nodes_is_refused():
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "16", "SLURM_JOB_NODELIST": "gpu[01-02]", "SLURM_JOB_ID": "1"}
    with pytest.raises(LaunchError, match="ntasks-per-node=1"):
        launch_from_env(env)


def test_without_a_launcher_the_error_shows_how_to_start():
    with pytest.raises(LaunchError, match="torchrun --nnodes"):
        launch_from_env({})


def test_print_launch_inside_and_outside_slurm():
    inside = print_launch({"SLURM_JOB_ID": "77", "SLURM_JOB_NUM_NODES": "4"}, python="/venv/bin/python")
    assert inside.startswith("srun --nodes=4 --ntasks-per-node=1 --kill-on-bad-exit=0 /venv/bin/python -m gpuvet.cluster")
    counted = print_launch({"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "n[1-3]"})
    assert "--nodes=3" in counted
    outside = print_launch({}, options=["--quick"])
    # Elastic: the run starts with the nodes that came instead of a rendezvous traceback.
    assert outside.startswith(f"{torchrun_command()} --nnodes 1:<NUMBER_OF_NODES> --nproc-per-node 1 --rdzv-backend c10d "
                              "--rdzv-endpoint <FIRST_NODE_HOST>:29400 ")
    assert "--rdzv-conf join_timeout=660,last_call_timeout=300 --max-restarts 0 " in outside
    # gpuvet is told how many nodes to expect, so that one that never comes is counted.
    assert outside.endswith("-m gpuvet.cluster --quick --expect-nodes <NUMBER_OF_NODES> --out gpuvet-cluster.json")


def test_print_launch_gives_the_same_line_on_every_node():
    """Each node may print its own line: the lines must meet at one rendezvous id."""
    nodes = ["n1", "n2", "n3"]
    line = print_launch({}, nodes=nodes)
    assert line == print_launch({}, nodes=nodes) and "--rdzv-id gpuvet-" in line
    assert line != print_launch({}, nodes=["m1", "m2", "m3"])  # another cluster, another rendezvous
    assert print_launch({}, expect_nodes=3) == print_launch({}, expect_nodes=3)
    assert "--rdzv-id myrun " in print_launch({}, nodes=nodes, run_id="myrun")
    counted = print_launch({}, expect_nodes=3)
    assert "--nnodes 1:3 " in counted and counted.endswith("--expect-nodes 3 --out gpuvet-cluster.json")


def test_print_launch_passes_on_the_options_given_with_the_node_count_and_first_host():
    from click.testing import CliRunner

    args = ["--print-launch", "--quick", "--device", "cpu", "--nodes", "n[1-4]", "--join-timeout", "120", "--node-name",
            "mine", "--on-demand"]
    result = CliRunner().invoke(cluster_command, args)
    assert result.exit_code == 0, result.output
    line = result.stdout.strip()  # the line alone on stdout; what to do with it on stderr
    assert "same line on every node" in result.stderr and "refused by torchrun" in result.stderr
    assert result.stdout == CliRunner().invoke(cluster_command, args).stdout
    assert line.startswith(f"{torchrun_command()} --nnodes 1:4 ") and "--rdzv-endpoint n1:29400 " in line
    assert "last_call_timeout=120" in line
    assert line.endswith("-m gpuvet.cluster --quick --device cpu --on-demand --nodes 'n[1-4]' --join-timeout 120 "
                         "--out gpuvet-cluster.json")
    assert "mine" not in line  # each node has its own name


def test_the_torchrun_agents_settings_are_read_from_its_command_line():
    """Its workers are not told the rendezvous endpoint nor --nnodes: gpuvet reads them from the
    agent's own command line, with torchrun's parser."""
    line = print_launch({}, nodes=["n1", "n2", "n3"]).split()
    agent = cluster.agent_from_argv(["/venv/bin/python", "/venv/bin/torchrun", *line[1:]], {})
    assert (agent.min_nodes, agent.max_nodes, agent.rdzv_backend, agent.rdzv_endpoint) == (1, 3, "c10d", "n1:29400")
    assert agent.elastic and agent.run_id == line[line.index("--rdzv-id") + 1]
    fixed = cluster.agent_from_argv(["python", "-m", "torch.distributed.run", "--nnodes=4", "train.py"],
                                    {"TORCHELASTIC_RUN_ID": "r1"})
    assert (fixed.max_nodes, fixed.elastic, fixed.run_id) == (4, False, "r1")
    assert cluster.agent_from_argv(["/usr/bin/python", "-m", "pytest"], {}) is None


def test_a_malformed_node_list_is_one_line_and_exit_2():
    from click.testing import CliRunner

    result = CliRunner().invoke(cluster_command, ["--print-launch", "--nodes", "n[a-c]"])
    assert result.exit_code == 2 and "cannot read the host range" in result.output and "Traceback" not in result.output


def test_the_route_to_loopback_is_lo():
    assert cluster.interface_towards("127.0.0.1") == "lo"


# == unit: what a node ships, what rank 0 plans ===============================================

def test_a_node_ships_what_the_cluster_is_judged_on_and_is_judged_the_same(tmp_path):
    # SYNTHETIC nodes made of the real record `gpuvet inspect` writes of an 8x H100 capture, with
    # planted faults (test_judge_cluster.synthetic_cluster): the compact records a node ships give
    # the same verdict, stragglers and uniformity as the whole ones, at a tenth of the size or less.
    from cluster_synthetic import synthetic_cluster, template_record

    from gpuvet.judge.cluster import judge_cluster

    whole_entries, cross, _ = synthetic_cluster(40)
    compact_entries = [dataclasses.replace(e, record=summarise_record(e.record) if e.record else None)
                       for e in whole_entries]
    whole, compact = judge_cluster(whole_entries, cross), judge_cluster(compact_entries, cross)
    assert [dataclasses.astuple(f) for f in compact.findings] == [dataclasses.astuple(f) for f in whole.findings]
    assert compact.uniformity == whole.uniformity
    assert [(s.node, s.subject, s.metric, s.status) for s in compact.stragglers] == \
        [(s.node, s.subject, s.metric, s.status) for s in whole.stragglers]
    assert all(abs(a.share - b.share) < 1e-4 for a, b in zip(compact.stragglers, whole.stragglers))  # figures kept to 5 digits
    template = template_record()
    shipped = summarise_record(template)
    assert len(json.dumps(shipped)) * 10 < len(json.dumps(template)) and len(json.dumps(shipped)) < 10_000
    assert check_run(shipped)["verdict"] == template["verdict"]  # still a run record, its verdict kept
    assert summarise_record(template, whole=True) is template  # --full-records


def test_rings_are_shuffled_permutations():
    rings = shuffled_rings(6, 3, random.Random(0))
    assert len(rings) == 3 and all(sorted(r) == list(range(6)) for r in rings)
    assert len({tuple(r) for r in rings}) > 1
    assert shuffled_rings(1, 3, random.Random(0)) == []


def test_nccl_with_one_rank_per_gpu_when_every_node_has_gpus_else_gloo():
    ready = {0: {"name": "a", "gpus": 8}, 1: {"name": "b", "gpus": 4}}
    plan = make_plan(ready, Options(device="cuda"), random.Random(0))
    assert (plan.backend, plan.device, plan.ranks_per_node, plan.names) == ("nccl", "cuda", 4, ["a", "b"])
    assert plan.allreduce_max_bytes == 1024 * 2**20
    mixed = make_plan({**ready, 2: {"name": "c", "gpus": 0}}, Options(device="cuda"), random.Random(0))
    assert (mixed.backend, mixed.ranks_per_node) == ("gloo", 1) and "c" in mixed.notes[0]
    assert make_plan(ready, Options(device="cpu", allreduce_max_mib=1, ring_mib=1), random.Random(0)).ring_bytes == 2**20


def _plan(rounds: list[list[int]], ranks_per_node: int = 2) -> Plan:
    return Plan([0, 5, 9], ["a", "b", "c"], ranks_per_node, "nccl", "cuda", 2**20, 2**20, 5, rounds, 60.0)


def test_a_nodes_local_ranks_add_up_rail_by_rail():
    plan = _plan([[0, 1, 2]])
    reports = [{"allreduce": {"rows": [{"bytes": 1}]}, "ring": [{"round": 0, "bytes": 100, "seconds": 0.5, "wrong": 0}], "finished": True},
               {"allreduce": {"rows": [{"bytes": 1}]}, "ring": [{"round": 0, "bytes": 100, "seconds": 1.0, "wrong": 0}], "finished": True}]
    result = combine_rank_reports(plan, 1, reports, None)
    assert result["ring"] == [{"round": 0, "src_member": 0, "bytes": 200, "seconds": 1.0, "wrong": 0}]
    assert result["errors"] == [] and result["allreduce"] == [{"bytes": 1}]


def test_a_broken_transfer_counts_against_its_pair_but_an_abort_does_not():
    plan = _plan([[0, 1, 2], [2, 1, 0]], ranks_per_node=1)
    broken = [{"ring": [{"round": 0, "bytes": 1, "seconds": 1, "wrong": 0}], "finished": False,
               "error": {"step": "ring round 2: transfer", "error": "Connection reset by peer"}}]
    assert combine_rank_reports(plan, 1, broken, None)["ring"][1] == {"round": 1, "src_member": 2, "error": "Connection reset by peer"}
    stopped = [{"ring": [], "finished": False, "step": "ring round 1: transfer", "error": None}]
    result = combine_rank_reports(plan, 1, stopped, "aborted: c went silent")
    assert result["ring"] == [] and result["errors"][0]["error"] == "aborted: c went silent"
    barrier = [{"ring": [], "finished": False, "error": {"step": "ring round 1: barrier", "error": "peer gone"}}]
    assert combine_rank_reports(plan, 1, barrier, None)["ring"] == []  # the barrier is everyone's, not this pair's


def test_cross_node_results_become_named_measurements():
    plan = _plan([[0, 1, 2]], ranks_per_node=1)
    rows = [{"bytes": 2**20, "time_us": 100.0, "algbw_gbps": 10.0, "busbw_gbps": 13.3, "iterations": 5, "wrong": 0}]
    nodes = [NodeState(0, "a", "done", cross={"allreduce": rows, "ring": [{"round": 0, "src_member": 2, "bytes": 10**9, "seconds": 0.1,
                                                                         "wrong": 0}], "errors": [], "aborted": None}),
             NodeState(5, "b", "done", cross={"allreduce": rows, "ring": [], "errors": [], "aborted": None}),
             NodeState(9, "c", "failed", reason="it stopped answering (no heartbeat for 3 s)")]
    measurements = cross_measurements(plan, nodes)
    ring = next(m for m in measurements if m.name == RING)
    assert (ring.subject, ring.value) == ("c->a", pytest.approx(10.0))
    assert next(m for m in measurements if m.name == ALLREDUCE_BUSBW).details["members"] == ["a", "b", "c"]
    note = next(m for m in measurements if m.name == NOTE)
    assert note.details["nodes"] == ["c"] and "no result from c" in note.details["reason"]


@pytest.mark.parametrize("step", ["starting Python", "importing torch"])
def test_ranks_not_started_in_the_start_up_limit_are_not_measured_not_failed(step):
    """A busy node is slow to start its rank processes (Python, importing torch): when the start-up
    limit passes before they have, the cross-node tests are skipped naming the node and the
    limit (never a failure)."""
    from gpuvet.cluster.cross import did_not_start

    plan = _plan([[0, 1, 2]], ranks_per_node=1)
    reason = did_not_start(plan.start_timeout_s)
    slow = combine_rank_reports(plan, 1, [{"ring": [], "finished": False, "step": step}], reason)
    fast = combine_rank_reports(plan, 0, [{"ring": [], "finished": False, "step": "waiting for every rank to start"}],
                                reason)
    nodes = [NodeState(0, "a", "done", cross=fast), NodeState(5, "b", "done", cross=slow), NodeState(9, "c", "done", cross=fast)]
    note = next(m for m in cross_measurements(plan, nodes) if m.name == NOTE)
    assert note.details["outcome"] == "skipped" and note.details["nodes"] == ["b"]
    assert note.details["reason"].startswith("not measured: the cross-node ranks of b did not start within 180 s")
    assert "(a loaded machine? see `uptime` there)" in note.details["reason"]
    assert note.details["behind"] == {"b": step} and note.details["start_timeout_s"] == 180


def test_ranks_all_still_starting_name_every_node():
    from gpuvet.cluster.cross import did_not_start

    plan = _plan([[0, 1, 2]], ranks_per_node=1)
    slow = combine_rank_reports(plan, 0, [{"ring": [], "finished": False, "step": "importing torch"}], did_not_start(9))
    nodes = [NodeState(r, name, "done", cross=slow) for r, name in ((0, "a"), (5, "b"), (9, "c"))]
    note = next(m for m in cross_measurements(plan, nodes) if m.name == NOTE)
    assert note.details["outcome"] == "skipped" and note.details["nodes"] == ["a", "b", "c"]
    assert "the cross-node ranks of a, b, c did not start within 180 s" in note.details["reason"]


def test_a_node_not_yet_joined_or_ready_when_the_run_is_stopped_is_missing_or_stopped_and_says_so():
    nodes = [NodeState(0, "a", "ready"), NodeState(1, "b", "joined", step="local vet"), NodeState(2, "c")]
    a, b, c = cluster.node_entries(nodes, {}, {}, stopped="SIGTERM received during the local vets", stopped_after_s=42.4)
    # b joined and was vetting itself: the stop cut it short, which is not b's fault.
    assert (a.status, b.status) == ("ok", "stopped") and b.reason == "still at local vet when the run was stopped after 42 s"
    assert c.status == "missing" and c.reason == "had not joined when the run stopped after 42 s"
    # Not stopped: a node that never became ready while the others went on failed.
    (late,) = cluster.node_entries([NodeState(1, "b", "joined", step="local vet")], {}, {})
    assert late.status == "failed" and late.reason == "not ready when the others met"


def test_a_vet_that_hangs_is_reported_not_waited_for():
    outcome = cluster.vet_with_deadline(Options(test_pause_at="vet"), 0.5, lambda step: None)
    assert outcome.hung and outcome.record is None and "did not finish in 0 s" in outcome.error


def test_out_must_not_eat_a_file_that_is_not_a_cluster_record(tmp_path):
    mine = tmp_path / "train.py"
    mine.write_text("print('hello')\n")
    assert "not a gpuvet cluster record" in cluster.check_out_path(str(mine))
    assert cluster.check_out_path(str(tmp_path / "new.json")) is None
    assert "does not exist" in cluster.check_out_path(str(tmp_path / "no" / "x.json"))


# == real processes ===========================================================================

class Nodes:
    """`python -m gpuvet.cluster` processes started as a launcher would, one per "node"."""

    def __init__(self, tmp_path: Path, world_size: int, master: str = "127.0.0.1", port: int | None = None):
        from gpuvet.bench.net import free_port

        self.tmp, self.world_size, self.master = tmp_path, world_size, master
        self.port = port or free_port()
        self.procs: dict[int, subprocess.Popen] = {}

    def start(self, rank: int, *extra: str, netns: str | None = None) -> subprocess.Popen:
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(self.world_size), "LOCAL_WORLD_SIZE": "1",
               "MASTER_ADDR": self.master, "MASTER_PORT": str(self.port), "PYTHONPATH": SRC, "NO_COLOR": "1"}
        command = [sys.executable, "-m", "gpuvet.cluster", "--node-name", self.name(rank), "--device", "cpu", "--quick",
                   "--allreduce-max-mib", "1", "--ring-mib", "1", "--db", str(self.db(rank)), "--dead-after", "3",
                   "--join-timeout", "60", *extra]
        if rank == 0:
            command += ["--out", str(self.out)]
        if netns:
            command = ["ip", "netns", "exec", netns, *command]
        with open(self.tmp / f"out{rank}.txt", "wb") as out, open(self.tmp / f"err{rank}.txt", "wb") as err:
            self.procs[rank] = subprocess.Popen(command, stdout=out, stderr=err, env=env, start_new_session=True)
        return self.procs[rank]

    def name(self, rank: int) -> str:
        return f"node-{rank}"

    def db(self, rank: int) -> Path:
        return self.tmp / f"{self.name(rank)}.sqlite3"

    @property
    def out(self) -> Path:
        return self.tmp / "cluster.json"

    def stdout(self, rank: int) -> str:
        return (self.tmp / f"out{rank}.txt").read_text()

    def stderr(self, rank: int) -> str:
        return (self.tmp / f"err{rank}.txt").read_text()

    def wait(self, rank: int) -> int:
        try:
            return self.procs[rank].wait(timeout=GUARD_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"node {rank} still running after {GUARD_S} s; stderr: {self.stderr(rank)[-2000:]}")

    def wait_for_text(self, rank: int, text: str) -> None:
        deadline = time.monotonic() + GUARD_S
        while text not in self.stderr(rank):
            if self.procs[rank].poll() is not None:
                pytest.fail(f"node {rank} exited before printing {text!r}: {self.stderr(rank)[-2000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"node {rank} never printed {text!r}")
            time.sleep(0.1)

    def kill(self, rank: int) -> None:
        os.killpg(self.procs[rank].pid, signal.SIGKILL)
        self.procs[rank].wait(timeout=30)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)

    def record(self) -> dict:
        return json.loads(self.out.read_text())


@pytest.fixture
def nodes_factory(tmp_path):
    made: list[Nodes] = []

    def make(world_size: int, **kwargs) -> Nodes:
        made.append(Nodes(tmp_path, world_size, **kwargs))
        return made[-1]

    yield make
    for nodes in made:  # a failed test leaves no process behind
        nodes.stop_all()


def _node(record: dict, name: str) -> dict:
    return next(n for n in record["nodes"] if n["name"] == name)


def _finding(record: dict, check: str, subject: str | None = None) -> dict:
    return next(f for f in record["findings"] if f["check"] == check and (subject is None or f["subject"] == subject))


def test_three_nodes_vet_meet_and_report(nodes_factory):
    nodes = nodes_factory(3)
    for rank in range(3):
        nodes.start(rank)
    codes = {rank: nodes.wait(rank) for rank in range(3)}
    record = nodes.record()

    assert record["schema"] == "gpuvet.cluster/1" and record["launcher"]["world_size"] == 3
    assert codes[0] == (1 if record["verdict"] == "fail" else 0), nodes.stderr(0)
    assert [(n["name"], n["rank"], n["status"]) for n in record["nodes"]] == [("node-0", 0, "ok"), ("node-1", 1, "ok"), ("node-2", 2, "ok")]
    for rank in range(3):
        node = _node(record, nodes.name(rank))
        assert node["record"]["schema"] == "gpuvet.run/1"
        assert node["record"]["options"]["cluster"] == {"id": record["cluster_id"], "node": nodes.name(rank), "rank": rank,
                                                        "world_size": 3, "launcher": "torchrun"}
        with Store(nodes.db(rank), create=False) as store:  # every node's record also lands in its own store
            stored = store.get(node["saved_run"])
        assert stored.options["cluster"]["node"] == nodes.name(rank)
        assert codes[rank] == (1 if stored.verdict == "fail" else 0)

    measurements = record["cross_node"]["measurements"]
    busbw = next(m for m in measurements if m["name"] == ALLREDUCE_BUSBW)
    assert busbw["value"] > 0 and busbw["details"]["check_ok"] and busbw["details"]["world_size"] == 3
    assert busbw["details"]["backend"] == "gloo" and busbw["details"]["largest_bytes"] == 2**20
    ring = [m for m in measurements if m["name"] == RING]
    assert len(ring) == 9  # 3 shuffled rounds x 3 nodes, each receiving from its predecessor
    assert all(m["value"] > 0 and m["details"]["wrong"] == 0 for m in ring)
    names = {nodes.name(r) for r in range(3)}
    assert all(m["details"]["src"] in names and m["details"]["dst"] in names and m["details"]["src"] != m["details"]["dst"]
               for m in ring)
    assert not [m for m in measurements if m["name"] == NOTE]
    assert _finding(record, "cluster.nodes")["status"] == "pass"
    allreduce = _finding(record, "cluster.allreduce")
    # Without a known NIC speed the figure is shown but not passed.
    assert allreduce["status"] in ("pass", "warn", "fail") or "GB/s measured, not judged" in allreduce["summary"]

    report = nodes.stdout(0)
    node_lines = [line for line in report.splitlines() if " rank " in line]
    assert sorted(line.split()[1] for line in node_lines) == sorted(names)
    for rank in range(3):  # each node's stored run, for `gpuvet show N` on that node
        line = next(line for line in node_lines if line.split()[1] == nodes.name(rank))
        assert f"run {_node(record, nodes.name(rank))['saved_run']}" in line
    assert f"local verdict {_node(record, 'node-0')['record']['verdict'].upper()}, saved as run" in nodes.stderr(0)
    assert nodes.out.stat().st_mode & 0o777 == 0o600  # it names every node's host and address: private
    assert "1 node," not in report and "3 nodes, 3 reported" in report
    assert "Cross-node" in report and f"cluster record: {nodes.out}" in report
    for rank in (1, 2):
        assert f"node-{rank} (rank {rank}): local verdict" in nodes.stdout(rank)
        assert f"cluster verdict {record['verdict'].upper()}" in nodes.stdout(rank)
    # The cluster record renders for a ticket or a page, and --redact takes the hostnames out.
    hostname = record["nodes"][0]["record"]["machine"]["host"]["hostname"]
    env = {**os.environ, "PYTHONPATH": SRC, "NO_COLOR": "1"}
    for fmt, start in (("md", "# "), ("html", "<!doctype html")):
        shown = subprocess.run([sys.executable, "-m", "gpuvet", "report", str(nodes.out), "--format", fmt, "--redact"],
                               capture_output=True, text=True, env=env, timeout=120)
        assert shown.returncode == 0 and shown.stdout.lower().startswith(start), shown.stderr
        assert "node-2" not in shown.stdout and "HOST-REDACTED-3" in shown.stdout  # node names become tokens
        assert not hostname or hostname not in shown.stdout


def test_a_node_killed_mid_run_and_one_that_never_joined_are_named(nodes_factory):
    """World of 4: node-3 never starts; node-2 stops inside the cross-node phase (as a hung rank
    would) and is killed there. The two others finish, and the report names both by name."""
    nodes = nodes_factory(4)
    join = ("--join-timeout", "12", "--nodes", "node-[0-3]")
    nodes.start(1, *join)  # started first: they wait for rank 0's store, and join as soon as it is up
    nodes.start(2, *join, "--test-pause-at", "cross")
    nodes.start(0, *join)
    nodes.wait_for_text(2, "paused at cross-node")
    nodes.kill(2)
    codes = {rank: nodes.wait(rank) for rank in (0, 1)}
    record = nodes.record()

    assert codes[0] == 1 and record["verdict"] == "fail"  # a node missing and one failed: the cluster fails
    own_verdict = _node(record, "node-1")["record"]["verdict"]  # a node exits with its own verdict
    assert codes[1] == (1 if own_verdict == "fail" else 0), nodes.stderr(1)
    missing, killed = _node(record, "node-3"), _node(record, "node-2")
    assert missing["status"] == "missing" and "never joined" in missing["reason"] and missing["record"] is None
    assert killed["status"] == "failed" and "stopped answering" in killed["reason"]
    assert killed["step"] == "cross-node measurements"
    assert killed["record"] is not None  # posted before it died: its facts are still in the report
    assert [_node(record, n)["status"] for n in ("node-0", "node-1")] == ["ok", "ok"]
    assert "node-3 is missing" in _finding(record, "cluster.nodes", "node:node-3")["summary"]
    assert "node-2 failed" in _finding(record, "cluster.nodes", "node:node-2")["summary"]
    note = next(m for m in record["cross_node"]["measurements"] if m["name"] == NOTE)
    assert note["details"]["outcome"] == "aborted" and "node-2" in note["details"]["reason"]

    report = nodes.stdout(0)
    node_lines = [line for line in report.splitlines() if " rank " in line]
    assert [line.split()[:2] for line in node_lines[:2]] == [["MISSING", "node-3"], ["FAILED", "node-2"]]
    assert "cluster verdict FAIL" in nodes.stdout(1)


def test_rank_0_stopped_by_a_signal_writes_the_record_and_report_of_what_it_has(nodes_factory):
    """torchrun restarting its workers (a node joined late) or scancel sends SIGTERM, then SIGKILL:
    rank 0 writes the cluster record and prints the report before it goes, naming the phase."""
    nodes = nodes_factory(2)
    nodes.start(1, "--test-pause-at", "vet")
    nodes.start(0)
    # Both must be where the record will name them: rank 0 waiting, node-1 inside its local vet.
    # On a loaded machine node-1 can still be starting Python (step "joining") when rank 0 waits.
    nodes.wait_for_text(1, "paused at vet")
    nodes.wait_for_text(0, "waiting for every node to finish its local vet")
    nodes.procs[0].send_signal(signal.SIGTERM)
    code = nodes.wait(0)
    record = nodes.record()

    assert code == 1 and record["verdict"] == "fail", nodes.stderr(0)
    assert record["stopped"] == "SIGTERM received during the local vets"
    stopped = _finding(record, "cluster.run")
    assert stopped["status"] == "fail" and "the run was stopped before its end (SIGTERM received" in stopped["summary"]
    assert _node(record, "node-0")["status"] == "ok" and _node(record, "node-0")["record"] is not None
    paused = _node(record, "node-1")
    assert paused["status"] == "stopped" and paused["reason"].startswith("still at local vet when the run was stopped after ")
    not_vetted = _finding(record, "cluster.nodes", "node:node-1")
    assert not_vetted["status"] == "skip" and not_vetted["summary"].startswith("node-1 was not vetted to its end: still at")
    report = nodes.stdout(0)
    assert "the run was stopped before its end" in report and "FAIL: something is wrong with this cluster" in report
    assert any(line.split()[:2] == ["STOPPED", "node-1"] for line in report.splitlines())
    assert "Traceback" not in nodes.stderr(0)


# == two hosts joined by a real (virtual) link ================================================

def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


@contextmanager
def two_hosts():
    """Two network namespaces joined by a veth pair, shaped to 200 Mbit/s each way: two hosts
    whose only path between them is that link."""
    tag = uuid.uuid4().hex[:6]
    spaces, links = (f"gva{tag}", f"gvb{tag}"), (f"gva{tag}", f"gvb{tag}")
    try:
        for space in spaces:
            _ip("netns", "add", space)
        _ip("link", "add", links[0], "type", "veth", "peer", "name", links[1])
        for space, link, address in zip(spaces, links, ("10.231.77.1/24", "10.231.77.2/24")):
            _ip("link", "set", link, "netns", space)
            _ip("-n", space, "addr", "add", address, "dev", link)
            _ip("-n", space, "link", "set", link, "up")
            _ip("-n", space, "link", "set", "lo", "up")
            subprocess.run(["ip", "netns", "exec", space, "tc", "qdisc", "add", "dev", link, "root", "tbf", "rate", "200mbit",
                            "burst", "64kb", "latency", "400ms"], check=True, capture_output=True)
        yield spaces, links
    finally:
        for space in spaces:
            _ip("netns", "del", space, check=False)


def _netns_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    try:
        probe = f"gvprobe{uuid.uuid4().hex[:6]}"
        _ip("netns", "add", probe)
        _ip("netns", "del", probe)
        subprocess.run(["tc", "-V"], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as err:
        return f"ip netns / tc not usable here: {err}"
    return None


def _tx_bytes(space: str, link: str) -> int:
    out = subprocess.run(["ip", "netns", "exec", space, "cat", f"/sys/class/net/{link}/statistics/tx_bytes"],
                         capture_output=True, text=True, check=True)
    return int(out.stdout)


@pytest.mark.skipif(_netns_unavailable() is not None, reason=str(_netns_unavailable()))
def test_two_hosts_measured_across_a_shaped_link(nodes_factory):
    """The cross-node path crosses the veth: the bytes counted on it cover the transfers, and no
    transfer beats the 200 Mbit/s (0.025 GB/s) the link is shaped to. The ranks run in processes
    of their own here, the path NCCL ranks take on GPUs."""
    with two_hosts() as (spaces, links):
        nodes = nodes_factory(2, master="10.231.77.1", port=29517)
        before = _tx_bytes(spaces[0], links[0]), _tx_bytes(spaces[1], links[1])
        nodes.start(0, "--rank-processes", netns=spaces[0])
        nodes.start(1, "--rank-processes", netns=spaces[1])
        codes = [nodes.wait(0), nodes.wait(1)]
        sent = [_tx_bytes(spaces[0], links[0]) - before[0], _tx_bytes(spaces[1], links[1]) - before[1]]
    record = nodes.record()
    assert [n["status"] for n in record["nodes"]] == ["ok", "ok"], nodes.stderr(0)
    assert codes[1] == (1 if _node(record, "node-1")["record"]["verdict"] == "fail" else 0), nodes.stderr(1)
    ring = [m for m in record["cross_node"]["measurements"] if m["name"] == RING]
    assert len(ring) == 6 and all(m["value"] is not None for m in ring)
    assert max(m["value"] for m in ring) < 0.025 * 1.1  # bytes / time of a shaped link, with slack for its burst
    ring_bytes = sum(m["details"]["bytes"] for m in ring) // 2  # each node received half of them
    assert min(sent) > ring_bytes  # (warm-up and all-reduce traffic come on top)
    busbw = next(m for m in record["cross_node"]["measurements"] if m["name"] == ALLREDUCE_BUSBW)
    assert 0 < busbw["value"] < 0.025 * 1.1 and busbw["details"]["check_ok"]


def test_a_node_whose_cross_node_part_hangs_is_named_with_its_step(nodes_factory):
    """node-2's cross-node rank hangs after every rank has started (opening its device; its
    heartbeat goes on, as around a hung NCCL call): the phase runs out of time on every node, and
    the node that stayed behind is named, with the step it was stuck at, in cluster.nodes, in the
    fix line and in its own row."""
    nodes = nodes_factory(3)
    for rank in range(3):
        nodes.start(rank, "--cross-timeout", "20", *(("--test-pause-at", "cross") if rank == 2 else ()))
    nodes.wait(0)
    record = nodes.record()

    stuck = _finding(record, "cluster.nodes", "node:node-2")
    assert stuck["status"] == "fail" and "stuck at opening its device" in stuck["summary"]
    assert not [f for f in record["findings"] if f["check"] == "cluster.nodes" and f["subject"] != "node:node-2"]
    allreduce = _finding(record, "cluster.allreduce")
    assert allreduce["status"] == "fail" and "held up by node-2 (stuck at opening its device)" in allreduce["remedy"]
    note = next(m for m in record["cross_node"]["measurements"] if m["name"] == NOTE)
    assert note["details"]["nodes"] == ["node-2"] and note["details"]["behind"] == {"node-2": "opening its device"}

    report = nodes.stdout(0)
    row = next(line for line in report.splitlines() if " rank " in line and line.split()[1] == "node-2")
    assert row.split()[0] == "FAIL" and "held up the cross-node phase: stuck at opening its device" in row
    node_lines = [line for line in report.splitlines() if " rank " in line]
    assert node_lines[0].split()[1] == "node-2"  # worst first


def test_a_node_whose_cross_node_rank_never_starts_is_slow_not_failed(nodes_factory):
    """node-1's cross-node rank stays in its start-up (importing torch, as on a loaded machine):
    when the start-up limit passes, the cross-node tests are skipped and node-1 is named with a
    warning that says so, never failed."""
    nodes = nodes_factory(2)
    nodes.start(1, "--start-timeout", "4", "--test-pause-at", "cross-start")
    nodes.start(0, "--start-timeout", "4")
    nodes.wait(0)
    record = nodes.record()

    slow = _finding(record, "cluster.nodes", "node:node-1")
    assert slow["status"] == "warn", slow
    assert slow["summary"].startswith("node-1: its cross-node ranks did not start within 4 s (still at 'importing torch'")
    assert "a loaded machine? see `uptime` there" in slow["summary"]
    assert [_finding(record, check)["status"] for check in ("cluster.allreduce", "cluster.ring")] == ["skip", "skip"]
    assert not [f for f in record["findings"] if f["check"].startswith("cluster.") and f["status"] == "fail"]
    note = next(m for m in record["cross_node"]["measurements"] if m["name"] == NOTE)
    assert note["details"]["outcome"] == "skipped" and note["details"]["nodes"] == ["node-1"]
    assert [n["status"] for n in record["nodes"]] == ["ok", "ok"]


# == nodes named in --nodes that never came ====================================================

def _roster(world_size: int, expected: list[str], joined: dict[int, str]) -> cluster.Roster:
    roster = cluster.Roster(JoinedStore({r: {"name": n, "host": n} for r, n in joined.items()}), world_size, expected, Options(join_timeout=1), time.monotonic() - 10)
    roster.poll()  # the join deadline has passed: who has not joined is missing
    return roster


def test_nodes_named_in_nodes_beyond_the_world_size_are_reported_missing(tmp_path):
    """An elastic torchrun started the job with the 2 nodes that came, in its own rank order;
    --nodes named 3: the third is in the report as never joined."""
    roster = _roster(2, ["node-a", "node-b", "node-c"], {0: "node-c", 1: "node-a.cluster.local"})
    settled = roster.settle_names()
    assert settled.absent == ["node-b"] and settled.unnamed == 0
    entries = cluster.node_entries(roster.nodes, {}, {}, settled)
    launch = cluster.Launch("torchrun", 0, 2, "127.0.0.1", 29400)
    record = cluster.cluster_record(launch, Options(quick=True), "2026-01-01T00:00:00Z", 1.0, entries, None, [])
    missing = _node(record, "node-b")
    assert missing["status"] == "missing" and missing["rank"] is None
    assert missing["reason"] == "it never joined: named in --nodes, but the launcher started the job with 2 nodes without it"
    assert "node-b is missing" in _finding(record, "cluster.nodes", "node:node-b")["summary"]

    from rich.console import Console

    from gpuvet.report import cluster_view

    console = Console(record=True, width=200, color_system=None)
    cluster_view.render(record, console)
    text = console.export_text()
    assert "3 nodes, 0 reported" in text
    assert next(line for line in text.splitlines() if "node-b" in line).split()[:2] == ["MISSING", "node-b"]


def test_ranks_that_never_joined_take_the_expected_names_nobody_else_took():
    roster = _roster(3, ["a", "b", "c"], {0: "a", 2: "b"})  # rank 2 is b: torchrun's order, not --nodes'
    assert roster.settle_names().absent == []
    assert [(n.rank, n.name, n.state) for n in roster.nodes] == [(0, "a", "joined"), (1, "c", "missing"), (2, "b", "joined")]


def test_an_elastic_torchrun_starts_without_the_node_that_never_came_and_names_it(tmp_path):
    """Real torchrun, the rendezvous --print-launch prints (--nnodes 1:2, last_call_timeout): one
    node of two comes; the run goes on with it, and the other is named missing."""
    from gpuvet.bench.net import free_port

    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip(f"no torchrun next to {sys.executable}")
    out = tmp_path / "cluster.json"
    command = [str(torchrun), "--nnodes", "1:2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
               "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-id", f"gpuvet-test-{uuid.uuid4().hex[:6]}",
               "--rdzv-conf", "join_timeout=60,last_call_timeout=1", "--max-restarts", "0",
               "-m", "gpuvet.cluster", "--device", "cpu", "--quick", "--nodes", "node-0,node-1", "--node-name", "node-0",
               "--db", str(tmp_path / "node-0.sqlite3"), "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": SRC, "NO_COLOR": "1"}
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=GUARD_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("torchrun still running")
    record = json.loads(out.read_text())
    assert [(n["name"], n["status"]) for n in record["nodes"]] == [("node-0", "ok"), ("node-1", "missing")], stderr[-2000:]
    assert "never joined" in _node(record, "node-1")["reason"]
    assert "MISSING node-1" in " ".join(stdout.split())


def test_a_node_started_after_the_run_began_is_refused_and_the_others_go_on(tmp_path):
    """Real torchrun, the rendezvous --print-launch prints (--nnodes 1:3): two nodes start and the
    run begins; a third comes later. torchrun would restart everyone's workers to take it in;
    rank 0 closed the rendezvous, so the late node is refused (RendezvousClosedError) and the two
    finish, with the third counted from torchrun's --nnodes: "1 node never joined (expected 3)"."""
    from gpuvet.bench.net import free_port

    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip(f"no torchrun next to {sys.executable}")
    out, endpoint, rdzv_id = tmp_path / "cluster.json", f"127.0.0.1:{free_port()}", f"gpuvet-test-{uuid.uuid4().hex[:6]}"
    go = tmp_path / "go"  # node-a and node-b hold before their vet until the late node has been seen
    env = {**os.environ, "PYTHONPATH": SRC, "NO_COLOR": "1"}
    agents: dict[str, subprocess.Popen] = {}

    def start(name: str) -> None:
        command = [str(torchrun), "--nnodes", "1:3", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                   "--rdzv-endpoint", endpoint, "--rdzv-id", rdzv_id, "--rdzv-conf", "join_timeout=60,last_call_timeout=1",
                   "--max-restarts", "0", "-m", "gpuvet.cluster", "--device", "cpu", "--quick", "--node-name", name,
                   "--allreduce-max-mib", "1", "--ring-mib", "1", "--db", str(tmp_path / f"{name}.sqlite3"), "--out", str(out),
                   "--test-hold-until", str(go)]
        with open(tmp_path / f"{name}.out", "wb") as stdout, open(tmp_path / f"{name}.err", "wb") as stderr:
            agents[name] = subprocess.Popen(command, stdout=stdout, stderr=stderr, env=env, start_new_session=True)

    def text(name: str, kind: str) -> str:
        return (tmp_path / f"{name}.{kind}").read_text(errors="replace")

    def wait_until(condition, what: str) -> None:
        deadline = time.monotonic() + GUARD_S
        while not condition():
            if time.monotonic() > deadline:
                pytest.fail(f"never saw {what}: " + " | ".join(text(n, "err")[-1500:] for n in agents))
            time.sleep(0.2)

    try:
        start("node-a")
        start("node-b")
        wait_until(lambda: any("rendezvous is closed" in text(n, "err") for n in agents), "the rendezvous closed")
        start("node-c")
        assert agents["node-c"].wait(timeout=GUARD_S) != 0
        go.touch()
        assert "RendezvousClosedError" in text("node-c", "err")
        # Rank 0 writes the record; the other node prints the cluster verdict (its torchrun may then
        # wait at its exit barrier for rank 0's, which a failing worker never reaches).
        wait_until(lambda: out.exists() and any("cluster verdict" in text(n, "out") for n in ("node-a", "node-b")),
                   "the cluster record and the member's verdict")
    finally:
        for proc in agents.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
    record = json.loads(out.read_text())
    assert record["launcher"]["world_size"] == 2
    assert sorted((n["name"], n["status"]) for n in record["nodes"]) == [("(unnamed) #1", "missing"), ("node-a", "ok"),
                                                                         ("node-b", "ok")]
    assert _finding(record, "cluster.nodes", "cluster")["summary"] == "1 node never joined (expected 3, 2 joined)"
    for name in ("node-a", "node-b"):
        assert "will restart worker group" not in text(name, "err")
    report = " ".join(text("node-a", "out").split() + text("node-b", "out").split())
    assert "1 node never joined (expected 3, 2 joined)" in report and "3 nodes, 2 reported, 1 missing" in report
