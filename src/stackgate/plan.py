"""Plan environments before touching an installer or Docker: cells grouped by Stack, in run order."""

from __future__ import annotations

from collections.abc import Sequence

from stackgate.compat import CompatTable
from stackgate.model import Cell, EnvPlan, Role, Stack

SUITE_REQUIREMENTS = ("numpy", "pytest")  # every suite run: pytest, and numpy for the bundled checks


def requirements(table: CompatTable, stack: Stack, suite: Sequence[str] = SUITE_REQUIREMENTS) -> list[str]:
    """What an environment for `stack` installs: torch (PyPI's default variant has no local label),
    the stack's extras, then the suite's needs (`SuiteDeps.install_lines()`, which start with
    SUITE_REQUIREMENTS). Resolution and both backends install exactly this."""
    release = table.release(stack.torch)
    return [stack.requirement(release.pypi_default if release else None), *stack.extra_requirements, *suite]


def plan_envs(cells: Sequence[Cell]) -> tuple[EnvPlan, ...]:
    """One plan per distinct stack; production stacks first (their cells run first)."""
    groups: dict[str, list[Cell]] = {}
    stacks = {}
    for cell in cells:
        key = cell.stack.content_hash
        groups.setdefault(key, []).append(cell)
        stacks[key] = cell.stack
    def order(key: str) -> tuple[bool, str]:
        return (not any(c.role is Role.PRODUCTION for c in groups[key]), stacks[key].label)
    return tuple(EnvPlan(stacks[k], tuple(groups[k])) for k in sorted(groups, key=order))


def run_order(cells: Sequence[Cell]) -> list[Cell]:
    """Production cells first: they write the artifacts candidates read (forward compatibility)."""
    return sorted(cells, key=lambda c: (c.role is Role.CANDIDATE, c.comparison_key, c.id))
