"""`gpuvet cluster --print-launch` on a machine whose gpuvet has no PyTorch: the torchrun line it
prints would fail on every node, so it says so first, with the pip line for this machine."""

from __future__ import annotations

from click.testing import CliRunner

from gpuvet.cli.cluster import command as cluster_command
from gpuvet.facts import Torch


def test_the_launch_line_says_first_that_pytorch_is_missing(monkeypatch):
    monkeypatch.setattr("gpuvet.probe.stack.find_torch", lambda: Torch(installed=False))
    result = CliRunner().invoke(cluster_command, ["--print-launch", "--nodes", "node[1-2]"])
    assert result.exit_code == 0, result.output
    first = result.stderr.splitlines()[0]
    assert first.startswith("# PyTorch is not installed in gpuvet's environment")
    assert "-m pip install torch --index-url https://download.pytorch.org/whl/cpu" in first  # no GPU here: the CPU build
    assert " --nnodes 1:2 " in result.stdout  # the line itself still comes, alone on stdout


def test_with_pytorch_the_line_comes_without_the_warning():
    result = CliRunner().invoke(cluster_command, ["--print-launch", "--nodes", "node[1-2]"])
    assert result.exit_code == 0, result.output
    assert "PyTorch is not installed" not in result.stderr
