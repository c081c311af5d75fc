"""Test outcomes from pytest's JUnit XML (xunit1, one file per node and invocation)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from stackgate.model import Outcome, TestOutcome


def parse_junit(paths: list[Path]) -> tuple[TestOutcome, ...]:
    """Merge per-node JUnit files: a test passes only if it passed on every node."""
    merged: dict[str, TestOutcome] = {}
    rank = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}
    for path in paths:
        if not path.exists():
            continue
        try:
            root = ET.parse(path).getroot()
        except ET.ParseError:
            continue
        for case in root.iter("testcase"):
            name = _case_name(case)
            outcome, message = "passed", ""
            for tag in ("error", "failure", "skipped"):
                node = case.find(tag)
                if node is not None:
                    outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                    message = (node.get("message") or "") + ("\n" + node.text if node.text and tag != "skipped" else "")
                    break
            current = TestOutcome(name, Outcome(outcome), float(case.get("time") or 0.0), _clip(message.strip()))
            previous = merged.get(name)
            if previous is None or rank[outcome] > rank[previous.outcome]:
                merged[name] = current
    return tuple(merged.values())


def _clip(message: str, keep: int = 4000) -> str:
    """A test's message: its head (the exception's first line, which the reasons quote) and its tail."""
    if len(message) <= keep:
        return message
    return f"{message[:keep // 2]}\n[... {len(message) - keep} characters left out ...]\n{message[-keep // 2:]}"


def _case_name(case: ET.Element) -> str:
    """The test's pytest node id: `file::name`, or `file::Class::name` for a test in a class (xunit1's
    classname is the dotted module, then the class), so a rerun can select exactly that test."""
    classname = case.get("classname") or ""
    file = case.get("file")
    module = file or classname.replace(".", "/") + ".py"
    dotted = module.removesuffix(".py").replace("/", ".")
    inner = classname[len(dotted) + 1:] if file and classname.startswith(dotted + ".") else ""
    return "::".join((module, *inner.split("."), str(case.get("name")))) if inner else f"{module}::{case.get('name')}"
