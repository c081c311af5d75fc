"""TOML loading with positions: tomllib gives no line numbers, so we find them in the text.

Every value read from a file goes through `Doc`, which knows its file and can point at the line of
a key, so that errors read `matrix/upgrade.toml:12: unknown key 'pols' (did you mean 'pools'?)`.
"""

from __future__ import annotations

import difflib
import math
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
                table = tuple(_unquote(part) for part in header.group(1).split("."))
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


def get(doc: Doc, table: Mapping[str, Any], key: str, kind: type | tuple[type, ...], *where: str,
        default: Any = ...) -> Any:
    """Typed access: a wrong type names the file, line and the expected type."""
    if key not in table:
        if default is ...:
            raise doc.error(f"missing required key '{key}'", *where, hint=f"add '{key} = ...' to [{'.'.join(where) or 'top level'}]")
        return default
    value = table[key]
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        ok = False
    else:
        ok = isinstance(value, kind)
    if not ok:
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise doc.error(f"'{key}' must be {names}, got {type(value).__name__} {value!r}", *where, key)
    if isinstance(value, float) and not math.isfinite(value):  # TOML spells nan and inf; no setting means them
        raise doc.error(f"'{key}' = {value!r} is not a finite number", *where, key,
                        hint="give a finite number within the documented range")
    return value


def str_list(doc: Doc, table: Mapping[str, Any], key: str, *where: str, default: Any = ...,
             nonempty: bool = False) -> tuple[str, ...]:
    """A string or a list of strings; `nonempty`: an empty list is an error (an axis with no value
    expands to no cell at all)."""
    value = get(doc, table, key, (list, str), *where, default=default)
    if nonempty and value == []:
        raise doc.error(f"'{key}' is an empty list", *where, key, hint=f"give at least one value for '{key}'")
    if value is default and default is not ...:
        return tuple(default) if isinstance(default, (list, tuple)) else default
    if isinstance(value, str):
        return (value,)
    for item in value:
        if not isinstance(item, str):
            raise doc.error(f"'{key}' must be a list of strings, found {item!r}", *where, key)
    return tuple(value)


def parsed(doc: Doc, parser: Any, value: Any, *keys: str) -> Any:
    """`parser(value)`, its error said at the TOML line of `keys`."""
    try:
        return parser(value)
    except ConfigError as exc:
        raise doc.error(str(exc), *keys, hint=exc.hint) from None
    except ValueError as exc:
        raise doc.error(str(exc), *keys) from None
