"""TOML files with positions: tomllib gives no line numbers, so we find them in the text.

A file is read once (`load`, a `Doc` that knows its text) and validated whole against its model
(`validate`: the pydantic models of `stackgate.boundary`, strict, closed and ranged); the first error
becomes a ConfigError at the key's line, inside the right `[[array]]` entry:
`matrix/upgrade.toml:12: unknown key 'pols' in [matrix]` with "did you mean 'pools'?". What a model
cannot say (a version that does not parse, a waiver that names nothing) is said with `parsed` and
`Doc.error`, at the same lines.
"""

from __future__ import annotations

import datetime as dt
import difflib
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin

from pydantic import BaseModel, ValidationError

from stackgate.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

_HEADER = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
_KEY = re.compile(r"^\s*(\"[^\"]+\"|'[^']+'|[A-Za-z0-9_\-]+)\s*(\.[^=]*)?=")
_TOML_POS = re.compile(r"\(at line ([0-9]+), column [0-9]+\)")


def _unquote(key: str) -> str:
    return key.strip().strip("\"'")


def _dotted(path: str) -> tuple[str, ...]:
    """A dotted table path, quoted parts kept whole: `torch."2.14"` is ("torch", "2.14")."""
    return tuple(_unquote(part) for part in re.findall(r"\"[^\"]*\"|'[^']*'|[^.\s]+", path))


@dataclass(frozen=True)
class Doc:
    """A parsed TOML file with its text, for error positions."""

    path: Path
    data: dict[str, Any]
    lines: tuple[str, ...]

    def line_of(self, *keys: str) -> int | None:
        """Best-effort line of `keys` (a table path, then a key); None if not found."""
        if not keys:
            return None
        table: tuple[str, ...] = ()
        want_table = tuple(keys[:-1])
        for number, raw in enumerate(self.lines, start=1):
            header = _HEADER.match(raw)
            if header:
                table = _dotted(header.group(1))
                if table == tuple(keys):
                    return number
                continue
            key = _KEY.match(raw)
            if key and _unquote(key.group(1)) == keys[-1] and table[: len(want_table)] == want_table:
                return number
        # fall back to the first line mentioning the last key at all
        for number, raw in enumerate(self.lines, start=1):
            if re.search(rf"(^|[\s\[.{{,]){re.escape(keys[-1])}\s*[=\].]", raw):
                return number
        return None

    def line_at(self, loc: tuple[Any, ...]) -> int | None:
        """The line of a validation error's location (table, ..., index, key, ...). A name followed
        by an index is the n-th `[[name]]` block (an array of tables), and the key after it is searched
        in that block; an index after a key (an element of its list) is that key's line."""
        names = [p for p in loc if isinstance(p, str)]
        block: tuple[int, int, int] | None = None  # the entry's first line, its end, and how many names lead to it
        path: list[str] = []
        for part in loc:
            if isinstance(part, str):
                path.append(part)
                continue
            found = self._nth_header(".".join(path), part)
            if found is not None:
                block = (*found, len(path))
        if block is None:
            return self.line_of(*names)
        first, end, depth = block
        rest = names[depth:]
        for number in range(first + 1, end) if rest else ():
            match = _KEY.match(self.lines[number - 1])
            if match and _unquote(match.group(1)) == rest[0]:
                return number
        return first

    def nth_header(self, name: str, index: int) -> int | None:
        """The line of the n-th `[[name]]` (an array of tables' entry)."""
        found = self._nth_header(name, index)
        return found[0] if found is not None else None

    def _nth_header(self, name: str, index: int) -> tuple[int, int] | None:
        """The n-th `[[name]]` header's line, and the line of the header after it (or the end)."""
        seen = -1
        for number, raw in enumerate(self.lines, start=1):
            header = _HEADER.match(raw)
            if header and raw.strip().startswith("[[") and ".".join(_dotted(header.group(1))) == name:
                seen += 1
                if seen == index:
                    end = next((n for n in range(number + 1, len(self.lines) + 1)
                                if _HEADER.match(self.lines[n - 1])), len(self.lines) + 1)
                    return number, end
        return None

    def error(self, message: str, *keys: str, hint: str | None = None) -> ConfigError:
        return ConfigError(message, path=self.path, line=self.line_of(*keys), hint=hint)


