"""What every boundary model shares: strict, frozen, closed (an unknown field is an error unless a
model says otherwise), and bounded types; and one way to say what failed, where."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from stackgate.errors import ConfigError

MAX_TEXT = 1 << 20  # one string (a test's message, a log tail: each is clipped long before this by the harness)
MAX_NAME = 500  # a name: a metric, a tag, a test id, a cell id
MAX_ITEMS = 100_000  # one list
MAX_INT = 1 << 53  # integers a float holds exactly: sizes, counts, rounds


class Model(BaseModel):
    """A boundary model: strict types, frozen, unknown fields refused, NaN/inf refused unless a field
    admits them."""

    model_config = ConfigDict(strict=True, frozen=True, extra="forbid", allow_inf_nan=False,
                              validate_default=False)


class OpenModel(Model):
    """A model that keeps fields it does not know (a suite's own environment keys), bounded like JSON."""

    model_config = ConfigDict(extra="allow")


Name = Annotated[str, Field(max_length=MAX_NAME)]
Text = Annotated[str, Field(max_length=MAX_TEXT)]
Count = Annotated[int, Field(ge=0, le=MAX_INT)]
Seconds = Annotated[float, Field(ge=0, le=1e9)]
# a sample as recorded: a number, never a boolean or a string; NaN and inf pass here (a numerics
# trajectory that went NaN is evidence), and a performance metric refuses them (records.MetricRecord)
Sample = Annotated[float, Field(allow_inf_nan=True)]


def describe(exc: ValidationError, limit: int = 3) -> str:
    """`field.path: what` for the first errors of a validation, in one line."""
    parts = []
    for error in exc.errors(include_url=False)[:limit]:
        where = ".".join(str(p) for p in error["loc"]) or "(the whole record)"
        parts.append(f"{where}: {error['msg']}")
    more = exc.error_count() - limit
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def quote(raw: bytes | str, keep: int = 200) -> str:
    """A line as it was, shortened, with bytes that are not UTF-8 shown."""
    text = raw.decode("utf-8", "backslashreplace") if isinstance(raw, bytes) else raw
    return text[:keep]


def dump(model: BaseModel) -> dict[str, Any]:
    return model.model_dump(mode="json")


M = TypeVar("M", bound=BaseModel)


def read_bytes(path: Path, missing: str, hint: str | None = None) -> bytes:
    """A file's bytes; `missing` (and `hint`) is the ConfigError when it is not there."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(missing, hint=hint) from None
    except OSError as exc:
        raise ConfigError(f"{path} cannot be read: {exc.strerror}") from None


def parse_json(raw: bytes | str, model: type[M], invalid: str, hint: str | None = None) -> M:
    """`raw` as `model`; `invalid` (with what failed, where) is the ConfigError when it is not one."""
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise ConfigError(f"{invalid} ({describe(exc)})", hint=hint) from None
