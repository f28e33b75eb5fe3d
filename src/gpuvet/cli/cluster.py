"""The command line: `gpuvet cluster` and `python -m gpuvet.cluster` (the click command), main and
finish."""

from __future__ import annotations

import os
import shlex
import socket
import sys
from typing import Any, Callable

import click

from ..cluster.cross import RankThread
from ..cluster.flow import run_node
from ..cluster.launch import LaunchError, expand_hostlist, launch_from_env, launch_help, print_launch
from ..cluster.node import EXIT_USAGE
from ..cluster.options import CPU_ALLREDUCE_MAX_MIB, CPU_RING_MIB, GPU_ALLREDUCE_MAX_MIB, GPU_RING_MIB, RING_ROUNDS, Options
from ..cluster.options import Outputs
from ..cluster.record import check_out_path
from ..private_file import write_private


def torch_missing() -> str | None:
    """Said before the launch line on a machine whose gpuvet has no PyTorch: torchrun comes with
    it, and every node's gpuvet measures with it, so the printed line would fail on each node."""
    from ..facts import Machine
    from ..probe import nvml
    from ..probe.stack import find_torch
    from ..specs.torch_wheels import torch_install

    if find_torch().installed:
        return None
    driver, gpus, _, _ = nvml.collect()
    pip = f"{shlex.quote(sys.executable)} -m pip"  # gpuvet's own environment, by path
    return (f"# PyTorch is not installed in gpuvet's environment ({sys.executable}): the line below needs it on "
            f"every node (torchrun comes with it, and each node measures with it). Install it first: "
            f"{torch_install(Machine(driver=driver, gpus=gpus), pip)}")


def _benchmark_names() -> tuple[str, ...]:
    from ..runner import ALL_BENCHMARKS

    return ALL_BENCHMARKS


