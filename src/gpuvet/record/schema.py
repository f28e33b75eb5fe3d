"""JSON Schemas (draft 2020-12) of the records gpuvet writes, made from the same types the loader
checks against (validate.py), so a field, a status or a benchmark's details type added there
shows up here. The package ships them in schemas/ (`gpuvet schema KIND` prints one); a test holds
the shipped files equal to what this module makes. To refresh them after changing a type:

    python -m gpuvet.record.schema --write
"""

from __future__ import annotations

import dataclasses
import json
import sys
import types
import typing
from importlib import resources
from pathlib import Path
from typing import Any

from .cluster import CLUSTER_SCHEMA, ClusterRecord
from .details import DETAILS
from .run import SCHEMA, Measurement, RunRecordDict
from .validate import MAX_INT, OneOf
from .watch import WATCH_SCHEMA, WatchHeader, WatchLine

KINDS = ("run", "export", "watch", "cluster")
DRAFT = "https://json-schema.org/draft/2020-12/schema"
_ID = "https://gpuvet.dev/schemas/{kind}.schema.json"


class _Builder:
    def __init__(self) -> None:
        self.defs: dict[str, Any] = {}

    def of(self, hint: Any) -> dict[str, Any]:
        origin, args = typing.get_origin(hint), typing.get_args(hint)
        if hint is Any:
            return {}
        if origin is typing.Annotated:
            base = self.of(args[0])
            for meta in args[1:]:
                if isinstance(meta, OneOf):
                    base = {**base, "enum": list(meta.choices)}
            return base
        if origin in (typing.Union, types.UnionType):
            return {"anyOf": [self.of(a) for a in args]}
        if origin is typing.Literal:
            return {"enum": list(args)}
        if hint is type(None):
            return {"type": "null"}
        if hint is str:
            return {"type": "string"}
        if hint is bool:
            return {"type": "boolean"}
        if hint is int:
            return {"type": "integer", "minimum": -MAX_INT + 1, "maximum": MAX_INT - 1}
        if hint is float:
            return {"type": "number", "minimum": -MAX_INT + 1, "maximum": MAX_INT - 1}
        if origin in (list, tuple):
            return {"type": "array", "items": self.of(args[0]) if args else {}}
        if origin is dict:
            return {"type": "object", "additionalProperties": self.of(args[1]) if args else {}}
        if typing.is_typeddict(hint):
            return self._ref(hint, lambda: self._object(typing.get_type_hints(hint, include_extras=True),
                                                        sorted(hint.__required_keys__), hint.__doc__))
        if dataclasses.is_dataclass(hint):
            required = [f.name for f in dataclasses.fields(hint)
                        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
            return self._ref(hint, lambda: self._object(typing.get_type_hints(hint, include_extras=True), required, None))
        raise TypeError(f"no JSON Schema for {hint!r}")

    def _ref(self, cls: Any, make: Any) -> dict[str, Any]:
        name = cls.__name__.lstrip("_")
        if name not in self.defs:
            self.defs[name] = {}  # placed first: a type that contains itself refers to it
            self.defs[name] = make()
        return {"$ref": f"#/$defs/{name}"}

    def _object(self, hints: dict[str, Any], required: list[str], doc: str | None) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "object", "properties": {k: self.of(v) for k, v in hints.items()}}
        if required:
            out["required"] = required
        if doc and doc.strip():
            out["description"] = " ".join(doc.split())
        return out  # other keys allowed: a newer gpuvet may add fields


def _measurement_details(builder: _Builder) -> None:
    """Each benchmark's details type, chosen by the measurement's name as details_type() does."""
    builder.of(Measurement)
    cases = []
    for prefix, shape in reversed(DETAILS):  # the first match wins: later, more general prefixes go inside
        ref = builder.of(shape)
        cases.append((prefix, ref))
    rule: dict[str, Any] = {}
    for prefix, ref in cases:  # built inside out, so that "sustained.telemetry" is tried before "sustained."
        branch = {"if": {"properties": {"name": {"type": "string", "pattern": "^" + prefix.replace(".", "\\.")}},
                         "required": ["name"]},
                  "then": {"properties": {"details": ref}}}
        if rule:
            branch["else"] = rule
        rule = branch
    builder.defs["Measurement"]["allOf"] = [rule]


def make(kind: str) -> dict[str, Any]:
    """The JSON Schema of one record kind: run, export, watch (one line of a log) or cluster."""
    builder = _Builder()
    if kind in ("run", "export", "cluster"):
        builder.of(RunRecordDict)
        _measurement_details(builder)
        builder.defs["RunRecordDict"]["properties"]["schema"] = {"const": SCHEMA}
        builder.defs["RunRecordDict"]["required"] = ["schema"]
    if kind == "run":
        root: dict[str, Any] = {"$ref": "#/$defs/RunRecordDict", "title": "gpuvet run record (gpuvet run --out)"}
    elif kind == "export":
        root = {"title": "gpuvet export (gpuvet export ID...): a list of run records",
                "type": "array", "minItems": 1, "items": {"$ref": "#/$defs/RunRecordDict"}}
    elif kind == "cluster":
        root = {"$ref": "#/$defs/ClusterRecord", "title": "gpuvet cluster record (gpuvet cluster --out)"}
        builder.of(ClusterRecord)
        builder.defs["ClusterRecord"]["properties"]["schema"] = {"const": CLUSTER_SCHEMA}
        builder.defs["ClusterNode"]["properties"]["record"] = {"anyOf": [{"$ref": "#/$defs/RunRecordDict"}, {"type": "null"}]}
    elif kind == "watch":
        header, line = builder.of(WatchHeader), builder.of(WatchLine)
        builder.defs["WatchHeader"]["properties"]["schema"] = {"const": WATCH_SCHEMA}
        builder.defs["WatchHeader"]["properties"]["kind"] = {"const": "header"}
        root = {"title": "one line of a gpuvet watch log (gpuvet watch --log: JSON lines, a header per session)",
                "type": "object",
                "if": {"properties": {"kind": {"const": "header"}}, "required": ["kind"]}, "then": header, "else": line}
    else:
        raise ValueError(f"no record kind {kind!r}: one of {', '.join(KINDS)}")
    return {"$schema": DRAFT, "$id": _ID.format(kind=kind), **root, "$defs": dict(sorted(builder.defs.items()))}


def text(kind: str) -> str:
    return json.dumps(make(kind), indent=2) + "\n"


def shipped(kind: str) -> str:
    """The schema file the package ships for `kind`."""
    if kind not in KINDS:
        raise ValueError(f"no record kind {kind!r}: one of {', '.join(KINDS)}")
    return resources.files("gpuvet.record").joinpath("schemas").joinpath(f"{kind}.schema.json").read_text(encoding="utf-8")


def main(argv: list[str]) -> int:
    if argv != ["--write"]:
        print(__doc__)
        return 2
    folder = Path(__file__).parent / "schemas"
    folder.mkdir(exist_ok=True)
    for kind in KINDS:
        (folder / f"{kind}.schema.json").write_text(text(kind), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