def load(path: Path) -> Doc:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("file not found", path=path, hint="check the path, or run from the repository root") from None
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[:exc.start].count(b"\n") + 1
        raise ConfigError(f"not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start}): TOML files are "
                          "UTF-8", path=path, line=line, hint="save the file as UTF-8") from None
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror}", path=path) from None
    return loads(text, path)


def loads(text: str, path: Path) -> Doc:
    try:
        data = tomllib.loads(text)
    except RecursionError:
        raise ConfigError("malformed TOML: nested deeper than Python can read", path=path,
                          hint="no stackgate file nests more than a few levels") from None
    except tomllib.TOMLDecodeError as exc:
        match = _TOML_POS.search(str(exc))
        line = int(match.group(1)) if match else None
        if line is None and "end of document" in str(exc):
            line = max(len(text.splitlines()), 1)
        message = _TOML_POS.sub("", str(exc)).strip()
        raise ConfigError(f"malformed TOML: {message}", path=path, line=line) from None
    return Doc(path=path, data=data, lines=tuple(text.splitlines()))


def check_keys(doc: Doc, table: Mapping[str, Any], allowed: Iterable[str], *where: str) -> None:
    """Unknown keys are errors, with a 'did you mean'."""
    allowed = sorted(allowed)
    for key in table:
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f"did you mean '{close[0]}'?" if close else f"allowed keys: {', '.join(allowed)}"
            raise doc.error(f"unknown key '{key}'" + (f" in [{'.'.join(where)}]" if where else ""),
                            *where, key, hint=hint)


def parsed(doc: Doc, parser: Any, value: Any, *keys: str) -> Any:
    """`parser(value)`, its error said at the TOML line of `keys`."""
    try:
        return parser(value)
    except ConfigError as exc:
        raise doc.error(str(exc), *keys, hint=exc.hint) from None
    except ValueError as exc:
        raise doc.error(str(exc), *keys) from None


# ------------------------------------------------------------------------------------ typed models
Table = TypeVar("Table", bound=BaseModel)
_EXPECTED = {"int_type": "int", "float_type": "a number", "string_type": "str", "bool_type": "bool",
             "dict_type": "a table", "model_type": "a table", "list_type": "a list", "date_type": "a date (YYYY-MM-DD)"}


def validate(doc: Doc, model: type[Table], data: Mapping[str, Any] | None = None) -> Table:
    """The file (or `data`, a part of it) as `model`: strict (a string is never a number, a boolean
    never an int), closed (an unknown key is an error, with a "did you mean"), bounded (each number
    in its range, every float finite). The first error is a ConfigError at the file's line of the key."""
    try:
        return model.model_validate(doc.data if data is None else data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)  # an unknown key first: "did you mean" explains a missing one too
        raise _error(doc, model, next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])) from None


