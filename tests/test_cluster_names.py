"""Cluster mode: which node is which. The node list (--nodes, or Slurm's) is matched with the nodes
that joined by Slurm's node index, by name, by short hostname and by IP address, so that a healthy
job is never reported with invented missing nodes, and a node that really is missing is named
right, or only counted when its name cannot be known."""

from __future__ import annotations

import time

from rich.console import Console

from gpuvet.cluster import Launch, Node, Options, Outputs, Roster, cluster_record, launch_from_env, node_entries

_NOWHERE = Outputs(save_run=lambda record, label: None, show=lambda record: None)  # a node that keeps and prints nothing
from gpuvet.report import cluster_view

from cluster_stubs import JoinedStore


def _roster(world_size: int, expected: list[str], joined: dict[int, dict], by_rank: bool = False) -> Roster:
    roster = Roster(JoinedStore(joined), world_size, expected, Options(join_timeout=1), time.monotonic() - 10, by_rank=by_rank)
    roster.poll()  # the join deadline has passed: who has not joined is missing
    return roster


def _report(roster: Roster, source: str, kind: str = "slurm") -> tuple[dict, str]:
    """The cluster record and report once every node that joined has finished."""
    for node in roster.nodes:
        if node.state == "joined":
            node.state = "done"
    settled = roster.settle_names(resolve=_no_dns)
    entries = node_entries(roster.nodes, {}, {}, settled, source)
    launch = Launch(kind, 0, len(roster.nodes), "10.0.0.1", 29400)
    record = cluster_record(launch, Options(quick=True), "2026-01-01T00:00:00Z", 1.0, entries, None, [])
    console = Console(record=True, width=200, color_system=None)
    cluster_view.render(record, console)
    return record, console.export_text()


def _no_dns(name: str) -> set[str]:
    return set()


def test_under_slurm_the_node_takes_slurms_name_and_its_index():
    env = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_NODEID": "1", "SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "gpu[01-02]",
           "SLURMD_NODENAME": "gpu02"}
    launch = launch_from_env(env)
    assert (launch.node_name, launch.node_index) == ("gpu02", 1)
    assert Node(launch, Options(), print, _NOWHERE).name == "gpu02"  # not the hostname, which Slurm's list may not use
    assert Node(launch, Options(node_name="mine"), print, _NOWHERE).name == "mine"


def test_a_healthy_slurm_job_whose_hostnames_differ_from_the_node_list_has_no_missing_node():
    """Slurm calls them gpu01/gpu02; the machines call themselves ip-10-0-0-5/6. Matched by place."""
    joined = {0: {"name": "ip-10-0-0-5", "host": "ip-10-0-0-5", "index": 0},
              1: {"name": "ip-10-0-0-6", "host": "ip-10-0-0-6", "index": 1}}
    roster = _roster(2, ["gpu01", "gpu02"], joined, by_rank=True)
    record, text = _report(roster, "the Slurm node list")
    assert [(n["name"], n["status"]) for n in record["nodes"]] == [("ip-10-0-0-5", "ok"), ("ip-10-0-0-6", "ok")]
    assert "2 nodes, 2 reported ·" in text and "missing" not in text.lower()
    assert next(f for f in record["findings"] if f["check"] == "cluster.nodes")["status"] == "pass"


def test_a_missing_slurm_node_gets_its_own_name_not_rank_0s():
    joined = {0: {"name": "ip-10-0-0-5", "host": "ip-10-0-0-5", "index": 0}}
    roster = _roster(2, ["gpu01", "gpu02"], joined, by_rank=True)
    record, text = _report(roster, "the Slurm node list")
    assert [(n["name"], n["status"]) for n in record["nodes"]] == [("ip-10-0-0-5", "ok"), ("gpu02", "missing")]
    assert next(line for line in text.splitlines() if "gpu02" in line).split()[:2] == ["MISSING", "gpu02"]


def test_nodes_given_as_ip_addresses_match_the_nodes_own_addresses():
    joined = {0: {"name": "node-a", "host": "node-a", "addresses": ["10.0.0.5", "fe80::1"]},
              1: {"name": "node-b", "host": "node-b", "addresses": ["10.0.0.6"]}}
    roster = _roster(2, ["10.0.0.6", "10.0.0.5"], joined)
    settled = roster.settle_names(resolve=_no_dns)
    assert (settled.absent, settled.unnamed) == ([], 0)
    record, text = _report(_roster(2, ["10.0.0.6", "10.0.0.5"], joined), "--nodes", "torchrun")
    assert "2 nodes, 2 reported ·" in text


def test_names_that_resolve_to_a_nodes_address_match_it():
    joined = {0: {"name": "ip-10-0-0-5", "host": "ip-10-0-0-5", "addresses": ["10.0.0.5"]}}
    roster = _roster(1, ["gpu-a", "gpu-b"], joined)
    settled = roster.settle_names(resolve=lambda name: {"gpu-a": {"10.0.0.5"}, "gpu-b": {"10.0.0.9"}}[name])
    assert (settled.absent, settled.unnamed) == (["gpu-b"], 0)


def test_names_that_match_no_node_are_not_invented_as_missing_nodes():
    """--nodes a,b,c; two nodes joined under other names: one node is missing, but which one is
    unknown: it is counted, not named after a node that is there."""
    joined = {0: {"name": "x", "host": "x"}, 1: {"name": "y", "host": "y"}}
    roster = _roster(2, ["a", "b", "c"], joined)
    settled = roster.settle_names(resolve=_no_dns)
    assert (settled.absent, settled.unnamed, settled.unmatched) == ([], 1, ["a", "b", "c"])
    entries = node_entries(roster.nodes, {}, {}, settled, "--nodes")
    launch = Launch("torchrun", 0, 2, "10.0.0.1", 29400)
    record = cluster_record(launch, Options(quick=True), "2026-01-01T00:00:00Z", 1.0, entries, None, [])
    finding = next(f for f in record["findings"] if f["check"] == "cluster.nodes")
    assert finding["status"] == "fail" and finding["summary"] == "1 node never joined (expected 3, 2 joined)"
    assert "the names a, b, c in --nodes match no joined node" in finding["evidence"]["measured"]


def test_the_reason_says_where_the_node_list_came_from():
    roster = _roster(2, ["gpu01", "gpu02", "gpu03"], {0: {"name": "gpu01"}, 1: {"name": "gpu03"}})
    record, _ = _report(roster, "the Slurm node list")
    missing = next(n for n in record["nodes"] if n["name"] == "gpu02")
    assert missing["reason"] == ("it never joined: named in the Slurm node list, but the launcher started the job with 2 "
                                 "nodes without it")
