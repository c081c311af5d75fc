"""Stacks a team already has: an interpreter on this machine (a machine image's Python, a conda env,
a venv made by hand: `--candidate-python`, `--production-python`), or a prebuilt image
(`--candidate-image`). stackgate never installs into them: it probes what they hold (torch and its
CUDA build, cuDNN, NCCL, Python, every installed distribution) and the stack's identity comes from
the probe, so the compat rules and the identity tests judge what is really there. A declared torch
(`--candidate X`) that disagrees with the probe is a configuration error naming both, before any
suite runs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from stackgate import proc, tomlfile
from stackgate.boundary.matrix import StackRow
from stackgate.boundary.probe import parse_given
from stackgate.errors import ConfigError, InfraError
from stackgate.versions import CudaVariant, parse_torch

HOST = "host"
IMAGE = "image"

# Run by the stack's own interpreter: it prints one line, `stackgate-given <json>`.
PROBE = r"""
import json, sys
from importlib import metadata
out = {"python": "%d.%d" % sys.version_info[:2], "executable": sys.executable,
       "venv": sys.prefix != getattr(sys, "base_prefix", sys.prefix)}
try:
    import torch
    out["torch"] = torch.__version__
    out["cuda"] = torch.version.cuda
    try:
        out["cudnn"] = str(torch.backends.cudnn.version())
    except Exception:
        out["cudnn"] = None
    try:
        out["nccl"] = ".".join(str(p) for p in torch.cuda.nccl.version())
    except Exception:
        out["nccl"] = None
except Exception as exc:
    out["error"] = "%s: %s" % (type(exc).__name__, exc)
names = {}
for dist in metadata.distributions():
    name = dist.metadata["Name"]
    if name and name.lower() not in names:
        names[name.lower()] = "%s==%s" % (name, dist.version)
out["packages"] = sorted(names.values(), key=str.lower)
print("stackgate-given " + json.dumps(out))
"""


@dataclass(frozen=True)
class Probed:
    """What a given interpreter holds."""

    kind: str  # HOST | IMAGE
    ref: str  # the interpreter's path, or the image reference
    python: str  # X.Y
    executable: str
    torch: Version
    cuda: CudaVariant
    cudnn: str | None
    nccl: str | None
    packages: tuple[str, ...]  # name==version of every installed distribution
    venv: bool = False

    @property
    def given(self) -> str:
        """The stack's `given` field: where its environment is (never built by stackgate)."""
        return f"{self.kind}:{self.ref}"


def parse(kind: str, ref: str, output: str, exit_code: int = 0) -> Probed:
    """The probe's output, read: an interpreter without torch is a configuration error (the stack
    it is given as has no torch to gate)."""
    lines = [line for line in output.splitlines() if line.startswith("stackgate-given ")]
    if not lines:
        raise ConfigError(f"the {kind} stack {ref}: its interpreter did not answer the probe (exit {exit_code})",
                          hint=output.strip()[-600:] or "is it a Python 3 interpreter?")
    data = parse_given(lines[-1].split(" ", 1)[1], f"the {kind} stack {ref}")
    if data.error is not None or data.torch is None:
        raise ConfigError(f"the {kind} stack {ref} cannot import torch: {data.error or 'no torch'}",
                          hint="give an interpreter (or image) that has the torch to gate installed")
    try:
        torch = parse_torch(data.torch)
        local = torch.local or ""
        cuda = CudaVariant.parse(local.split(".")[0] if local.startswith(("cu", "rocm", "cpu")) else data.cuda or "cpu")
    except (InvalidVersion, ValueError, ConfigError) as exc:
        raise ConfigError(f"the {kind} stack {ref} reports torch {data.torch!r} (CUDA {data.cuda!r}): {exc}") from None
    return Probed(kind=kind, ref=ref, python=data.python, executable=data.executable, torch=torch, cuda=cuda,
                  cudnn=data.cudnn, nccl=data.nccl, packages=tuple(data.packages), venv=data.venv)


def probe_host(python: Path, run: Callable[[Sequence[str]], tuple[int, str]] | None = None) -> Probed:
    """Probe an interpreter on this machine (a short run of it, with a minimal environment)."""
    if not python.is_file():
        raise ConfigError(f"--candidate-python / --production-python {python}: no such interpreter",
                          hint="give the path of a python executable, e.g. /usr/local/conda/bin/python or x/bin/python")
    code, output = (run or _run)([str(python), "-c", PROBE])
    if code != 0 and "stackgate-given " not in output:
        raise ConfigError(f"the host stack {python} failed its probe (exit {code})", hint=output.strip()[-600:])
    return parse(HOST, str(python), output)


def _run(argv: Sequence[str]) -> tuple[int, str]:
    try:
        result = proc.run(list(argv), timeout_s=300, env={"PATH": "/usr/local/bin:/usr/bin:/bin",
                                                          "PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1"})
    except OSError as exc:
        raise InfraError(f"cannot run {argv[0]}: {exc}") from None
    return result.returncode if result.returncode is not None else -1, result.tail


@dataclass(frozen=True)
class Declared:
    """A `[[stack]]` table of a matrix file: the candidate or production stack is one the team has."""

    role: str  # "candidate" | "production"
    kind: str  # HOST | IMAGE
    ref: str  # the interpreter's path (absolute), or the image reference
    python: str  # an image's interpreter ("python3": the first on its PATH)


def declared_stacks(doc: tomlfile.Doc, rows: Sequence[StackRow]) -> tuple[Declared, ...]:
    """`[[stack]] role = "candidate", backend = "host", python = "/usr/local/conda/bin/python"` or
    `[[stack]] role = "candidate", image = "registry/repo@sha256:...", python = "/usr/local/conda/bin/python"`
    (`boundary.matrix.StackRow`); a host interpreter's relative path is taken against the matrix file's
    directory."""
    out: dict[str, Declared] = {}
    for row in rows:
        backend = row.backend if row.backend is not None else (HOST if not row.image else "docker")
        if row.role in out:
            raise doc.error(f"[[stack]] role = {row.role!r}: one stack per role, candidate or production", "stack",
                            hint='role = "candidate" (the default) or "production"')
        if (row.image and backend == HOST) or (not row.image and (backend != HOST or not row.python)):
            raise doc.error("[[stack]] needs either image = REF (with python = its interpreter, optional) or "
                            'backend = "host" with python = PATH', "stack")
        if row.image:
            out[row.role] = Declared(row.role, IMAGE, row.image, row.python or "python3")
        else:
            out[row.role] = Declared(row.role, HOST, str((doc.path.parent / row.python).absolute()), row.python)
    return tuple(out.values())


def check_declared(probed: Probed, declared: str | None, flag: str) -> None:
    """`--candidate 2.13.0` with an interpreter that holds 2.12.0: a clear error naming both."""
    if not declared:
        return
    try:
        wanted = parse_torch(declared)
    except (InvalidVersion, ValueError):
        raise ConfigError(f"--candidate {declared!r} is not a torch version") from None
    if wanted.public != probed.torch.public or (wanted.local and wanted.local != probed.torch.local):
        raise ConfigError(f"{flag} {probed.ref} holds torch {probed.torch} (CUDA build {probed.cuda.tag}), but the "
                          f"run declares torch {declared}",
                          hint=f"drop --candidate (the stack's identity comes from what it holds), or give {flag} "
                               f"an environment with torch {declared}")
