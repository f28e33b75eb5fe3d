"""The cluster judgement (judge/cluster/) and its report, on records of SYNTHETIC clusters.

Every synthetic node is the real record `gpuvet inspect` makes of the 8x H100 capture
(tests/fixtures/smi_text/q-8x-h100-sxm-vm-swpowercap-535.183.01.txt), with invented benchmark
figures, network facts and faults added: no machine here has eight GPUs, let alone 1,000 nodes.
`benchmarks/cluster_scale.py` times the same generator at 100 / 1,000 / 5,000 nodes.
"""

from __future__ import annotations

import copy
import random
import re

import pytest
from rich.console import Console

from gpuvet.judge.cluster import (ALLREDUCE_BUSBW, NOTE, RING, FAILED, MISSING, STOPPED, NodeEntry,
                                  RingPair,
                                  attribute_ring, judge_cluster, natural_key, robust_baseline)
from gpuvet.record import FAIL, PASS, SKIP, WARN, Measurement

from cluster_synthetic import (CAPTURE, HEALTHY, RING_GBS, _host, _node_record, synthetic_cluster,  # noqa: F401
                               template_record)

@pytest.fixture(scope="module")
def template() -> dict:
    return template_record()


# -- 1,000 nodes x 8 GPUs ------------------------------------------------------------------------

def test_a_thousand_synthetic_nodes_are_judged_and_the_faults_are_named(template):
    # How fast this is judged is a figure, not a unit test: benchmarks/cluster_scale.py prints it.
    entries, cross, faults = synthetic_cluster(1000, template=template)
    judgement = judge_cluster(entries, cross)

    stragglers = {(s.node, s.subject, s.metric): s for s in judgement.stragglers}
    assert set(stragglers) == ({("node-0017", "gpu3", "gemm.bf16"), ("node-0333", "gpu5", "membw.copy")}
                               | {("node-0500", f"gpu{i}", "gemm.bf16") for i in range(8)})
    assert stragglers[("node-0017", "gpu3", "gemm.bf16")].status == FAIL  # 62%: more than twice the tolerance below
    assert stragglers[("node-0500", "gpu0", "gemm.bf16")].status == WARN  # 86%
    bf16 = next(b for b in judgement.baselines if b.metric == "gemm.bf16")
    assert bf16.value == pytest.approx(760, rel=0.01) and bf16.total == 8000

    uniform = {row.field: row for row in judgement.uniformity}
    assert uniform["driver"].value == "535.183.01" and uniform["driver"].odd == {"550.54.15": ["node-0900"]}
    assert uniform["power limit"].odd == {"500 W": ["node-0500"]}
    assert uniform["GPU model"].uniform and uniform["GPU count"].uniform
    assert list(uniform["network"].odd.values()) == [["node-0777"]]

    assert set(judgement.ring.suspect_nodes) == {"node-0042"}
    assert [(p.src, p.dst) for p in judgement.ring.suspect_links] == [("node-0100", "node-0101")]

    allreduce = next(f for f in judgement.findings if f.check == "cluster.allreduce")
    assert allreduce.status == WARN and "node-0777" in allreduce.summary  # NCCL falls back to TCP there

    # One line per node, worst first, by the cluster's own evidence: the slow NIC (12% of the
    # typical ring pair) leads, then the stragglers, then the odd ones out; the rest after.
    assert len(judgement.rows) == 1000
    assert [r.name for r in judgement.rows[:6]] == ["node-0042", "node-0017", "node-0333", "node-0500", "node-0777", "node-0900"]
    rows = {r.name: r for r in judgement.rows[:6]}
    assert "slow with every ring partner" in rows["node-0042"].headline and "12% of the typical pair" in rows["node-0042"].headline
    assert "gpu3" in rows["node-0017"].headline and "62%" in rows["node-0017"].headline
    assert "odd one out: driver 550.54.15 (most nodes: 535.183.01)" in rows["node-0900"].headline
    assert "odd one out: network" in rows["node-0777"].headline and "no RDMA" in rows["node-0777"].headline
    assert "odd one out: power limit 500 W" in rows["node-0500"].headline


