"""A stored run named by its id, as "saved as run N" names it: for show, report and compare."""

from __future__ import annotations

import os

import click

from .. import runner
from ..record import RunRecord
from ..store import StoreError
from .base import UsageProblem, open_store


def stored_run_id(ref: str) -> int | None:
    """The run id `ref` names ("3" or "#3"), unless a file of that name exists: a file wins, as
    `gpuvet report 3` said before run ids were taken."""
    digits = ref.strip().removeprefix("#")
    if not digits.isdigit() or os.path.exists(ref):
        return None
    return int(digits)


def stored_run(db: str | None, ref: str | int) -> RunRecord:
    """The stored run, judged again with this gpuvet's rules; a verdict that changed since it was
    saved is said on stderr."""
    run_id = ref if isinstance(ref, int) else stored_run_id(ref)
    assert run_id is not None
    with open_store(db, read_only=True) as store:
        try:
            record = store.get(run_id)
        except StoreError as err:
            raise UsageProblem(str(err)) from None
    stored_verdict = record.verdict  # from the findings saved with it
    record = runner.rejudge(record)
    if record.verdict != stored_verdict:
        click.echo(f"gpuvet: run {run_id} was saved with verdict {stored_verdict.upper()}; this gpuvet's rules judge it "
                   f"{record.verdict.upper()} (shown here)", err=True)
    return record
