"""Test outcomes from pytest's JUnit XML (xunit1, one file per node and invocation), read at the
boundary: a file that cannot be read (not XML, an encoding Python does not know, a damaged or huge
file, a duration that is not a number) is a problem naming it, never a crash and never skipped."""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from stackgate.model import Outcome, TestOutcome
from stackgate.rundir.layout import junit_name

MAX_JUNIT_BYTES = 256 << 20  # one JUnit file (pytest writes ~1 kB per test)
_NAME = re.compile(r"junit-node([0-9]+)-(.+)\.xml")


@dataclass
class JUnit:
    tests: tuple[TestOutcome, ...] = ()
    problems: list[str] = field(default_factory=list)  # "junit-node1-suite.xml: why"
    cases: dict[str, int] = field(default_factory=dict)  # file name -> test cases read from it


def parse_junit(paths: list[Path]) -> tuple[TestOutcome, ...]:
    """Merge per-node JUnit files: a test passes only if it passed on every node."""
    return read_junit(paths).tests


def read_junit(paths: list[Path]) -> JUnit:
    """Every file's test cases, merged (a test passes only if it passed on every node), and what could
    not be read."""
    merged: dict[str, TestOutcome] = {}
    rank = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}
    out = JUnit()
    for path in paths:
        if not path.exists():
            continue
        try:
            if path.stat().st_size > MAX_JUNIT_BYTES:
                raise ValueError(f"{path.stat().st_size} bytes, more than the limit of {MAX_JUNIT_BYTES}")
            root = ET.parse(path).getroot()
            cases = [_case(case) for case in root.iter("testcase")]
        except (ET.ParseError, ValueError, LookupError, OSError, RecursionError) as exc:
            out.problems.append(f"{path.name}: unreadable JUnit ({type(exc).__name__}: {str(exc)[:200]})")
            continue
        out.cases[path.name] = len(cases)
        for current in cases:
            previous = merged.get(current.name)
            if previous is None or rank[current.outcome] > rank[previous.outcome]:
                merged[current.name] = current
    out.tests = tuple(merged.values())
    return out


def missing_nodes(paths: list[Path], nodes: set[int], junit: JUnit) -> list[str]:
    """Every node that ran must leave readable JUnit with test cases for every invocation any node
    left one for; each node that did not is named (a multi-node cell is judged on all its nodes)."""
    seen: dict[tuple[int, str], Path] = {}
    for path in paths:
        found = _NAME.fullmatch(path.name)
        if found is not None:
            seen[(int(found.group(1)), found.group(2))] = path
    labels = sorted({label for _, label in seen})
    out = []
    for node in sorted(nodes):
        for label in labels:
            name = junit_name(node, label)
            if (node, label) not in seen:
                out.append(f"{name}: missing (node {node} ran, but left no JUnit for its {label} run)")
            elif junit.cases.get(name) == 0 and any(junit.cases.get(junit_name(n, label)) for n in nodes):
                out.append(f"{name}: empty (no test case, while another node's {label} run recorded tests)")
    return out


def _duration(text: str | None) -> float:
    if not text:
        return 0.0
    value = float(text)  # "1,5" and "abc" are ValueErrors: the file is unreadable
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"a test's time is {text!r}, not a duration")
    return value


def _case(case: ET.Element) -> TestOutcome:
    name = _case_name(case)
    outcome, message = "passed", ""
    for tag in ("error", "failure", "skipped"):
        node = case.find(tag)
        if node is not None:
            outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
            message = (node.get("message") or "") + ("\n" + node.text if node.text and tag != "skipped" else "")
            break
    return TestOutcome(name, Outcome(outcome), _duration(case.get("time")), _clip(message.strip()))


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