def test_the_baseline_is_not_dragged_down_by_many_slow_nodes(template):
    """30% of the nodes 20% slow: a mean would sit 6% low and hide the mildly slow; the robust
    baseline stays on the healthy nodes and names every slow one."""
    entries, _, _ = synthetic_cluster(100, seed=3, template=template)
    slow = {e.name for e in entries[::3][:30]}
    for e in entries:
        if e.name in slow:
            e.record = {**e.record, "measurements": [{**m, "value": m["value"] * 0.8} if m["name"] == "gemm.bf16" else m
                                                     for m in e.record["measurements"]]}
    judgement = judge_cluster(entries, [])
    bf16 = next(b for b in judgement.baselines if b.metric == "gemm.bf16")
    assert bf16.value == pytest.approx(760, rel=0.01)
    named = {s.node for s in judgement.stragglers if s.metric == "gemm.bf16"}
    assert slow <= named


# -- robust baseline -----------------------------------------------------------------------------

def test_robust_baseline_drops_the_bad_side_and_stops():
    base, threshold, kept, _ = robust_baseline([100.0] * 8 + [50.0, 40.0], tolerance=0.1)
    assert (base, threshold, kept) == (100.0, 0.1, 8)


def test_noise_wider_than_the_tolerance_widens_the_threshold_instead_of_naming_innocent_nodes():
    rng = random.Random(1)
    values = [100 * (1 + rng.uniform(-0.2, 0.2)) for _ in range(200)]
    base, threshold, kept, spread = robust_baseline(values, tolerance=0.1)
    assert threshold > 0.3 and kept == 200


def test_lower_is_better_figures_flag_the_slow_side():
    base, threshold, kept, _ = robust_baseline([5.0] * 9 + [20.0], tolerance=0.3, higher_is_better=False)
    assert base == 5.0 and kept == 9


def test_nothing_to_compare_with_fewer_than_two_values():
    assert robust_baseline([5.0], 0.1) is None and robust_baseline([], 0.1) is None


# -- nodes, rows, uniformity ----------------------------------------------------------------------

def test_missing_and_failed_nodes_are_named_and_listed_first(template):
    entries, cross, _ = synthetic_cluster(4, template=template)
    entries[1] = NodeEntry("node-0001", 1, FAILED, "it stopped answering (no heartbeat for 60 s)", "cross-node measurements",
                           record=entries[1].record)
    entries.append(NodeEntry("node-0004", 4, MISSING, "it never joined (waited 300 s)"))
    judgement = judge_cluster(entries, cross)
    nodes = {f.subject: f for f in judgement.findings if f.check == "cluster.nodes"}
    assert nodes["node:node-0004"].status == FAIL and "never joined" in nodes["node:node-0004"].summary
    assert "cross-node measurements" in nodes["node:node-0001"].summary
    assert [r.badge for r in judgement.rows[:2]] == ["MISSING", "FAILED"]


def test_a_node_the_stop_cut_short_is_not_vetted_not_failed(template):
    entries, cross, _ = synthetic_cluster(3, template=template)
    entries[2] = NodeEntry("node-0002", 2, STOPPED, "still at local vet when the run was stopped after 42 s", "local vet")
    judgement = judge_cluster(entries, cross, {"stopped": "SIGINT received during the local vets"})
    stopped = next(f for f in judgement.findings if f.check == "cluster.nodes" and f.subject == "node:node-0002")
    assert stopped.status == SKIP and stopped.summary == ("node-0002 was not vetted to its end: still at local vet "
                                                         "when the run was stopped after 42 s")
    row = next(r for r in judgement.rows if r.name == "node-0002")
    assert row.badge == "STOPPED" and "after 42 s" in row.headline
    assert not any(f.status == FAIL for f in judgement.findings if f.subject.startswith("node:"))
    run = next(f for f in judgement.findings if f.check == "cluster.run")  # the run, not the node, failed
    assert run.status == FAIL


def test_the_nodes_own_problems_are_grouped_by_check(template):
    entries, _, _ = synthetic_cluster(5, template=template)
    judgement = judge_cluster(entries, [])
    throttle = next(f for f in judgement.findings if f.check == "cluster.node_checks" and f.subject == "gpu.throttle")
    assert throttle.status == FAIL and "5 of 5 nodes" in throttle.summary  # the capture's gpu2 is power-braked


