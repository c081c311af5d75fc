"""What the stack's environment holds on disk, for the harness's supply-chain checks: each installed
package's size (its files as they are on disk), and every copy of NCCL, cuDNN and the CUDA runtime
that the dynamic loader can reach (LD_LIBRARY_PATH, the wheels' lib directories that torch's RUNPATH
names, the ld.so cache). A second copy, from a base image, shadowing the wheel's is a known cause of
silent breakage."""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import subprocess
import sysconfig
from pathlib import Path

LIBRARIES = {"libnccl": r"libnccl\.so(\.\d+)*", "libcudnn": r"libcudnn\.so(\.\d+)*",
             "libcudart": r"libcudart\.so(\.\d+)*"}


def package_sizes() -> dict[str, int]:
    """Bytes on disk of each installed distribution (the files its RECORD lists that exist), bytecode
    left out: pip compiles it at install and uv does not, so the same wheel would differ by tens of MB."""
    out: dict[str, int] = {}
    for dist in md.distributions():
        total = 0
        for file in dist.files or ():
            if file.suffix == ".pyc":
                continue
            try:
                total += os.lstat(dist.locate_file(file)).st_size
            except OSError:
                continue
        name = dist.metadata["Name"] or "?"
        out[name] = out.get(name, 0) + total
    return out


def broken_requirements() -> list[str] | None:
    """What `pip check` reports, from the installed metadata alone (a uv-made venv has no pip): each
    installed distribution's requirement (markers evaluated here, extras left out) that is missing or
    installed at a version it excludes. None: neither `packaging` nor pip's copy of it is here."""
    try:
        from packaging.requirements import InvalidRequirement, Requirement
        from packaging.utils import canonicalize_name
    except ImportError:
        try:
            from pip._vendor.packaging.requirements import InvalidRequirement, Requirement  # type: ignore
            from pip._vendor.packaging.utils import canonicalize_name  # type: ignore
        except ImportError:
            return None
    installed = {canonicalize_name(d.metadata["Name"] or ""): d.version for d in md.distributions()}
    out = []
    for dist in md.distributions():
        for line in dist.requires or ():
            try:
                req = Requirement(line)
            except InvalidRequirement:
                continue
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            have = installed.get(canonicalize_name(req.name))
            if have is None:
                out.append(f"{dist.metadata['Name']} {dist.version} requires {req}, which is not installed")
            elif req.specifier and not req.specifier.contains(have, prereleases=True):
                out.append(f"{dist.metadata['Name']} {dist.version} has requirement {req}, but {have} is installed")
    return sorted(set(out))


def _front_dirs() -> list[Path]:
    """Where the loader looks for torch's CUDA libraries before its cache, in its order: LD_LIBRARY_PATH
    (which overrides RUNPATH), then the wheels' lib directories that torch's RUNPATH names."""
    purelib = Path(sysconfig.get_paths()["purelib"])
    dirs = [Path(d) for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    return dirs + [*sorted(purelib.glob("nvidia/*/lib")), purelib / "torch" / "lib"]


def _ld_cache() -> list[Path]:
    try:
        listed = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [Path(line.rsplit("=>", 1)[1].strip()) for line in listed.splitlines() if "=>" in line]


def _copies(paths: list[Path]) -> dict[str, list[str]]:
    found: dict[str, set[str]] = {lib: set() for lib in LIBRARIES}
    for path in paths:
        for lib, pattern in LIBRARIES.items():
            if re.fullmatch(pattern, path.name) and path.exists():
                found[lib].add(os.path.realpath(path))
    return {lib: sorted(p) for lib, p in found.items()}


def loader_copies() -> dict[str, dict[str, list[str]]]:
    """library -> {"competing": the distinct files (by real path) torch's loading can pick from, "cache":
    those in the ld.so cache}. The cache is searched after RUNPATH: a copy there is behind the wheel's
    and competes only when neither LD_LIBRARY_PATH nor the wheels hold one."""
    front = _copies([p for d in _front_dirs() if d.is_dir() for p in d.iterdir()])
    cache = _copies(_ld_cache())
    return {lib: {"competing": front[lib] or cache[lib], "cache": cache[lib]} for lib in LIBRARIES}


# ------------------------------------------------------------------------------- what was mapped
# The stack's shared objects whose copies matter (#43): torch's own, the OpenMP runtime, the C++
# runtime, and on CUDA builds the CUDA runtime, cuBLAS, cuDNN, NCCL, NVRTC and triton's.
MAPPED = re.compile(r"(libtorch\w*|libc10\w*|libshm|libgomp|libiomp5|libomp|libstdc\+\+|libcudart|libcublas\w*|"
                    r"libcudnn\w*|libnccl|libnvrtc\w*|libtriton\w*)(?:-[0-9a-f]{8})?\.so(?:\.[\d.]+)?")
# where a library may come from outside the stack's environment: the system's C++ runtime
SYSTEM_OK = {"libstdc++"}
SYSTEM_DIRS = ("/lib/", "/lib64/", "/usr/lib/", "/usr/lib64/")


def mapped_files(maps: str) -> list[str]:
    """The path of every file-backed mapping of a /proc/<pid>/maps text, as the kernel names it (a file
    removed since is still named by its path), in the text's order, repeats kept."""
    out = []
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].startswith("/"):
            out.append(fields[5].strip().removesuffix(" (deleted)"))
    return out


