"""TEST WHEELS, not PyTorch nightlies: the local torch 2.13.0+cpu wheel repacked as a handful of
`torch-2.15.0.devYYYYMMDD+<variant>` wheels, for the nightly channel's tests (issue 13). No
nightly wheel can be reached from this machine, so these stand in for them.

What changes per date: the version (in the wheel's file name, its dist-info directory and
METADATA, and `torch/version.py`'s `__version__`) and `torch.version.git_version` (a distinct,
made-up commit per date, so a bisect can report a commit range). The compiled code is 2.13.0's.
The repack copies the original archive and rewrites only its central directory and the few
changed members: no member is recompressed, so a 190 MB wheel takes about a second.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import shutil
import zipfile
from pathlib import Path

SOURCE = Path("/opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl")
TAG = "cp311-cp311-manylinux_2_28_x86_64"


def git_version(date: str) -> str:
    """The made-up commit a fixture nightly was 'cut from'."""
    return hashlib.sha1(f"stackgate test nightly {date}".encode()).hexdigest()


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def repack(source: Path, dest_dir: Path, version: str, commit: str) -> Path:
    """`source` (a torch wheel) as torch `version`, into `dest_dir`."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(source) as zin:
        old = next(n.split("/")[0] for n in zin.namelist() if n.split("/")[0].endswith(".dist-info"))
        old_version = old[len("torch-"):-len(".dist-info")]
        version_py = zin.read("torch/version.py").decode()
        dist_info = {n: zin.read(n) for n in zin.namelist() if n.startswith(old + "/")}
    new = f"torch-{version}.dist-info"
    out = dest_dir / f"torch-{version}-{TAG}.whl"
    partial = out.with_suffix(".partial")
    shutil.copyfile(source, partial)
    version_py = version_py.replace(f"__version__ = '{old_version}'", f"__version__ = '{version}'")
    lines = [ln if not ln.startswith("git_version = ") else f"git_version = '{commit}'" for ln in version_py.splitlines()]
    changed = {"torch/version.py": ("\n".join(lines) + "\n").encode()}
    for name, data in dist_info.items():
        rel = name[len(old) + 1:]
        if rel != "RECORD":
            changed[f"{new}/{rel}"] = data if rel != "METADATA" else data.decode().replace(
                f"\nVersion: {old_version}\n", f"\nVersion: {version}\n").encode()
    record = []
    for line in dist_info[f"{old}/RECORD"].decode().splitlines():
        path = line.rsplit(",", 2)[0]
        path = f"{new}/{path[len(old) + 1:]}" if path.startswith(old + "/") else path
        if path in changed:
            record.append(f"{path},{_record_hash(changed[path])},{len(changed[path])}")
        elif not path.endswith("/RECORD"):
            record.append(line)
    record.append(f"{new}/RECORD,,")
    changed[f"{new}/RECORD"] = ("\n".join(record) + "\n").encode()
    with zipfile.ZipFile(partial, "a") as zout:
        gone = [i for i in zout.filelist if i.filename == "torch/version.py" or i.filename.startswith(old + "/")]
        for info in gone:  # dropped from the central directory; their bytes stay behind, unreferenced
            zout.filelist.remove(info)
            del zout.NameToInfo[info.filename]
        for name, data in changed.items():
            zout.writestr(zipfile.ZipInfo(name, date_time=(2026, 11, 1, 0, 0, 0)), data, zipfile.ZIP_DEFLATED)
    partial.rename(out)
    return out


def build_nightlies(dest_dir: Path, dates: list[str], variant: str = "cpu", source: Path = SOURCE) -> dict[str, Path]:
    """One test wheel per date (YYYYMMDD), reused when present. By date."""
    out = {}
    for date in dates:
        dt.datetime.strptime(date, "%Y%m%d")  # a real calendar date
        version = f"2.15.0.dev{date}+{variant}"
        found = dest_dir / f"torch-{version}-{TAG}.whl"
        out[date] = found if found.exists() else repack(source, dest_dir, version, git_version(date))
    return out


def companion(dest_dir: Path, name: str, version: str, torch_version: str) -> Path:
    """A TEST companion wheel (torchvision-like): pure Python, pinned to one torch nightly."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"__version__ = '{version}'\n".encode(),
        f"{dist}/METADATA": (f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                             f"Requires-Dist: torch=={torch_version}\n").encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: stackgate-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [f"{path},{_record_hash(data)},{len(data)}" for path, data in files.items()] + [f"{dist}/RECORD,,"]
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    out = dest_dir / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files.items():
            z.writestr(path, data)
    return out