def test_quick_records_have_no_straggler_figures():
    record = {"machine": {"gpus": []}, "measurements": [], "findings": [], "verdict": PASS}
    judgement = judge_cluster([NodeEntry("a", 0, record=record), NodeEntry("b", 1, record=record)], [])
    stragglers = next(f for f in judgement.findings if f.check == "cluster.stragglers")
    assert stragglers.status == SKIP and "--quick" in stragglers.summary


def test_natural_order_of_names():
    assert sorted(["node10", "node2", "node1"], key=natural_key) == ["node1", "node2", "node10"]


# -- cross-node ----------------------------------------------------------------------------------

def _allreduce(busbw: float, backend: str = "nccl", members=("a", "b"), check_ok: bool = True) -> Measurement:
    return Measurement(ALLREDUCE_BUSBW, busbw, "GB/s", "cluster", {"members": list(members), "backend": backend,
                                                                   "ranks_per_node": 1, "largest_bytes": 1 << 26,
                                                                   "check_ok": check_ok, "sizes": []})


def _two_nodes(host: dict | None) -> list[NodeEntry]:
    record = {"machine": {"gpus": [], "host": host}, "measurements": [], "findings": [], "verdict": PASS}
    return [NodeEntry("a", 0, record=record), NodeEntry("b", 1, record=record)]


def _check(judgement, check: str):
    return next(f for f in judgement.findings if f.check == check)


def test_allreduce_is_judged_against_the_rdma_ports_on_nccl_and_the_nic_on_gloo():
    nodes = _two_nodes(_host())  # 8 x 400 Gb/s = 400 GB/s RDMA; 100 Gbit/s = 12.5 GB/s Ethernet
    assert _check(judge_cluster(nodes, [_allreduce(300.0)]), "cluster.allreduce").status == PASS
    assert _check(judge_cluster(nodes, [_allreduce(60.0)]), "cluster.allreduce").status == FAIL
    gloo = _check(judge_cluster(nodes, [_allreduce(10.0, "gloo")]), "cluster.allreduce")
    assert gloo.status == PASS and "100 Gbit/s Ethernet" in gloo.summary


def test_gloo_is_not_held_to_nccls_bar_but_warns_far_below_the_nic():
    nodes = _two_nodes(_host())  # 100 Gbit/s = 12.5 GB/s Ethernet
    one_stream = _check(judge_cluster(nodes, [_allreduce(2.0, "gloo")]), "cluster.allreduce")
    assert one_stream.status == PASS and "16% of ~12.5 GB/s" in one_stream.summary  # NCCL at 16% would FAIL
    crawling = _check(judge_cluster(nodes, [_allreduce(0.3, "gloo")]), "cluster.allreduce")
    assert crawling.status == WARN and "far below the NIC" in crawling.summary and "iperf3" in crawling.remedy


def test_allreduce_wrong_sums_fail_and_unknown_links_are_not_passed():
    assert _check(judge_cluster(_two_nodes(_host()), [_allreduce(300.0, check_ok=False)]), "cluster.allreduce").status == FAIL
    unknown = _check(judge_cluster(_two_nodes(None), [_allreduce(0.292, "gloo")]), "cluster.allreduce")
    assert unknown.status == SKIP
    assert "0.292 GB/s measured, not judged: no NIC link rate known" in unknown.summary
    assert "`ethtool IFACE`" in unknown.remedy and "`ibstat`" in unknown.remedy


def test_an_aborted_cross_node_phase_fails_with_the_reason_and_a_skipped_one_skips():
    aborted = Measurement(NOTE, None, "", "cluster", {"outcome": "aborted", "reason": "aborted: b: it stopped answering"})
    judgement = judge_cluster(_two_nodes(None), [aborted])
    assert _check(judgement, "cluster.allreduce").status == FAIL and "b: it stopped" in _check(judgement, "cluster.ring").summary
    assert "no node was behind the others" in _check(judgement, "cluster.allreduce").remedy
    skipped = Measurement(NOTE, None, "", "cluster", {"outcome": "skipped", "reason": "needs at least 2 nodes ready; 1 was"})
    assert _check(judge_cluster(_two_nodes(None), [skipped]), "cluster.allreduce").status == SKIP


