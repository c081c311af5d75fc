"""The project files stackgate reads besides its own configuration: stackgate.toml (`[run]` options
and `[registry]`; each `[run]` value is parsed by its option's declaration, `options.read`) and a
user suite's pyproject.toml, of which only `[tool.stackgate]` and `[dependency-groups]` (PEP 735)
matter: the rest is the project's own and is not read."""

from __future__ import annotations

from typing import Annotated

from pydantic import ConfigDict, Field, JsonValue

from stackgate.boundary.base import Model, Name, Text
from stackgate.boundary.fleet import RegistryTable


class StackgateToml(Model):
    run: Annotated[dict[Name, JsonValue], Field(max_length=1000)] = Field(default_factory=dict)
    registry: RegistryTable | None = None


class IncludeGroup(Model):
    include_group: Name = Field(alias="include-group")


class StackgateTool(Model):
    """`[tool.stackgate]` of a user suite's pyproject.toml."""

    dependency_group: Name = Field(default="", alias="dependency-group")


class Tool(Model):
    model_config = ConfigDict(extra="ignore")
    stackgate: StackgateTool = Field(default_factory=StackgateTool)


class PyProject(Model):
    model_config = ConfigDict(extra="ignore")
    tool: Tool = Field(default_factory=Tool)
    dependency_groups: Annotated[dict[Name, Annotated[list[Text | IncludeGroup], Field(max_length=10_000)]],
                                 Field(max_length=1000)] = Field(default_factory=dict, alias="dependency-groups")
