"""Type checks of a loaded record against the types the code declares for it.

A record comes from a file, an export, another machine's store or a cluster node: anything may be
in it. Every reader walks it here first, against the dataclasses and TypedDicts that describe it,
so the renderers and the judge only ever see the types they were written for. The walk returns
the value cleaned: a NaN or infinity where a number belongs is None (a reading not known, as
gpuvet writes it), and a wrong type raises RecordError naming the field.

The same type descriptions give the JSON Schemas (schema.py), so the two cannot drift apart.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from dataclasses import dataclass
from typing import Any

from .errors import RecordError

MAX_DEPTH = 48  # deeper than any record gpuvet writes (about 8); a file nested 100,000 deep stops here
MAX_INT = 2**63  # beyond int64: no counter, size or id gpuvet records comes near; nor can it be a float


@dataclass(frozen=True)
class OneOf:
    """`Annotated[str, OneOf(...)]`: a text that must be one of these (a finding's status)."""

    choices: tuple[str, ...]


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a text"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def json_kind(value: Any) -> str:
    """What a top-level value that is not an object is, for the line that refuses it: "a JSON list"."""
    kind = {list: "list", str: "text", bool: "true/false", int: "number", float: "number"}.get(type(value), "null")
    return f"a JSON {kind}"


def _wrong(path: str, value: Any, wanted: str) -> RecordError:
    return RecordError(f"{path or 'the record'}: {_kind(value)} where {wanted} belongs")


@functools.cache
def _hints(cls: Any) -> dict[str, Any]:
    return typing.get_type_hints(cls, include_extras=True)


# Read once per type, not per value: a 1,000-node cluster record asked typing and dataclasses for
# the same answers half a million times (a third of `gpuvet report`'s time).
@functools.cache
def _shape(hint: Any) -> tuple[Any, tuple[Any, ...]]:
    return typing.get_origin(hint), typing.get_args(hint)


@functools.cache
def _required_fields(cls: Any) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls)
                 if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)


_SCALARS = (str, int, float, bool, type(None))


@functools.cache
def _scalar_union(hint: Any) -> tuple[type, ...] | None:
    """The types of a union of plain JSON scalars (a series row's values), else None: checked
    without the general walk, since a long soak's series hold hundreds of thousands of them."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if all(a in _SCALARS for a in args):
            return args
    return None


def _scalar_list(values: list[Any], allowed: tuple[type, ...], path: str) -> list[Any]:
    """_scalar() of each value, the common cases inline (a row of finite numbers in range); the
    path is only spelled out for a value that needs a closer look."""
    numbers = float in allowed or int in allowed
    low, high = -MAX_INT, MAX_INT
    out = []
    for i, v in enumerate(values):
        kind = type(v)
        if kind is float and numbers and low < v < high and (float in allowed or v.is_integer()):
            out.append(v)  # NaN fails the comparison and goes the long way
        elif kind is int and numbers and low < v < high:
            out.append(v)
        elif kind in allowed and kind in (str, bool, type(None)):
            out.append(v)
        else:
            out.append(_scalar(v, allowed, f"{path}[{i}]"))
    return out


def _scalar(value: Any, allowed: tuple[type, ...], path: str) -> Any:
    if value is None and type(None) in allowed:
        return None
    if isinstance(value, bool):
        if bool in allowed:
            return value
    elif isinstance(value, str):
        if str in allowed:
            return value
    elif isinstance(value, (int, float)) and (float in allowed or int in allowed):
        return number(value, path, integer=float not in allowed)
    raise _wrong(path, value, " or ".join(_name(a) for a in allowed if a is not type(None)))


def number(value: Any, path: str, integer: bool = False) -> Any:
    """A JSON number as gpuvet reads it: NaN and infinities are not known (None); true/false and
    numbers beyond int64 are refused."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _wrong(path, value, "a whole number" if integer else "a number")
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if integer and isinstance(value, float) and not value.is_integer():
        raise RecordError(f"{path}: {value!r} where a whole number belongs")
    if abs(value) >= MAX_INT:
        size = f"{len(str(abs(value)))} digits" if isinstance(value, int) else f"{value:.3g}"
        raise RecordError(f"{path}: a number too large for a record ({size})")
    return value


