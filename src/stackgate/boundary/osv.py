"""An OSV record (https://ossf.github.io/osv-schema/), as far as the supply-chain gate reads it. The
schema has many more fields, which are ignored; the ones read are typed and bounded here, so a record
with a field of the wrong type is a ConfigError naming the file and the field, never a crash."""

from __future__ import annotations

from typing import Annotated

from pydantic import ConfigDict, Field

from stackgate.boundary.base import Model, Name, Text

Short = Annotated[str, Field(max_length=2000)]


class _Osv(Model):
    model_config = ConfigDict(extra="ignore")


class PackageRef(_Osv):
    ecosystem: Name = ""
    name: Short = ""


class Event(_Osv):
    introduced: Short | None = None
    fixed: Short | None = None
    last_affected: Short | None = None
    limit: Short | None = None

    def points(self) -> list[tuple[str, str]]:
        return [(kind, value) for kind, value in (("introduced", self.introduced), ("fixed", self.fixed),
                                                  ("last_affected", self.last_affected), ("limit", self.limit))
                if value is not None]


class Range(_Osv):
    type: Name = ""
    events: Annotated[list[Event], Field(max_length=10_000)] = Field(default_factory=list)


class Affected(_Osv):
    package: PackageRef = Field(default_factory=PackageRef)
    versions: Annotated[list[Short], Field(max_length=100_000)] = Field(default_factory=list)
    ranges: Annotated[list[Range], Field(max_length=1000)] = Field(default_factory=list)


class Score(_Osv):
    type: Name = ""
    score: Short = ""


class Specific(_Osv):
    severity: Name | None = None


class Record(_Osv):
    id: Annotated[str, Field(min_length=1, max_length=200)]
    aliases: Annotated[list[Name], Field(max_length=1000)] = Field(default_factory=list)
    upstream: Annotated[list[Name], Field(max_length=1000)] = Field(default_factory=list)
    summary: Text = ""
    details: Text = ""
    withdrawn: Name | None = None
    affected: Annotated[list[Affected], Field(max_length=10_000)] = Field(default_factory=list)
    severity: Annotated[list[Score], Field(max_length=100)] = Field(default_factory=list)
    database_specific: Specific | None = None