def test_with_two_nodes_a_slow_direction_is_a_link_not_a_node():
    pairs = [RingPair("a", "b", 10.0, transfers=3), RingPair("b", "a", 2.0, transfers=3)]
    verdict = attribute_ring(pairs)
    assert verdict.suspect_nodes == {} and [(p.src, p.dst) for p in verdict.suspect_links] == [("b", "a")]


def test_a_pair_is_judged_on_the_median_of_its_transfers():
    ring = [Measurement(RING, gbps, "GB/s", "a->b", {"src": "a", "dst": "b", "round": i}) for i, gbps in enumerate((10, 10.5, 0.5))]
    ring += [Measurement(RING, 10.0, "GB/s", "b->a", {"src": "b", "dst": "a", "round": i}) for i in range(3)]
    assert _check(judge_cluster(_two_nodes(None), ring), "cluster.ring").status == PASS


def test_a_failed_transfer_names_its_pair():
    ring = [Measurement(RING, 10.0, "GB/s", "a->b", {"src": "a", "dst": "b", "round": 0}),
            Measurement(RING, None, "GB/s", "b->a", {"src": "b", "dst": "a", "round": 0, "error": "Connection reset"})]
    finding = _check(judge_cluster(_two_nodes(None), ring), "cluster.ring")
    assert finding.status == FAIL and finding.subject == "link:b->a" and "Connection reset" in finding.summary


# -- the report ----------------------------------------------------------------------------------

def _rendered(record: dict, verbose: bool = False) -> str:
    from gpuvet.report import cluster_view

    console = Console(record=True, width=220, highlight=False, color_system=None)
    cluster_view.render(record, console, verbose=verbose)
    return console.export_text()


def _cluster_record(entries, cross) -> dict:
    from gpuvet.cluster import Launch, Options, cluster_record

    launch = Launch("slurm", 0, len(entries), "node-0000", 20001, job_id="slurm-42")
    return cluster_record(launch, Options(quick=False), "2026-01-01T00:00:00Z", 12.0, entries, None, cross)


def test_the_report_has_one_line_per_node_worst_first_and_the_sections(template):
    entries, cross, _ = synthetic_cluster(40, template=template)
    entries[-1] = NodeEntry("node-0039", 39, MISSING, "it never joined (waited 300 s)")
    text = _rendered(_cluster_record(entries, cross), verbose=True)
    node_lines = [line for line in text.splitlines() if " rank " in line]
    assert len(node_lines) == 40
    assert node_lines[0].split()[:2] == ["MISSING", "node-0039"] and "node-0017" in node_lines[1]
    for section in ("Stragglers", "Uniformity", "Cross-node", "Problems"):
        assert f"\n{section}" in text
    assert "node-0017 gpu3" in text and "62% of" in text
    assert text.rstrip().splitlines()[-1].startswith("FAIL")


def test_passing_nodes_are_counted_not_listed_beyond_twenty():
    record = {"machine": {"gpus": []}, "measurements": [], "findings": [], "verdict": PASS}
    entries = [NodeEntry(f"n{i}", i, record=record) for i in range(30)]
    text = _rendered(_cluster_record(entries, []))
    assert "... and 10 more nodes PASS" in text
    assert len([line for line in text.splitlines() if " rank " in line]) == 20


def test_a_saved_cluster_record_is_judged_again_the_same(template):
    import json

    from gpuvet.cluster import rejudge_cluster

    entries, cross, _ = synthetic_cluster(12, template=template)
    record = json.loads(json.dumps(_cluster_record(entries, cross)))
    again = rejudge_cluster(copy.deepcopy(record))
    assert again["findings"] == record["findings"] and again["summary"] == record["summary"]


