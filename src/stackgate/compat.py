"""The compatibility solver: which (driver, CUDA, torch, Python, GPU class) combinations can exist.

Rules come from `matrix/compat.toml`; each evaluation returns every rule that decided, so a pruned
cell or a `compat check` always says why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.version import Version

from stackgate import tomlfile
from stackgate.boundary.compat import CompatFile
from stackgate.errors import ConfigError
from stackgate.model import GpuClass
from stackgate.versions import CudaVariant, Driver, parse_driver, parse_python, parse_torch, release_series


@dataclass(frozen=True)
class DriverRule:
    key: str
    min_driver: Driver
    source: str


@dataclass(frozen=True)
class TorchRelease:
    series: str
    cuda: tuple[CudaVariant, ...]
    python: tuple[str, ...]
    pypi_default: CudaVariant | None
    line: int | None = None  # where the row's pypi_default (else its header) is written, for errors


@dataclass(frozen=True)
class CompatTable:
    path: Path
    drivers: dict[str, DriverRule]
    forward_compat_classes: tuple[GpuClass, ...]
    forward_compat_min_driver: Driver
    forward_compat_source: str
    torch: dict[str, TorchRelease]
    forward_compat_branches: dict[str, str] = field(default_factory=dict)  # driver major -> ltsb | pb | nfb

    def branch_supports_forward_compat(self, driver: Driver) -> tuple[bool, str]:
        kind = self.forward_compat_branches.get(str(driver.major))
        if kind in ("ltsb", "pb"):
            return True, f"R{driver.major} is a {'Long Term Support' if kind == 'ltsb' else 'Production'} Branch"
        if kind == "nfb":
            return False, f"R{driver.major} is a New Feature Branch: NVIDIA does not support forward compatibility on it"
        return False, f"R{driver.major} is not a driver branch listed for forward compatibility in {self.path.name}"

    def driver_rule(self, cuda: Version) -> DriverRule | None:
        return self.drivers.get(f"{cuda.major}.{cuda.minor}") or self.drivers.get(str(cuda.major))

    def release(self, torch: Version) -> TorchRelease | None:
        return self.torch.get(release_series(torch))


@dataclass(frozen=True)
class RuleOutcome:
    rule: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class Compatibility:
    ok: bool
    outcomes: tuple[RuleOutcome, ...]
    uses_forward_compat: bool = False

    @property
    def failures(self) -> tuple[RuleOutcome, ...]:
        return tuple(o for o in self.outcomes if not o.ok)

    def to_json(self) -> dict[str, Any]:
        return {
            "compatible": self.ok,
            "uses_forward_compat": self.uses_forward_compat,
            "rules": [{"rule": o.rule, "ok": o.ok, "detail": o.detail} for o in self.outcomes],
        }


def load_compat(path: Path) -> CompatTable:
    """compat.toml (`boundary.compat.CompatFile`), each version in it parsed, an error at its line."""
    doc = tomlfile.load(path)
    f = tomlfile.validate(doc, CompatFile)
    drivers = {key: DriverRule(key=key, min_driver=tomlfile.parsed(doc, parse_driver, row.min_driver, "cuda", key,
                                                                   "min_driver"), source=row.source)
               for key, row in f.cuda.items()}
    fc = f.forward_compat
    releases = {series: TorchRelease(
        series=series,
        cuda=tuple(tomlfile.parsed(doc, CudaVariant.parse, v, "torch", series, "cuda") for v in row.cuda),
        python=tuple(tomlfile.parsed(doc, parse_python, p, "torch", series, "python") for p in row.python),
        pypi_default=tomlfile.parsed(doc, CudaVariant.parse, row.pypi_default, "torch", series, "pypi_default")
        if row.pypi_default else None,
        line=_row_line(doc, series),
    ) for series, row in f.torch.items()}
    return CompatTable(
        path=path,
        drivers=drivers,
        forward_compat_classes=tuple(GpuClass(c) for c in fc.gpu_classes),
        forward_compat_min_driver=tomlfile.parsed(doc, parse_driver, fc.min_driver, "forward_compat", "min_driver"),
        forward_compat_source=fc.source,
        torch=releases,
        forward_compat_branches={branch: row.kind for branch, row in fc.branches.items()},
    )


def _row_line(doc: tomlfile.Doc, series: str) -> int | None:
    """The line of `pypi_default` in `[torch."<series>"]` (else the header's): dotted series names
    defeat the generic key finder."""
    header = None
    for number, raw in enumerate(doc.lines, start=1):
        text = raw.strip()
        if text.startswith("["):
            if header is not None:
                break
            if text.replace("'", '"').replace(" ", "") in (f'[torch."{series}"]', f"[torch.{series}]"):
                header = number
        elif header is not None and text.startswith("pypi_default"):
            return number
    return header


def check(
    table: CompatTable,
    *,
    torch: Version,
    cuda: CudaVariant,
    python: str | None = None,
    driver: Driver | None = None,
    gpu_class: GpuClass = GpuClass.DATACENTER,
    has_compat_package: bool = False,
) -> Compatibility:
    """Evaluate every rule; compatible only if none fails. `driver=None` means a CPU runner."""
    outcomes: list[RuleOutcome] = []
    release = table.release(torch)
    if release is None:
        known = ", ".join(sorted(table.torch, key=Version))
        outcomes.append(RuleOutcome("torch-release-known", False,
                                    f"torch {torch} (series {release_series(torch)}) is not in {table.path.name}; known: {known}"))
    else:
        ships = cuda in release.cuda
        outcomes.append(RuleOutcome(
            "torch-ships-variant", ships,
            f"torch {release.series} ships {', '.join(v.tag for v in release.cuda)}"
            + ("" if ships else f"; not {cuda.tag}"),
        ))
        if python is not None:
            supported = python in release.python
            outcomes.append(RuleOutcome(
                "torch-supports-python", supported,
                f"torch {release.series} supports Python {', '.join(release.python)}"
                + ("" if supported else f"; not {python}"),
            ))
    if torch.local and torch.local != cuda.tag:
        outcomes.append(RuleOutcome("local-label-matches", False,
                                    f"torch {torch} is a +{torch.local} build but the cell asks for {cuda.tag}"))

    uses_fc = False
    cuda_version = cuda.cuda_version
    if cuda_version is None:
        outcomes.append(RuleOutcome("cpu-build", True, "a +cpu build has no CUDA and needs no driver"))
    elif driver is None:
        outcomes.append(RuleOutcome("cpu-runner", True,
                                    f"no GPU: the {cuda.tag} build runs in CPU mode; CUDA paths are not exercised"))
    else:
        rule = table.driver_rule(cuda_version)
        if rule is None:
            outcomes.append(RuleOutcome("cuda-driver-known", False,
                                        f"no minimum-driver row for CUDA {cuda_version} in {table.path.name}"))
        elif driver >= rule.min_driver:
            outcomes.append(RuleOutcome("cuda-min-driver", True,
                                        f"CUDA {cuda_version} needs driver >= {rule.min_driver}; driver is {driver}"))
        else:
            branch_ok, branch_why = table.branch_supports_forward_compat(driver)
            fc_ok = (
                gpu_class in table.forward_compat_classes
                and has_compat_package
                and driver >= table.forward_compat_min_driver
                and branch_ok
            )
            outcomes.append(RuleOutcome("cuda-min-driver", fc_ok,
                                        f"CUDA {cuda_version} needs driver >= {rule.min_driver}; driver is {driver}"
                                        + (" (allowed through forward compatibility)" if fc_ok else "")))
            if fc_ok:
                uses_fc = True
                outcomes.append(RuleOutcome("forward-compat", True,
                                            f"{gpu_class.value} GPU with the cuda-compat package, driver >= "
                                            f"{table.forward_compat_min_driver}; {branch_why}"))
            else:
                why = []
                if gpu_class not in table.forward_compat_classes:
                    why.append(f"forward compatibility is only for {', '.join(c.value for c in table.forward_compat_classes)} GPUs, not {gpu_class.value}")
                if not has_compat_package:
                    why.append("the image does not carry the cuda-compat package")
                if driver < table.forward_compat_min_driver:
                    why.append(f"forward compatibility needs driver >= {table.forward_compat_min_driver}")
                if not branch_ok:
                    why.append(branch_why)
                outcomes.append(RuleOutcome("forward-compat", False, "; ".join(why)))
    return Compatibility(ok=all(o.ok for o in outcomes), outcomes=tuple(outcomes), uses_forward_compat=uses_fc)


def check_strings(
    table: CompatTable,
    *,
    torch: str,
    cuda: str,
    driver: str | None,
    python: str | None,
    gpu_class: str,
    compat_package: bool,
) -> Compatibility:
    """The `compat check` entry point: parse at the edge, then `check`."""
    try:
        klass = GpuClass(gpu_class)
    except ValueError:
        raise ConfigError(f"unknown GPU class {gpu_class!r}", hint="use datacenter, consumer or none") from None
    return check(
        table,
        torch=parse_torch(torch),
        cuda=CudaVariant.parse(cuda),
        python=parse_python(python) if python else None,
        driver=parse_driver(driver) if driver else None,
        gpu_class=klass,
        has_compat_package=compat_package,
    )
