"""How long rank 0's share of cluster mode takes at 100, 1,000 and 5,000 nodes (issue 7: the gather
and the report must stay fast at 1,000 nodes).

The nodes are SYNTHETIC: the real record `gpuvet inspect` makes of an 8x H100 capture, with
invented benchmark figures and faults (tests/cluster_synthetic.py, `synthetic_cluster`). Timed:

  pack      every node's record summarised and zlib-packed, as each node posts it (per node, so
            it is the sum over nodes, spread across the nodes in a real run)
  gather    rank 0 reading every packed record back from a real TCPStore on loopback in one
            multi_get, and unpacking them (the posting is done beforehand, not timed)
  judge     stragglers, uniformity, ring attribution, the cross-node verdict (judge_cluster)
  record    the cluster record as JSON (cluster_record + json.dumps)
  report    the terminal report, rendered into a console that discards it; and `gpuvet report` of the
            record in a process of its own (CPU seconds, peak memory)

Goal (issue 28): at 4,000 nodes at most 10 KB of cluster record a node, `gpuvet report` under 5 s of
CPU and 300 MB: each node ships what the cluster is judged on (summarise_record), its whole record
stays in its own store.

    .venv/bin/python benchmarks/cluster_scale.py                 # 100, 1000, 5000 nodes
    .venv/bin/python benchmarks/cluster_scale.py --nodes 1000 --no-store
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import zlib
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

from rich.console import Console  # noqa: E402

from gpuvet.cluster import Launch, Options, cluster_record, summarise_record  # noqa: E402
from gpuvet.report import cluster_view  # noqa: E402
from cluster_synthetic import synthetic_cluster, template_record  # noqa: E402


def timed(fn):
    started = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - started


def pack(record: dict) -> bytes:
    return zlib.compress(json.dumps(summarise_record(record), separators=(",", ":")).encode(), 6)


def gather_through_store(blobs: list[bytes]) -> float:
    """Seconds for rank 0 to read every posted record from a TCPStore and unpack it."""
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=60), wait_for_workers=False)
    keys = [f"record/{rank}" for rank in range(len(blobs))]
    for key, blob in zip(keys, blobs):
        store.set(key, blob)
    started = time.perf_counter()
    [json.loads(zlib.decompress(blob)) for blob in store.multi_get(keys)]
    return time.perf_counter() - started


def report_of(text: str) -> tuple[float, float]:
    """`gpuvet report cluster.json` in a process of its own: its CPU seconds and peak memory (MB)."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "cluster.json"
        path.write_text(text)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([sys.executable, "-m", "gpuvet", "report", str(path)], check=False, stdout=subprocess.DEVNULL,
                       env={**os.environ, "PYTHONPATH": str(ROOT / "src"), "COLUMNS": "200"})
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, after.ru_maxrss / 1024


def run(nodes: int, template: dict, use_store: bool) -> dict[str, float]:
    (entries, cross, _), generated = timed(lambda: synthetic_cluster(nodes, template=template))
    blobs, packing = timed(lambda: [pack(e.record) for e in entries])
    # Rank 0 judges and keeps what the nodes shipped, not their whole records.
    entries = [dataclasses.replace(e, record=json.loads(zlib.decompress(b))) for e, b in zip(entries, blobs)]
    launch = Launch("slurm", 0, nodes, "node-0000", 20000, job_id="slurm-synthetic")
    from gpuvet.judge.cluster import judge_cluster

    _, judging = timed(lambda: judge_cluster(entries, cross))
    record, building = timed(lambda: cluster_record(launch, Options(), "2026-01-01T00:00:00Z", 0.0, entries, None, cross))
    text, dumping = timed(lambda: cluster_view.to_json(record))
    console = Console(file=io.StringIO(), width=200, color_system=None, highlight=False, soft_wrap=True)  # as rank 0 prints
    _, rendering = timed(lambda: cluster_view.render(record, console))
    report_cpu_s, report_mb = report_of(text)
    return {"report_cpu_s": report_cpu_s, "report_max_rss_mb": report_mb,"nodes": nodes, "generate_s": generated, "pack_s_total": packing, "packed_kb_per_node": sum(map(len, blobs)) / nodes / 1024,
            "gather_s": gather_through_store(blobs) if use_store else float("nan"), "judge_s": judging,
            "record_s": building + dumping, "record_mb": len(text) / 1e6, "report_s": rendering}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, nargs="+", default=[100, 1000, 5000])
    parser.add_argument("--no-store", action="store_true", help="skip the TCPStore gather (no torch import)")
    args = parser.parse_args()
    template = template_record()
    print(f"{'nodes':>6} {'judge s':>8} {'gather s':>9} {'record s':>9} {'report s':>9} {'pack s (sum)':>13} "
          f"{'KiB/node':>9} {'record MB':>10} {'KB/node':>8} {'report CPU s':>13} {'report MB':>10}")
    for nodes in args.nodes:
        r = run(nodes, template, not args.no_store)
        print(f"{r['nodes']:>6} {r['judge_s']:>8.3f} {r['gather_s']:>9.3f} {r['record_s']:>9.3f} {r['report_s']:>9.3f} "
              f"{r['pack_s_total']:>13.3f} {r['packed_kb_per_node']:>9.1f} {r['record_mb']:>10.1f} "
              f"{r['record_mb'] * 1000 / r['nodes']:>8.1f} {r['report_cpu_s']:>13.2f} {r['report_max_rss_mb']:>10.0f}")


if __name__ == "__main__":
    main()
