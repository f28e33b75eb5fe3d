"""The records gpuvet writes and reads, typed and checked.

run.py: the run record (facts, measurements, findings, series, options), the single source of
truth of a run; details.py: the measurement details the rules compute with; cluster.py and
watch.py: the cluster record and the watch log; validate.py: the type checks every reader runs;
load.py: the one reader that tells the kinds apart; schema.py: their JSON Schemas (shipped in
schemas/, printed by `gpuvet schema KIND`). Nothing here touches the machine.
"""

from .errors import RecordError
from .run import (FAIL, MEASURED, PASS, SCHEMA, SEVERITY, SKIP, STATUSES, WARN, Evidence, Finding, Measurement, RunOptions,
                  RunRecord, Series, Valued, check_run, exit_code, has_value, parse_timestamp, timestamp, verdict_of)

__all__ = [
    "FAIL", "MEASURED", "PASS", "SCHEMA", "SEVERITY", "SKIP", "STATUSES", "WARN", "Evidence", "Finding", "Measurement", "RecordError",
    "RunOptions", "RunRecord", "Series", "Valued", "check_run", "exit_code", "has_value", "parse_timestamp", "timestamp",
    "verdict_of",
]
