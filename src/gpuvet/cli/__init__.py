"""gpuvet's command line: thin commands over runner (probe -> bench -> judge), the store and the
reports. Exit codes: 0 nothing failed, 1 a check failed, 2 bad usage or unreadable input."""

from . import fleet, history, monitor, network, reports, vet  # noqa: F401  (registers the commands)
from .cluster import command as _cluster_command
from .base import cli, main

cli.add_command(_cluster_command, name="cluster")

__all__ = ["cli", "main"]