def test_nccl_pairs_far_below_the_network_warn_but_gloo_streams_do_not():
    nodes = _two_nodes(_host())  # 400 GB/s RDMA, 12.5 GB/s Ethernet

    def ring(gbps: float, backend: str) -> list[Measurement]:
        return [Measurement(RING, gbps, "GB/s", f"{s}->{d}", {"src": s, "dst": d, "round": 0, "backend": backend})
                for s, d in (("a", "b"), ("b", "a"))]

    assert _check(judge_cluster(nodes, ring(40.0, "nccl")), "cluster.ring").status == WARN  # 10% of 400 GB/s
    assert _check(judge_cluster(nodes, ring(300.0, "nccl")), "cluster.ring").status == PASS
    assert _check(judge_cluster(nodes, ring(2.0, "gloo")), "cluster.ring").status == PASS  # one TCP stream


def test_the_node_behind_in_the_cross_node_phase_is_named_in_its_row_and_the_fix():
    aborted = Measurement(NOTE, None, "", "cluster", {
        "outcome": "aborted", "nodes": ["b"], "behind": {"b": "opening its device"}, "others_reached": "init_process_group",
        "reason": "aborted: the cross-node measurements did not finish in time (deadline reached on this node); "
                  "b stopped at opening its device while the others reached init_process_group"})
    nodes = _two_nodes(None)
    nodes[1].saved_run = 7
    judgement = judge_cluster(nodes, [aborted])
    stuck = next(f for f in judgement.findings if f.check == "cluster.nodes")
    assert stuck.subject == "node:b" and stuck.status == FAIL and "stuck at opening its device" in stuck.summary
    assert "`gpuvet show 7` on b" in stuck.remedy
    assert "held up by b (stuck at opening its device)" in _check(judgement, "cluster.allreduce").remedy
    assert judgement.rows[0].name == "b" and judgement.rows[0].badge == "FAIL"
    assert "held up the cross-node phase: stuck at opening its device while the others reached init_process_group" in judgement.rows[0].headline


@pytest.mark.parametrize("step", ["starting Python", "importing torch"])
def test_a_node_whose_ranks_did_not_start_in_the_limit_is_slow_not_failed(step):
    """A busy node starts processes slowly: its ranks still starting Python or importing torch
    when the start-up limit passes is said, as a warning naming the node and the limit, and the
    cross-node tests are not measured (skipped), never a FAIL of a healthy node."""
    slow = Measurement(NOTE, None, "", "cluster", {
        "outcome": "skipped", "nodes": ["b"], "behind": {"b": step}, "others_reached": "waiting for every rank to start",
        "start_timeout_s": 180.0,
        "reason": f"not measured: the cross-node ranks of b did not start within 180 s; b stopped at {step} while the "
                  "others reached waiting for every rank to start (a loaded machine? see `uptime` there)"})
    judgement = judge_cluster(_two_nodes(None), [slow])
    node_b = next(f for f in judgement.findings if f.check == "cluster.nodes" and f.subject == "node:b")
    assert node_b.status == WARN
    assert node_b.summary.startswith(f"b: its cross-node ranks did not start within 180 s (still at '{step}' while the "
                                     "others reached waiting for every rank to start): a loaded machine? see `uptime`")
    assert _check(judgement, "cluster.allreduce").status == SKIP
    assert not [f for f in judgement.findings if f.status == FAIL]
    row = next(r for r in judgement.rows if r.name == "b")
    assert row.badge != "FAIL" and "did not start in time" in row.headline and "held up" not in row.headline


def test_falling_back_to_gloo_is_a_warning_naming_the_nodes_without_gpu(template):
    from gpuvet.judge.cluster import FALLBACK

    entries, _, _ = synthetic_cluster(3, template=template)
    fallback = Measurement(FALLBACK, None, "", "cluster", {"backend": "gloo", "device": "cpu", "without_gpu": ["node-0001"]})
    record = _cluster_record(entries, [fallback, _allreduce(2.0, "gloo", members=[e.name for e in entries])])
    finding = next(f for f in record["findings"] if f["check"] == "cluster.fallback")
    assert finding["status"] == WARN and "no usable GPU on node-0001" in finding["summary"]
    text = _rendered(record)
    cross = text[text.index("\nCross-node"):text.index("\nProblems")]
    assert "WARN    cross-node tests ran over gloo on the CPUs, not NCCL on the GPUs: no usable GPU on node-0001" in cross


