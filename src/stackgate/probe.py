"""The host probe: before any cell runs on a GPU pool, the machine must match the pool's declaration
(driver version, GPU model and count, the CUDA version the driver supports) and be healthy (no GPU
in an error state, no uncorrectable ECC errors, no pending row remaps or page retirements, no recent
Xid errors in the kernel log where it is readable).

Facts come from NVIDIA's own bindings (`nvidia-ml-py`, imported as `pynvml`) and, where those are
missing or fail, from `nvidia-smi -q -x`. Decisions are pure functions over the facts, so they are
tested on captured outputs. A mismatch or an unhealthy host makes the pool's cells `host-mismatch` /
`host-unhealthy`: INCONCLUSIVE with the evidence, never a NO-GO for the stack.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from stackgate.model import RunnerPool

_XID = re.compile(r"NVRM: Xid \((?P<where>[^)]*)\): (?P<code>[0-9]+)(?P<rest>.*)")


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    uuid: str = ""
    ecc_uncorrectable: int = 0  # volatile (since the driver loaded)
    remap_pending: bool = False
    remap_failed: bool = False
    retirement_pending: bool = False
    error: str = ""  # the GPU could not be queried (fallen off the bus, ...)


@dataclass(frozen=True)
class HostFacts:
    source: str  # nvml | nvidia-smi | none
    driver: str | None = None
    cuda_driver: str | None = None  # the newest CUDA version the driver supports, e.g. "13.0"
    gpus: tuple[Gpu, ...] = ()
    xid: tuple[str, ...] = ()  # kernel log lines
    kernel_log: str = "not read"  # where Xid events were looked for
    errors: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """As JSON holds it (lists, not tuples): what run.json and the reports record."""
        return {**asdict(self), "gpus": [asdict(g) for g in self.gpus], "xid": list(self.xid),
                "errors": list(self.errors)}


@dataclass(frozen=True)
class ProbeResult:
    pool: str
    status: str  # ok | host-mismatch | host-unhealthy | no-gpu
    evidence: tuple[str, ...] = ()
    facts: HostFacts = field(default_factory=lambda: HostFacts("none"))

    @property
    def ok(self) -> bool:
        return self.status in ("ok", "no-gpu")

    def to_json(self) -> dict[str, Any]:
        return {"pool": self.pool, "status": self.status, "evidence": list(self.evidence),
                "facts": self.facts.to_json()}


# ------------------------------------------------------------------------------------------ parsing

def _int(text: str | None) -> int:
    try:
        return int((text or "0").strip())
    except ValueError:
        return 0  # "N/A" on GPUs without ECC


def _yes(text: str | None) -> bool:
    return (text or "").strip().lower() == "yes"


def facts_from_smi_xml(text: str) -> HostFacts:
    """`nvidia-smi -q -x`, both the current ECC layout (sram_/dram_uncorrectable) and the older one
    (double_bit totals)."""
    root = ET.fromstring(text)
    gpus = []
    for index, g in enumerate(root.iter("gpu")):
        volatile = g.find("ecc_errors/volatile")
        unc = 0
        if volatile is not None:
            for el in volatile.iter():
                if "uncorrectable" in el.tag and not list(el):
                    unc += _int(el.text)
            double = volatile.find("double_bit/total")
            if double is not None:
                unc += _int(double.text)
        name = (g.findtext("product_name") or "").strip()
        error = name if "ERR" in name.upper() or "unknown error" in name.lower() else ""
        gpus.append(Gpu(
            index=index, name=name, uuid=(g.findtext("uuid") or "").strip(), ecc_uncorrectable=unc,
            remap_pending=_yes(g.findtext("remapped_rows/remapped_row_pending")),
            remap_failed=_yes(g.findtext("remapped_rows/remapped_row_failure")),
            retirement_pending=_yes(g.findtext("retired_pages/pending_retirement"))
            or _yes(g.findtext("retired_pages/pending_blacklist")),
            error=error))
    return HostFacts("nvidia-smi", driver=(root.findtext("driver_version") or "").strip() or None,
                     cuda_driver=(root.findtext("cuda_version") or "").strip() or None, gpus=tuple(gpus))


def xid_events(kernel_log: str) -> tuple[str, ...]:
    """`NVRM: Xid (PCI:...): 79, ...` lines of a kernel log (dmesg)."""
    return tuple(m.group(0).strip() for m in _XID.finditer(kernel_log))


def facts_from_nvml(nvml: Any) -> HostFacts:
    """Through NVIDIA's Python bindings (the `pynvml` module of nvidia-ml-py)."""
    nvml.nvmlInit()
    try:
        driver = _str(nvml.nvmlSystemGetDriverVersion())
        cuda = nvml.nvmlSystemGetCudaDriverVersion_v2()
        gpus = []
        for index in range(nvml.nvmlDeviceGetCount()):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
            except nvml.NVMLError as exc:
                gpus.append(Gpu(index, "", error=f"cannot get a handle: {exc}"))
                continue
            unc = _optional(lambda h=handle: nvml.nvmlDeviceGetTotalEccErrors(
                h, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC), nvml, 0)
            remap = _optional(lambda h=handle: nvml.nvmlDeviceGetRemappedRows(h), nvml, (0, 0, 0, 0))
            pending = _optional(lambda h=handle: nvml.nvmlDeviceGetRetiredPagesPendingStatus(h), nvml, 0)
            gpus.append(Gpu(index, _str(nvml.nvmlDeviceGetName(handle)), _str(nvml.nvmlDeviceGetUUID(handle)),
                            int(unc), bool(remap[2]), bool(remap[3]), bool(pending)))
    finally:
        nvml.nvmlShutdown()
    return HostFacts("nvml", driver=driver, cuda_driver=f"{cuda // 1000}.{cuda % 1000 // 10}", gpus=tuple(gpus))