def mapped_libraries(maps: str) -> dict[str, list[str]]:
    """library -> the distinct files (real paths) of it that a /proc/<pid>/maps text shows mapped.
    A wheel's auditwheel copy (`libgomp-a34b3233.so.1`) is the same library as `libgomp.so.1`."""
    found: dict[str, set[str]] = {}
    for path in mapped_files(maps):
        match = MAPPED.fullmatch(os.path.basename(path))
        if match:
            found.setdefault(match.group(1), set()).add(os.path.realpath(path))
    return {lib: sorted(paths) for lib, paths in sorted(found.items())}


def origin(path: str, env_roots: list[str]) -> str:
    """"env" (under the stack's environment), "system" (the OS's library directories) or "outside"."""
    if any(path.startswith(root.rstrip("/") + "/") for root in env_roots):
        return "env"
    return "system" if path.startswith(SYSTEM_DIRS) else "outside"


def env_roots() -> list[str]:
    """The stack's environment, by real path: its prefix (a venv, an image's) and its site-packages."""
    import site
    import sys
    roots = {sys.prefix, sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()}
    return sorted({os.path.realpath(r) for r in roots if r})


def stack_roots(given: str) -> list[str]:
    """What counts as the stack's environment: a stack stackgate built is its venv (in an image too); a given
    image or interpreter (`STACKGATE_STACK_GIVEN`) is what the team has, its system libraries included (an
    NGC-style image's CUDA libraries are its own), so there only two copies of one library, or a shadowed
    one, fail."""
    return ["/"] if given else env_roots()


def mapped_problems(libraries: dict[str, list[str]], roots: list[str]) -> list[str]:
    """What is wrong with what was mapped: one library from two files, or one from outside the stack's
    environment (the system's C++ runtime excepted). Each names the files."""
    out = []
    for lib, paths in libraries.items():
        if len(paths) > 1:
            out.append(f"{lib} is mapped from {len(paths)} files: {', '.join(paths)}")
        for path in paths:
            where = origin(path, roots)
            if where == "outside" or (where == "system" and lib not in SYSTEM_OK):
                out.append(f"{lib} comes from {path}, outside the stack's environment ({', '.join(roots)})")
    return out


def paths(mapped: dict[str, list[dict[str, str]]]) -> dict[str, list[str]]:
    """`what_is_mapped`'s answer as `mapped_problems` takes it: library -> its files' paths."""
    return {lib: [f["path"] for f in files] for lib, files in mapped.items()}


def what_is_mapped() -> dict[str, list[dict[str, str]]]:
    """This process's mapped libraries of the stack, each file with its origin (for the report)."""
    roots = env_roots()
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return {}
    return {lib: [{"path": p, "origin": origin(p, roots)} for p in paths]
            for lib, paths in mapped_libraries(maps).items()}
