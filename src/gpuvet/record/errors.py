"""The one error every record reader raises."""

from __future__ import annotations


class RecordError(ValueError):
    """A file or value that is not a record this gpuvet can read: not JSON, another kind of file,
    or a field of the wrong type. The message is one line a person reads, naming the file and the
    field (`gpuvet: runs.json: machine.gpus[0].memory_total_mib: a list where a number belongs`).
    A ValueError, so callers that treat bad input as ValueError keep doing so."""