def test_the_allreduce_sizes_are_listed_under_the_allreduce_not_the_ring(template):
    entries, cross, _ = synthetic_cluster(4, template=template)
    lines = _rendered(_cluster_record(entries, cross)).splitlines()
    start = next(i for i, line in enumerate(lines) if "cross-node all-reduce" in line)
    assert "1 MiB" in lines[start + 1] and "1 GiB" in lines[start + 2] and "node-to-node transfers" in lines[start + 3]


def test_a_gpu_running_x8_in_an_x16_slot_is_not_uniform(template):
    entries, _, _ = synthetic_cluster(3, template=template)
    record = copy.deepcopy(entries[2].record)  # SYNTHETIC: gpu0's link trained at x8
    pcie = record["machine"]["gpus"][0]["pcie"]
    pcie["readings"] = [{**r, "current_width": 8} for r in pcie["readings"]]
    entries[2].record = record
    uniform = {row.field: row for row in judge_cluster(entries, []).uniformity}
    assert uniform["PCIe link"].value == "Gen5 x16" and list(uniform["PCIe link"].odd.values()) == [["node-0002"]]
    assert "(runs x8)" in next(iter(uniform["PCIe link"].odd))


def test_a_failed_nodes_last_step_is_said_once():
    entries = _two_nodes(None)
    entries[1] = NodeEntry("b", 1, FAILED, "the local vet did not finish in 120 s (last step: starting)", "local vet",
                           record=entries[1].record)
    finding = next(f for f in judge_cluster(entries, []).findings if f.check == "cluster.nodes")
    assert finding.summary.count("last step") == 1


def test_the_fix_for_a_nodes_own_problem_is_gpuvet_show_with_its_run(template):
    entries, _, _ = synthetic_cluster(2, template=template)
    entries[0].saved_run = 12
    record = _cluster_record(entries, [])
    throttle = next(f for f in record["findings"] if f["check"] == "cluster.node_checks" and f["subject"] == "gpu.throttle")
    assert "`gpuvet show 12` on node-0000" in throttle["remedy"] and "gpuvet report" not in throttle["remedy"]
    row = next(line for line in _rendered(record).splitlines() if " node-0000 " in line)
    assert "run 12" in row


def test_one_node_is_one_node_in_the_header():
    record = {"machine": {"gpus": []}, "measurements": [], "findings": [], "verdict": PASS}
    assert "· 1 node, 1 reported ·" in _rendered(_cluster_record([NodeEntry("a", 0, record=record)], []))


# -- Markdown, HTML, redaction ---------------------------------------------------------------------

def test_markdown_and_html_carry_what_the_terminal_shows(template):
    from gpuvet.report import cluster_view

    entries, cross, _ = synthetic_cluster(40, template=template)
    entries[5].saved_run = 31
    record = _cluster_record(entries, cross)
    markdown = cluster_view.render_markdown(record)
    assert markdown.startswith("# gpuvet cluster slurm-42\n") and "**FAIL: something is wrong with this cluster**" in markdown
    assert "| FAIL | node-0017 | rank 17 |" in markdown and "| run 31 |" in markdown
    for section in ("## Nodes (worst first)", "## Stragglers", "## Uniformity across nodes", "## Cross-node", "## Problems"):
        assert section in markdown
    assert "node-0017 gpu3" in markdown and "62% of" in markdown

    page = cluster_view.render_html(record)
    assert page.startswith("<!doctype html>") and "<style>" in page and "http" not in page.split("<body>")[1]
    assert "<td>node-0017</td>" in page and "<td>run 31</td>" in page and "62% of" in page
    assert "FAIL: something is wrong with this cluster" in page


