"""The cell a result is about, as results.jsonl records it (`model.Cell.to_json`, plus the phase):
typed where the harness reads it (the stack's versions, the topology), the rest kept as JSON."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from stackgate.boundary.base import Model, Name, OpenModel, Text


class StackRecord(OpenModel):
    """A stack's versions (what history and the selftest read); its source, base image and extra
    requirements are kept as written."""

    torch: Name = ""
    cuda: Name = ""
    python: Name = ""
    channel: Name = ""


class CellRecord(Model):
    id: Text = ""
    role: Name = ""
    required: bool = False
    baseline: Text = ""
    pool: Name = ""
    driver: Name | None = None
    gpu_class: Name = ""
    transport: Name = ""
    device: Name = ""
    topology: Name = ""
    stack: StackRecord = Field(default_factory=StackRecord)
    phase: Name = ""

    @classmethod
    def of(cls, data: Any) -> CellRecord:
        return data if isinstance(data, CellRecord) else cls.model_validate(data or {})

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_unset=True)

    @property
    def nodes_and_processes(self) -> tuple[int, int]:
        """The topology, "<nodes>x<processes per node>" (ValueError when it is not one)."""
        nodes, _, nproc = self.topology.partition("x")
        return int(nodes), int(nproc)