def _error(doc: Doc, model: type[BaseModel], error: Any) -> ConfigError:
    loc = tuple(error["loc"])
    value = error.get("input")
    kind = error["type"]
    if loc and loc[-1] == "[key]":  # a table's key itself ([forward_compat.branches] "58x")
        loc = loc[:-1]
        names = [p for p in loc if isinstance(p, str)]
        return ConfigError(f"{value!r} in [{_shown(names[:-1])}]: {error['msg']}", path=doc.path,
                           line=doc.line_at(loc))
    names = [p for p in loc if isinstance(p, str)]
    key = names[-1] if names else "(the file)"
    table = names[:-1]
    where = f" in [{_shown(table)}]" if table else ""
    line = doc.line_at(loc[:-1] if kind == "missing" and len(loc) > 1 else loc)
    hint = None
    if kind == "extra_forbidden":
        allowed = sorted(_fields_at(model, loc[:-1]))
        close = difflib.get_close_matches(key, allowed, n=1)
        message = f"unknown key '{key}'{where}"
        hint = f"did you mean '{close[0]}'?" if close else f"allowed keys: {', '.join(allowed)}"
    elif kind == "missing":
        message = f"missing required key '{key}'{where}"
        hint = f"add '{key} = ...'"
    elif kind == "finite_number":
        message = f"'{key}' = {value!r} is not a finite number"
        hint = "give a finite number within the documented range"
    elif kind in ("greater_than_equal", "less_than_equal", "greater_than", "less_than"):
        low, high = _bounds(model, loc)
        ctx = error.get("ctx") or {}
        low = low if low is not None else ctx.get("ge", ctx.get("gt"))
        high = high if high is not None else ctx.get("le", ctx.get("lt"))
        bound = (f"between {low:g} and {high:g}" if low is not None and high is not None
                 else f">= {low:g}" if low is not None else f"<= {high:g}" if high is not None else "in range")
        message = f"'{key}' = {value!r} is out of range: must be {bound}"
    elif kind == "too_short" and value in ([], ()):
        message = f"'{key}' is an empty list"
        hint = f"give at least one value for '{key}'"
    elif kind in ("too_long", "too_short"):
        message = f"'{key}': {error['msg']}"
    elif kind == "literal_error":
        choices = ", ".join(f'"{c}"' for c in _choices(getattr(_walk(model, loc), "annotation", None)))
        message = f"{key} = {value!r} is not one of {choices or error['ctx']['expected']}"
        hint = f"use one of: {choices or error['ctx']['expected']}"
    elif kind in _EXPECTED:
        message = f"'{key}' must be {_EXPECTED[kind]}, got {type(value).__name__} {value!r}"
    else:
        message = f"'{key}': {str(error['msg']).removeprefix('Value error, ')}"
    return ConfigError(message, path=doc.path, line=line, hint=hint)


def _shown(table: list[str]) -> str:
    """A table path as TOML writes it: `torch."2.14"`."""
    return ".".join(part if re.fullmatch(r"[A-Za-z0-9_-]+", part) else f'"{part}"' for part in table)


def _walk(model: type[BaseModel], loc: tuple[Any, ...]) -> Any:
    """The field of `model` at `loc` (list indices skipped): its FieldInfo, or the model at the end."""
    current: Any = model
    info = None
    for part in loc:
        if isinstance(part, int):
            continue
        if get_origin(current) is dict:  # a key of a table of tables ([pool.<name>]): its value's type
            current = get_args(current)[1]
            continue
        inner = _model_of(current)
        if inner is None or part not in inner.model_fields:
            return info
        info = inner.model_fields[part]
        current = info.annotation
    return info


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def _choices(annotation: Any) -> list[Any]:
    """The values of the Literal in a field's type (in a list of them, or optional)."""
    if get_origin(annotation) is Literal:
        return list(get_args(annotation))
    return next((found for arg in get_args(annotation) if (found := _choices(arg))), [])


def _fields_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    info = _walk(model, loc) if loc else None
    inner = model if not loc else _model_of(info.annotation) if info is not None else None
    return list(inner.model_fields) if inner is not None else []


def _bounds(model: type[BaseModel], loc: tuple[Any, ...]) -> tuple[float | None, float | None]:
    info = _walk(model, loc)
    low = high = None
    for rule in getattr(info, "metadata", ()):
        low = getattr(rule, "ge", None) if getattr(rule, "ge", None) is not None else low
        low = getattr(rule, "gt", None) if getattr(rule, "gt", None) is not None else low
        high = getattr(rule, "le", None) if getattr(rule, "le", None) is not None else high
        high = getattr(rule, "lt", None) if getattr(rule, "lt", None) is not None else high
    return low, high


def to_date(value: Any) -> Any:
    """A TOML date, or a string that is one (YYYY-MM-DD): a BeforeValidator for date fields."""
    if isinstance(value, str):
        try:
            return dt.date.fromisoformat(value)
        except ValueError:
            raise ValueError(f"{value!r} is not a date (YYYY-MM-DD)") from None
    return value


def to_list(value: Any) -> Any:
    """A string or a list of strings, as a list: a BeforeValidator."""
    return [value] if isinstance(value, str) else value