def test_a_redacted_cluster_record_names_no_node_and_reads_the_same(template):
    import json

    from gpuvet.report import cluster_view

    entries, cross, _ = synthetic_cluster(6, template=template)
    record = _cluster_record(entries, cross)
    record["launcher"]["master"] = "10.1.2.3:29400"
    before = json.dumps(record)
    clean = cluster_view.redact_cluster(record)
    text = json.dumps(clean)
    assert json.dumps(record) == before  # the record passed in is not changed
    assert not [name for name in (e.name for e in entries) if name in text] and "10.1.2.3" not in text
    serials = {g["serial"] for g in entries[0].record["machine"]["gpus"] if g.get("serial")}
    assert serials and not [s for s in serials if s in text]
    token = clean["nodes"][1]["name"]
    assert token.startswith("HOST-REDACTED-")
    assert clean["nodes"][1]["record"]["options"].get("cluster", {}).get("node", token) == token
    assert any(m["subject"].startswith(f"{token}->") or m["subject"].endswith(f"->{token}") for m in clean["cross_node"]["measurements"])
    assert clean["options"]["redacted"] is True
    assert "HOST-REDACTED-" in cluster_view.render_markdown(clean)


def test_every_fail_and_warn_is_counted_in_problems_with_its_fix_once(template):
    """Stragglers and odd nodes have sections of their own for their figures, but their fix is in
    Problems, counted with the rest, in every format."""
    from gpuvet.report import cluster_view

    entries, cross, _ = synthetic_cluster(120, template=template)  # node-0017 gpu3 at 62% bf16 GEMM
    odd = entries[3].record
    entries[3].record = {**odd, "machine": {**odd["machine"], "driver": {**odd["machine"]["driver"], "version": "550.54.15"}}}
    record = _cluster_record(entries, cross)
    fails = sum(f["status"] == FAIL for f in record["findings"])
    warns = sum(f["status"] == WARN for f in record["findings"])
    assert any(f["check"] == "cluster.stragglers" and f["status"] == FAIL for f in record["findings"])
    assert any(f["check"] == "cluster.uniform" and f["status"] == WARN for f in record["findings"])
    counts = f"Problems ({fails} failed, {warns} warning{'' if warns == 1 else 's'})"
    straggler_fix, uniform_fix = "PERFORMANCE,POWER,CLOCK", "drain them or ask the provider to align them"
    for text in (_rendered(record), _rendered(record, verbose=True), cluster_view.render_markdown(record),
                 cluster_view.render_html(record)):
        flat = " ".join(text.split())
        assert counts.replace("Problems (", "Problems <small>(") in flat or counts in flat.replace("## ", "")
        assert flat.count(straggler_fix) == 1 and flat.count(uniform_fix) == 1


def test_the_html_page_plots_each_compared_figure_across_nodes_with_baseline_and_threshold(template):
    from gpuvet.report import cluster_view

    entries, cross, _ = synthetic_cluster(40, template=template)  # node-0017 gpu3 at 62% bf16 GEMM
    record = _cluster_record(entries, cross)
    page = cluster_view.render_html(record)
    assert "<h2>Spread across nodes</h2>" in page
    bf16 = next(svg for svg in cluster_view.spread_plots(record) if "bf16 GEMM (per GPU) across nodes" in svg)
    gpus = sum(len(e.record["machine"]["gpus"]) for e in entries if e.record)
    assert bf16.count("<circle") == gpus + 1  # every GPU's dot, and the legend's
    assert re.search(r"<title>node-0017 gpu3: [\d,.]+ TFLOPS</title>", bf16)  # hover names the straggler
    assert "baseline " in bf16 and "straggler below " in bf16


def test_different_nccl_on_one_node_fails_uniformity_as_the_seeds_version_mismatch(template):
    entries, _, _ = synthetic_cluster(3, template=template)
    for n, entry in enumerate(entries):  # SYNTHETIC: the NCCL each node's PyTorch carries (stack.nccl)
        record = copy.deepcopy(entry.record)
        record["machine"]["stack"] = record["machine"].get("stack") or {}
        torch = record["machine"]["stack"].setdefault("torch", {})
        torch.update({"installed": True, "version": "2.4.1+cu124", "nccl": "2.20.5" if n == 1 else "2.21.5"})
        entry.record = record
    judgement = judge_cluster(entries, [])
    row = {row.field: row for row in judgement.uniformity}["NCCL"]
    assert row.value == "2.21.5" and list(row.odd.values()) == [["node-0001"]]
    (finding,) = [f for f in judgement.findings if f.check == "cluster.uniform" and f.subject == "NCCL"]
    assert finding.status == FAIL and "2.20.5 on node-0001" in finding.summary
