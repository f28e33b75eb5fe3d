"""The JSON Schemas gpuvet ships, checked against records: fixtures, and every record the tests
make (conftest collects what gpuvet writes: run records, cluster records, watch-log lines)."""

from __future__ import annotations

import functools
import json
from typing import Any

import jsonschema

from gpuvet.record.schema import shipped

ROWS_KEPT = 5  # a series' first rows stand for the rest: validating 10,000 rows per test costs seconds


@functools.cache
def validator(kind: str) -> jsonschema.Draft202012Validator:
    schema = json.loads(shipped(kind))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _trimmed(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: (v[:ROWS_KEPT] if k == "rows" and isinstance(v, list) else _trimmed(v)) for k, v in data.items()}
    if isinstance(data, list):
        return [_trimmed(v) for v in data]
    return data


def problems(kind: str, data: Any) -> list[str]:
    """Where `data` breaks the `kind` schema (empty: it matches)."""
    return [f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message[:200]}"
            for e in validator(kind).iter_errors(_trimmed(data))]