@click.command(name="cluster", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--print-launch", "show_launch", is_flag=True, help="Print the command that starts gpuvet on every node, and exit.")
@click.option("--quick", is_flag=True, help="Facts only on each node, no local benchmarks (the cross-node tests still run).")
@click.option("--bench", "benchmarks", multiple=True, type=click.Choice(_benchmark_names()), metavar="NAME",
              help="Run only these local benchmarks (repeatable).")
@click.option("--device", type=click.Choice(["cuda", "cpu"]), default="cuda", show_default=True,
              help="cpu: benchmark the CPUs and meet over gloo (tests, machines without GPU).")
@click.option("--soak", "soak_minutes", type=click.FloatRange(min=0.1), metavar="MINUTES",
              help="Hold the sustained load this long.")
@click.option("--force", is_flag=True, help="Benchmark GPUs even when other processes use them.")
@click.option("--preemptible/--on-demand", default=None, help="Say whether the nodes can be reclaimed (spot/preemptible).")
@click.option("--expect", metavar="MODEL", help='The GPU model you paid for, e.g. "H100 80GB".')
@click.option("--workdir", metavar="PATH", help="Where the work lives on each node (storage facts).")
@click.option("--node-name", metavar="NAME", help="This node's name in the report (default: its hostname).")
@click.option("--nodes", "nodes", metavar="HOSTLIST", help='The nodes expected, in rank order ("node[01-04]"); '
              "names the ones that never join (Slurm: from SLURM_JOB_NODELIST).")
@click.option("--expect-nodes", type=click.IntRange(min=1), metavar="N",
              help="How many nodes to expect, for the ones that never join (default: the --nodes count, Slurm's, "
                   "or the N of torchrun's --nnodes 1:N).")
@click.option("--run-id", metavar="ID", help="With --print-launch: the torchrun --rdzv-id (default: one derived from the nodes).")
@click.option("--out", metavar="FILE", help="Rank 0 writes the cluster record (JSON) to FILE.")
@click.option("--json", "as_json", is_flag=True, help="Rank 0 prints the cluster record as JSON instead of the report.")
@click.option("-v", "--verbose", is_flag=True, help="List every node and straggler.")
@click.option("-q", "--quiet", is_flag=True, help="No progress lines.")
@click.option("--db", metavar="PATH", help="Each node's history database (default: $GPUVET_DB or ~/.local/share/gpuvet).")
@click.option("--no-save", is_flag=True, help="Do not keep the node records in the local history.")
@click.option("--label", metavar="TEXT", help="Label of every node's stored run.")
@click.option("--price", type=click.FloatRange(min=0), metavar="USD_PER_HOUR", help="What one node costs per hour.")
@click.option("--full-records", is_flag=True,
              help="Ship every node's whole run record to rank 0, time series and all (default: what the cluster is "
                   "judged on, about 5 KB a node; the whole record stays in each node's own history).")
@click.option("--no-cross", is_flag=True, help="Skip the cross-node all-reduce and ring.")
@click.option("--allreduce-max-mib", type=click.FloatRange(min=0.004), metavar="MIB",
              help=f"Largest cross-node all-reduce (default {GPU_ALLREDUCE_MAX_MIB:g} on GPUs, "
                   f"{CPU_ALLREDUCE_MAX_MIB:g} on CPUs).")
@click.option("--ring-mib", type=click.FloatRange(min=0.004), metavar="MIB",
              help=f"Bytes per node-to-node transfer (default {GPU_RING_MIB:g} on GPUs, {CPU_RING_MIB:g} on CPUs).")
@click.option("--ring-rounds", type=click.IntRange(min=1), default=RING_ROUNDS, show_default=True, help="Shuffled ring rounds.")
@click.option("--tolerance", type=click.FloatRange(min=0.01, max=0.9), metavar="FRACTION",
              help="Straggler tolerance for every figure (default: per figure, 10% for GEMM).")
@click.option("--join-timeout", type=click.FloatRange(min=1), default=300.0, show_default=True, metavar="S",
              help="How long nodes may take to join.")
@click.option("--vet-timeout", type=click.FloatRange(min=1), metavar="S",
              help="Longest local vet (default 120 s with --quick, else 1200 s + soak).")
@click.option("--cross-timeout", type=click.FloatRange(min=1), default=300.0, show_default=True, metavar="S",
              help="Longest cross-node measurements, from when every rank has started.")
@click.option("--start-timeout", type=click.FloatRange(min=1), default=180.0, show_default=True, metavar="S",
              help="How long the cross-node ranks may take to start (Python, PyTorch) on a loaded node.")
@click.option("--dead-after", type=click.FloatRange(min=0.5), default=60.0, show_default=True, metavar="S",
              help="A node silent this long (no heartbeat) has failed.")
@click.option("--port", type=click.IntRange(1, 65535),
              help="The rendezvous port (default: MASTER_PORT, or one from the Slurm job id).")
@click.option("--test-pause-at", type=click.Choice(["vet", "meet", "cross", "cross-start"]), hidden=True)
@click.option("--test-hold-until", metavar="FILE", hidden=True)
@click.option("--rank-processes", is_flag=True, hidden=True)
def command(show_launch: bool, nodes: str | None, benchmarks: tuple[str, ...], no_cross: bool, run_id: str | None,
            **values: Any) -> None:
    """Vet every node of a multi-node job at once (one process per node, from torchrun or srun),
    measure the network between the nodes, and name the stragglers."""
    try:
        expected = expand_hostlist(nodes) if nodes else []
    except LaunchError as err:
        click.echo(f"gpuvet cluster: --nodes {nodes}: {err}", err=True)
        sys.exit(EXIT_USAGE)
    if show_launch:
        missing = torch_missing()
        if missing:
            click.echo(missing, err=True)
        click.echo(launch_help(join_timeout_s=values["join_timeout"]), err=True)
        click.echo(print_launch(options=given_options(click.get_current_context()), nodes=expected,
                                join_timeout_s=values["join_timeout"], expect_nodes=values["expect_nodes"], run_id=run_id))
        return
    options = Options(benchmarks=list(benchmarks) or None, cross=not no_cross, nodes=expected, **values)
    finish(main(options))


# Not passed on by --print-launch: each node has its own name.
_NOT_PASSED_ON = ("show_launch", "node_name", "run_id")


def given_options(ctx: click.Context) -> list[str]:
    """The options given on this command line, written out again (quoted) for every node."""
    from click.core import ParameterSource

    words: list[str] = []
    for param in ctx.command.params:
        if param.name in _NOT_PASSED_ON or ctx.get_parameter_source(param.name) != ParameterSource.COMMANDLINE:
            continue
        value = ctx.params[param.name]
        if getattr(param, "is_flag", False):
            if value:
                words.append(param.opts[0])
            elif getattr(param, "secondary_opts", None):
                words.append(param.secondary_opts[0])  # --on-demand
            continue
        for item in value if getattr(param, "multiple", False) else [value]:
            words += [param.opts[0], shlex.quote(f"{item:g}" if isinstance(item, float) else str(item))]
    return words


def finish(code: int) -> None:
    """Exit; without waiting for a rank thread stuck in gloo until its timeout, nor for process
    group destructors at interpreter exit."""
    sys.stdout.flush()
    sys.stderr.flush()
    if any(t.is_alive() for t in RankThread.abandoned):
        os._exit(code)
    sys.exit(code)


def main(options: Options, env: dict[str, str] | os._Environ = os.environ) -> int:
    try:
        launch = launch_from_env(env, options.port)
    except LaunchError as err:
        click.echo(f"gpuvet cluster: {err}", err=True)
        return EXIT_USAGE
    problem = check_out_path(options.out) if launch.rank == 0 else None
    if problem:
        click.echo(f"gpuvet cluster: {problem}", err=True)
        return EXIT_USAGE
    name = options.node_name or launch.node_name or socket.gethostname()
    talk = launch.rank == 0 and not options.quiet

    def say(message: str) -> None:
        if talk:
            click.echo(f"gpuvet cluster [{name}]: {message}", err=True)

    return run_node(launch, options, say, Outputs(save_run=_save_run(options, name), show=_show(options, say)))


def _save_run(options: Options, name: str) -> Callable[[Any, str], int | None]:
    """How a node keeps its own run in its local history (the store is the command's to open)."""
    def save(record: Any, label: str) -> int | None:
        from ..store import Store, StoreError

        try:
            with Store(options.db) as store:
                return store.save(record, label=label, price_per_hour=options.price)
        except StoreError as err:
            print(f"gpuvet cluster: {name}: warning: run not saved: {err}", file=sys.stderr)
            return None
    return save


def _show(options: Options, say: Callable[[str], None]) -> Callable[[dict[str, Any]], None]:
    """How rank 0 keeps (--out) and prints the cluster record."""
    def show(record: dict[str, Any]) -> None:
        from ..report import cluster_view
        from ..report.terminal import stdout_console

        if options.out:
            write_private(options.out, cluster_view.to_json(record) + "\n")
            record["out"] = options.out
        else:
            say("the cluster record was not kept: give --out FILE (to every node: torchrun picks rank 0)")
        if options.as_json:
            click.echo(cluster_view.to_json(record))
        else:
            cluster_view.render(record, stdout_console(), verbose=options.verbose)
    return show