def _str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _optional(call: Any, nvml: Any, default: Any) -> Any:
    try:
        return call()
    except nvml.NVMLError:  # NotSupported on GPUs without ECC / row remapping
        return default


def gather() -> HostFacts:
    """The facts of this machine: NVML first, `nvidia-smi -q -x` as the fallback, plus the kernel
    log's Xid events where it is readable."""
    errors: list[str] = []
    facts: HostFacts | None = None
    try:
        import pynvml
        facts = facts_from_nvml(pynvml)
    except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, ...
        errors.append(f"nvml: {exc}")
    if facts is None and shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "-q", "-x"], capture_output=True, text=True, timeout=60, check=False)
            facts = facts_from_smi_xml(out.stdout) if out.returncode == 0 else None
            if facts is None:
                errors.append(f"nvidia-smi -q -x exited {out.returncode}: {out.stderr.strip()[:300]}")
        except (OSError, subprocess.TimeoutExpired, ET.ParseError) as exc:
            errors.append(f"nvidia-smi: {exc}")
    facts = facts or HostFacts("none")
    log, where = _kernel_log()
    return HostFacts(facts.source, facts.driver, facts.cuda_driver, facts.gpus, xid_events(log), where,
                     (*facts.errors, *errors))


def _kernel_log() -> tuple[str, str]:
    try:
        out = subprocess.run(["dmesg", "--ctime"], capture_output=True, text=True, timeout=30, check=False)
        if out.returncode == 0:
            return out.stdout, "dmesg"
    except (OSError, subprocess.TimeoutExpired):
        pass
    for path in (Path("/var/log/kern.log"), Path("/var/log/messages")):
        try:
            return path.read_text(errors="replace")[-2_000_000:], str(path)
        except OSError:
            continue
    return "", "not readable (no dmesg permission, no kernel log file)"


# ----------------------------------------------------------------------------------------- decision

def check(pool: RunnerPool, facts: HostFacts, needs_cuda: Sequence[str] = ()) -> ProbeResult:
    """Does this machine match `pool`'s declaration, and is it healthy? `needs_cuda`: the CUDA
    versions ("13.0") the pool's cells run."""
    if not pool.has_gpu:
        return ProbeResult(pool.name, "no-gpu", ("CPU pool: nothing to probe",), facts)
    mismatch: list[str] = []
    if facts.source == "none" or facts.driver is None:
        mismatch.append("no NVIDIA driver answered (NVML and nvidia-smi): " + "; ".join(facts.errors))
        return ProbeResult(pool.name, "host-mismatch", tuple(mismatch), facts)
    declared = str(pool.driver)
    if facts.driver != declared and not facts.driver.startswith(declared + "."):
        mismatch.append(f"driver {facts.driver}, but pool {pool.name} declares {declared}")
    if pool.gpu and not all(pool.gpu.lower() in g.name.lower() for g in facts.gpus if not g.error):
        names = sorted({g.name for g in facts.gpus})
        mismatch.append(f"GPU model {', '.join(names)}, but pool {pool.name} declares {pool.gpu}")
    if len(facts.gpus) != pool.gpus_per_node:
        mismatch.append(f"{len(facts.gpus)} GPU(s), but pool {pool.name} declares {pool.gpus_per_node} per node")
    if facts.cuda_driver:
        have = tuple(int(x) for x in facts.cuda_driver.split(".")[:2])
        for need in needs_cuda:
            want = tuple(int(x) for x in need.split(".")[:2])
            if want[0] > have[0]:
                mismatch.append(f"the driver supports CUDA {facts.cuda_driver}; cells need CUDA {need}")
    if mismatch:
        return ProbeResult(pool.name, "host-mismatch", tuple(mismatch), facts)
    unhealthy: list[str] = []
    for g in facts.gpus:
        label = f"GPU {g.index} ({g.name or '?'} {g.uuid})".replace(" )", ")")
        if g.error:
            unhealthy.append(f"{label} is in an error state: {g.error}")
        if g.ecc_uncorrectable:
            unhealthy.append(f"{label} has {g.ecc_uncorrectable} uncorrectable ECC error(s) since the driver loaded")
        if g.remap_pending:
            unhealthy.append(f"{label} has a row remap pending (a reset is needed)")
        if g.remap_failed:
            unhealthy.append(f"{label} had a row remapping failure")
        if g.retirement_pending:
            unhealthy.append(f"{label} has a page retirement pending (a reset is needed)")
    unhealthy += [f"kernel log ({facts.kernel_log}): {line}" for line in facts.xid]
    if unhealthy:
        return ProbeResult(pool.name, "host-unhealthy", tuple(unhealthy), facts)
    return ProbeResult(pool.name, "ok", (f"driver {facts.driver} (CUDA {facts.cuda_driver}), "
                                         f"{len(facts.gpus)} x {facts.gpus[0].name if facts.gpus else '?'}; "
                                         f"no ECC, remap, retirement or Xid problems ({facts.kernel_log})",), facts)