def free(value: Any, path: str, depth: int = 0) -> Any:
    """Content whose shape is not declared (benchmark details, options): any JSON, bounded in
    depth, its numbers checked like every other number."""
    if depth > MAX_DEPTH:
        raise RecordError(f"{path}: nested more than {MAX_DEPTH} levels deep")
    if isinstance(value, dict):
        for key in value:
            if not isinstance(key, str):
                raise RecordError(f"{path}: a key that is not text")
        return {k: free(v, f"{path}.{k}", depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [free(v, f"{path}[{i}]", depth + 1) for i, v in enumerate(value)]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return number(value, path)
    if value is None or isinstance(value, (str, bool)):
        return value
    raise _wrong(path, value, "JSON")


def check(value: Any, hint: Any, path: str, depth: int = 0) -> Any:
    """`value` checked against the type `hint` (what the dataclass or TypedDict declares)."""
    if depth > MAX_DEPTH:
        raise RecordError(f"{path}: nested more than {MAX_DEPTH} levels deep")
    allowed = _scalar_union(hint)
    if allowed is not None:
        return _scalar(value, allowed, path)
    origin, args = _shape(hint)
    if hint is Any:
        return free(value, path, depth)
    if origin is typing.Annotated:
        checked = check(value, args[0], path, depth)
        for meta in args[1:]:
            if isinstance(meta, OneOf) and checked not in meta.choices:
                raise RecordError(f"{path}: {checked!r} is not one of {', '.join(meta.choices)}")
        return checked
    if origin in (typing.Union, types.UnionType):
        return _union(value, args, path, depth)
    if origin is typing.Literal:
        if value not in args:
            raise RecordError(f"{path}: {value!r} is not one of {', '.join(map(repr, args))}")
        return value
    if hint is type(None):
        if value is not None:
            raise _wrong(path, value, "null")
        return None
    if hint is str:
        if not isinstance(value, str):
            raise _wrong(path, value, "a text")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise _wrong(path, value, "true/false")
        return value
    if hint is int:
        # A whole number; 3.0 counts as one (JSON has one number type), as in JSON Schema.
        return number(value, path, integer=True)
    if hint is float:
        return number(value, path)
    if origin is list:
        if not isinstance(value, list):
            raise _wrong(path, value, "a list")
        (item,) = args or (Any,)
        allowed = _scalar_union(item)
        if allowed is not None:
            return _scalar_list(value, allowed, path)
        return [check(v, item, f"{path}[{i}]", depth + 1) for i, v in enumerate(value)]
    if origin is tuple:
        if not isinstance(value, list):
            raise _wrong(path, value, "a list")
        return [check(v, args[0] if args else Any, f"{path}[{i}]", depth + 1) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise _wrong(path, value, "an object")
        _, item = args or (str, Any)
        return {k: check(v, item, f"{path}.{k}", depth + 1) for k, v in value.items()}
    if typing.is_typeddict(hint):
        return _typed_dict(value, hint, path, depth)
    if dataclasses.is_dataclass(hint):
        return _dataclass(value, hint, path, depth)
    raise TypeError(f"record.validate cannot check the type {hint!r} ({path})")  # a gpuvet bug, not bad input


def _union(value: Any, args: tuple[Any, ...], path: str, depth: int) -> Any:
    """`value` checked against the first of the union's types it fits (None where the union allows it)."""
    if value is None and type(None) in args:
        return None
    options = [a for a in args if a is not type(None)]
    if len(options) == 1:
        return check(value, options[0], path, depth)
    for option in options:
        try:
            return check(value, option, path, depth)
        except RecordError:
            continue
    raise _wrong(path, value, " or ".join(_name(o) for o in options))


def _name(hint: Any) -> str:
    return {str: "a text", int: "a whole number", float: "a number", bool: "true/false"}.get(hint, "an object" if (
        typing.is_typeddict(hint) or dataclasses.is_dataclass(hint) or typing.get_origin(hint) is dict) else "a list")


def _typed_dict(value: Any, hint: Any, path: str, depth: int) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _wrong(path, value, "an object")
    missing = [k for k in hint.__required_keys__ if k not in value]
    if missing:
        raise RecordError(f"{path or 'the record'}: without {', '.join(sorted(missing))}")
    hints = _hints(hint)
    out = dict(value)  # keys a newer gpuvet added stay, checked as free content
    for key, item in value.items():
        where = f"{path}.{key}" if path else key
        out[key] = check(item, hints[key], where, depth + 1) if key in hints else free(item, where, depth + 1)
    return out


def _dataclass(value: Any, hint: Any, path: str, depth: int) -> dict[str, Any]:
    """A dataclass's dict: every declared field present is checked; others are kept unchecked but
    bounded (facts.from_dict ignores them)."""
    if not isinstance(value, dict):
        raise _wrong(path, value, "an object")
    missing = [name for name in _required_fields(hint) if name not in value]
    if missing:
        raise RecordError(f"{path or 'the record'}: without {', '.join(missing)}")
    hints = _hints(hint)
    out: dict[str, Any] = {}
    for key, item in value.items():
        where = f"{path}.{key}" if path else key
        if not isinstance(key, str):
            raise RecordError(f"{path or 'the record'}: a key that is not text")
        out[key] = check(item, hints[key], where, depth + 1) if key in hints else free(item, where, depth + 1)
    return out
