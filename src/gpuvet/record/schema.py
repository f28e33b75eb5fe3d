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
from .plan import BenchPlan
from .verdict import HEALTH_SCHEMA, HealthVerdict
from .watch import WATCH_SCHEMA, WatchHeader, WatchLine

KINDS = ("run", "export", "watch", "cluster", "health", "plan")
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


DEFS = "defs"  # schemas/defs.schema.json: the types every kind shares, written once


def _built() -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """Every kind's types in one set of definitions, and each kind's root pointing into them."""
    builder = _Builder()
    builder.of(RunRecordDict)
    _measurement_details(builder)
    builder.defs["RunRecordDict"]["properties"]["schema"] = {"const": SCHEMA}
    builder.defs["RunRecordDict"]["required"] = ["schema"]
    builder.of(ClusterRecord)
    builder.defs["ClusterRecord"]["properties"]["schema"] = {"const": CLUSTER_SCHEMA}
    builder.defs["ClusterNode"]["properties"]["record"] = {"anyOf": [{"$ref": "#/$defs/RunRecordDict"}, {"type": "null"}]}
    builder.of(BenchPlan)
    builder.defs["BenchPlan"]["properties"]["total_s"] = {"type": "number"}  # the steps' budgets added up
    builder.of(HealthVerdict)
    builder.defs["HealthVerdict"]["properties"]["schema"] = {"const": HEALTH_SCHEMA}
    header, line = builder.of(WatchHeader), builder.of(WatchLine)
    builder.defs["WatchHeader"]["properties"]["schema"] = {"const": WATCH_SCHEMA}
    builder.defs["WatchHeader"]["properties"]["kind"] = {"const": "header"}
    roots: dict[str, dict[str, Any]] = {
        "run": {"$ref": "#/$defs/RunRecordDict", "title": "gpuvet run record (gpuvet run --out)"},
        "export": {"title": "gpuvet export (gpuvet export ID...): a list of run records",
                   "type": "array", "minItems": 1, "items": {"$ref": "#/$defs/RunRecordDict"}},
        "cluster": {"$ref": "#/$defs/ClusterRecord", "title": "gpuvet cluster record (gpuvet cluster --out)"},
        "plan": {"$ref": "#/$defs/BenchPlan", "title": "gpuvet benchmark plan (gpuvet run --plan --json, inspect --plan)"},
        "health": {"$ref": "#/$defs/HealthVerdict", "title": "gpuvet health verdict (gpuvet health --json): one node's answer"},
        "watch": {"title": "one line of a gpuvet watch log (gpuvet watch --log: JSON lines, a header per session)",
                  "type": "object", "if": {"properties": {"kind": {"const": "header"}}, "required": ["kind"]},
                  "then": header, "else": line},
    }
    return dict(sorted(builder.defs.items())), roots


def _pointing_at(defs_file: str, node: Any) -> Any:
    """`node` with its local references ("#/$defs/X") made to point into `defs_file`."""
    if isinstance(node, dict):
        return {k: (v.replace("#/", f"{defs_file}#/", 1) if k == "$ref" and isinstance(v, str) else _pointing_at(defs_file, v))
                for k, v in node.items()}
    if isinstance(node, list):
        return [_pointing_at(defs_file, v) for v in node]
    return node


def files() -> dict[str, str]:
    """The schema files the package ships: the shared definitions once, and per kind a root that
    refers to them (243 KB as four self-contained files, about a third of it so)."""
    defs, roots = _built()
    out = {DEFS: json.dumps({"$schema": DRAFT, "$id": _ID.format(kind=DEFS), "$defs": defs}, indent=2) + "\n"}
    for kind in KINDS:
        root = _pointing_at(f"{DEFS}.schema.json", roots[kind])
        out[kind] = json.dumps({"$schema": DRAFT, "$id": _ID.format(kind=kind), **root}, indent=2) + "\n"
    return out


def _reachable(defs: dict[str, Any], node: Any, seen: set[str]) -> set[str]:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/") and ref[8:] not in seen:
            seen.add(ref[8:])
            _reachable(defs, defs[ref[8:]], seen)
        for v in node.values():
            _reachable(defs, v, seen)
    elif isinstance(node, list):
        for v in node:
            _reachable(defs, v, seen)
    return seen


def bundle(kind_file: str, defs_file: str) -> dict[str, Any]:
    """One kind's schema as a self-contained document (what `gpuvet schema KIND` prints, for tools
    that read one file): its root from `kind_file`, with the definitions it uses from `defs_file`."""
    root, defs = json.loads(kind_file), json.loads(defs_file)["$defs"]
    root = json.loads(json.dumps(root).replace(f'"{DEFS}.schema.json#/', '"#/'))
    used = _reachable(defs, root, set())
    return {**root, "$defs": {name: defs[name] for name in sorted(used)}}


def make(kind: str) -> dict[str, Any]:
    """The JSON Schema of one record kind, self-contained: run, export, watch (one line of a log) or cluster."""
    if kind not in KINDS:
        raise ValueError(f"no record kind {kind!r}: one of {', '.join(KINDS)}")
    made = files()
    return bundle(made[kind], made[DEFS])


def text(kind: str) -> str:
    return json.dumps(make(kind), indent=2) + "\n"


def shipped_file(name: str) -> str:
    """A schema file as the package ships it (a kind's root, or DEFS)."""
    return resources.files("gpuvet.record").joinpath("schemas").joinpath(f"{name}.schema.json").read_text(encoding="utf-8")


def shipped(kind: str) -> str:
    """The self-contained schema of `kind`, bundled from the files the package ships."""
    if kind not in KINDS:
        raise ValueError(f"no record kind {kind!r}: one of {', '.join(KINDS)}")
    return json.dumps(bundle(shipped_file(kind), shipped_file(DEFS)), indent=2) + "\n"


def main(argv: list[str]) -> int:
    if argv != ["--write"]:
        print(__doc__)
        return 2
    folder = Path(__file__).parent / "schemas"
    folder.mkdir(exist_ok=True)
    for name, content in files().items():
        (folder / f"{name}.schema.json").write_text(content, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
