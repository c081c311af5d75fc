"""Stack identity: the installed stack is what the cell asked for (no silent CPU wheel), and the
libraries torch loaded agree with the wheels that were installed. Also captures the environment."""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
import re
import sys
from pathlib import Path

import loader
import pytest
import record
import torch


def _dist_version(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def _nvidia_wheels() -> dict[str, str]:
    out = {}
    for dist in md.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if name.startswith(("nvidia-", "triton", "cuda-")):
            out[name] = dist.version
    return out


def _nccl_version() -> str | None:
    try:
        v = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001 - a +cpu build has no NCCL
        return None
    return ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)


def _loaded_libraries(pattern: str) -> list[str]:
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return []
    return sorted({path for path in loader.mapped_files(maps) if re.search(pattern, path)})


def _cudnn_versions() -> tuple[int | None, int | None]:
    if not torch.backends.cudnn.is_available():
        return None, None
    runtime = torch.backends.cudnn.version()
    compile_time = None
    try:
        major, minor, patch = torch._C._cudnn.getCompileVersion()  # noqa: SLF001 - as PyTorch's smoke test
        compile_time = major * 10000 + minor * 100 + patch
    except Exception:  # noqa: BLE001
        compile_time = None
    return runtime, compile_time


def _forward_compat_observed() -> dict:
    """What the process really loaded: the kernel driver's version, the CUDA driver API version the
    loaded libcuda offers, and where that libcuda came from (a `compat` directory means the
    cuda-compat package is in use)."""
    driver = None
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
        match = re.search(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)", text)
        driver = match.group(1) if match else text.splitlines()[0][:120]
    except OSError:
        pass
    api = None
    if torch.cuda.is_available():
        try:
            version = torch._C._cuda_getDriverVersion()  # noqa: SLF001 - cuDriverGetVersion, e.g. 13000
            api = f"{version // 1000}.{version % 1000 // 10}"
        except Exception:  # noqa: BLE001
            api = None
    libcuda = _loaded_libraries(r"libcuda\.so")
    return {"nvidia_driver": driver, "cuda_driver_api": api, "libcuda": libcuda,
            "cuda_compat_in_use": any("compat" in path for path in libcuda)}


def test_capture_environment(expect) -> None:
    runtime, compile_time = _cudnn_versions()
    if expect.cuda.startswith("cu"):
        torch.cuda.is_available()  # loads libcuda/NCCL where present, so /proc/self/maps shows them
    record.environment({
        "torch": torch.__version__,
        "torch_git": getattr(torch.version, "git_version", ""),
        "cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "device_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if torch.cuda.is_available() else [],
        "nccl": _nccl_version(),
        "nccl_library": _loaded_libraries(r"libnccl\.so"),
        "cudnn": runtime,
        "cudnn_compile": compile_time,
        "triton": _dist_version("triton"),
        "numpy": _dist_version("numpy"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "hostname": platform.node(),
        "gloo_available": torch.distributed.is_gloo_available(),
        "nccl_available": torch.distributed.is_nccl_available(),
        "nvidia_wheels": _nvidia_wheels(),
        **_forward_compat_observed(),
        "packages": sorted(f"{d.metadata['Name']}=={d.version}" for d in md.distributions()),
        "executable": sys.executable,
    })
    sizes = loader.package_sizes()  # for the harness's size check against production (supply.py)
    record.environment({"package_sizes": sizes, "env_size": sum(sizes.values()),
                        "loader_copies": loader.loader_copies()})


def test_installed_requirements_are_consistent() -> None:
    """`pip check` of the environment, on every backend (a uv-made venv has no pip to ask)."""
    broken = loader.broken_requirements()
    if broken is None:
        pytest.skip("neither packaging nor pip is installed in this environment: nothing to read requirements with")
    record.environment({"broken_requirements": broken})
    assert not broken, "inconsistent environment: " + "; ".join(broken[:10])


def test_one_copy_of_each_cuda_library() -> None:
    """Exactly one copy of libnccl, libcudnn and libcudart that the loader can reach (none on a CPU
    build): a base image's copy shadowing the wheel's is a known cause of silent breakage."""
    copies = loader.loader_copies()
    record.environment({"loader_copies": copies})
    twice = {lib: found["competing"] for lib, found in copies.items() if len(found["competing"]) > 1}
    assert not twice, "more than one copy for torch's loading to pick from (LD_LIBRARY_PATH, the wheels): " + \
        "; ".join(f"{lib}: {', '.join(paths)}" for lib, paths in twice.items())


def test_torch_version(expect) -> None:
    if not expect.torch:
        pytest.skip("STACKGATE_EXPECT_TORCH not set")
    installed = torch.__version__.split("+")[0]
    assert installed == expect.torch, f"asked for torch {expect.torch}, found {torch.__version__}"


def test_cuda_build_matches_cell(expect) -> None:
    if not expect.cuda:
        pytest.skip("STACKGATE_EXPECT_CUDA not set")
    if expect.cuda == "cpu":
        assert torch.version.cuda is None, f"a cpu cell got a CUDA build ({torch.version.cuda})"
        return
    digits = expect.cuda[2:]
    wanted = f"{digits[:-1]}.{digits[-1]}"
    assert torch.version.cuda is not None, (
        f"silent CPU wheel: the cell asked for {expect.cuda} but torch {torch.__version__} has no CUDA")
    assert torch.version.cuda == wanted, f"asked for CUDA {wanted}, torch was built with {torch.version.cuda}"


def test_cuda_usable_on_gpu_runner(expect) -> None:
    if expect.device != "cuda":
        pytest.skip("CPU runner: CUDA paths are not exercised")
    assert torch.cuda.is_available(), "GPU runner but torch.cuda.is_available() is False (driver too old?)"
    x = torch.ones(4, device="cuda")
    assert float((x * 2).sum()) == 8.0


def test_cudnn_runtime_matches_compile_time(expect) -> None:
    runtime, compile_time = _cudnn_versions()
    if runtime is None:
        if expect.cuda.startswith("cu"):
            pytest.fail("CUDA build without cuDNN")
        pytest.skip("no cuDNN in a CPU build")
    if compile_time is None:
        pytest.skip("this torch does not expose the compile-time cuDNN version")
    assert runtime // 100 == compile_time // 100, f"cuDNN runtime {runtime} != compile-time {compile_time}"


def test_nvidia_wheels_agree_with_torch(expect) -> None:
    """pip's nvidia-nccl / nvidia-cudnn wheels must be what torch reports (no shadowing library)."""
    if not expect.cuda.startswith("cu"):
        pytest.skip("no nvidia wheels in a CPU build")
    wheels = _nvidia_wheels()
    nccl_wheel = next((v for k, v in wheels.items() if k.startswith("nvidia-nccl")), None)
    nccl = _nccl_version()
    assert nccl is not None, "CUDA build reports no NCCL"
    if nccl_wheel is not None:
        assert nccl_wheel.startswith(nccl), f"nvidia-nccl wheel {nccl_wheel} but torch reports NCCL {nccl}"
    cudnn_wheel = next((v for k, v in wheels.items() if k.startswith("nvidia-cudnn")), None)
    runtime, _ = _cudnn_versions()
    if cudnn_wheel is not None and runtime is not None:
        major, minor = runtime // 10000, (runtime % 10000) // 100
        assert cudnn_wheel.startswith(f"{major}.{minor}"), f"nvidia-cudnn wheel {cudnn_wheel} but torch loaded {runtime}"


def test_nccl_library_comes_from_the_wheel(expect) -> None:
    if expect.device != "cuda":
        pytest.skip("NCCL is loaded only when a GPU is present")
    torch.zeros(1, device="cuda")
    libs = _loaded_libraries(r"libnccl\.so")
    record.environment({"nccl_library": libs})
    assert libs, "torch did not load libnccl"
    assert len(libs) == 1, f"more than one libnccl loaded: {libs}"


def test_triton_present_for_compile(expect) -> None:
    if not expect.cuda.startswith("cu") or platform.system() != "Linux":
        pytest.skip("Triton is needed by torch.compile only on CUDA builds on Linux")
    assert _dist_version("triton") is not None, "CUDA build of torch without Triton: torch.compile on GPU will fail"


def test_each_library_is_mapped_once_from_the_stack(expect) -> None:
    """What this process really loaded (/proc/self/maps), after import, a matmul and a convolution (and on
    a GPU runner after CUDA's first use): one file per library, each from the stack's environment (the
    system's libstdc++ excepted). A base image's or the host's copy shadowing the wheel's (LD_LIBRARY_PATH,
    a preload) is the failure after an upgrade that no test of torch's own shows."""
    device = "cuda" if expect.device == "cuda" and torch.cuda.is_available() else "cpu"
    x = torch.randn(64, 64, device=device)
    (x @ x).sum().item()
    torch.nn.functional.conv2d(torch.randn(1, 3, 16, 16, device=device), torch.randn(4, 3, 3, 3, device=device)).sum().item()
    mapped = loader.what_is_mapped()
    record.environment({"mapped_libraries": mapped})
    roots = loader.stack_roots(expect.given)
    problems = loader.mapped_problems(loader.paths(mapped), roots)
    assert mapped, "no library of the stack is mapped: /proc/self/maps could not be read"
    assert not problems, "; ".join(problems)


_LANE = """
import ctypes, json, sys
sys.path.insert(0, sys.argv[1])
import loader, torch
x = torch.randn(64, 64)
(x @ x).sum().item()
roots = json.loads(sys.argv[2])
mapped = loader.mapped_libraries(open("/proc/self/maps").read())
alone = loader.mapped_problems(mapped, roots)
for extra in sys.argv[3:]:
    ctypes.CDLL(extra)  # a second copy, mapped beside the stack's own
beside = loader.mapped_problems(loader.mapped_libraries(open("/proc/self/maps").read()), roots)
print(json.dumps({"alone": alone, "beside": beside, "mapped": mapped}))
"""


def _lane(env: dict, roots: list[str], *extra: str) -> dict:
    import json
    import subprocess
    done = subprocess.run([sys.executable, "-c", _LANE, str(Path(__file__).parent), json.dumps(roots), *extra],
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, f"torch does not import with {sorted(set(env) ^ set(os.environ))} changed: " + done.stderr[-1500:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_runpath_alone_resolves_and_a_planted_copy_is_caught(expect, tmp_path) -> None:
    """#43 item 2, two more lanes of the check above, in every stack. With LD_LIBRARY_PATH and LD_PRELOAD
    unset, torch's RUNPATH alone must resolve what it loads (PyTorch's own rule, check_binary.sh). And a
    check that cannot fail is a defect: the wheel's OpenMP runtime copied elsewhere and loaded beside
    it must be named as a second copy, and (a stack stackgate built) put first on LD_LIBRARY_PATH, as a
    base image's copy would be, must be named as coming from outside the stack where the loader takes it
    (torch 2.13.0+cpu's RUNPATH yields to LD_LIBRARY_PATH; 2.14.1+cu130 has an RPATH, which LD_LIBRARY_PATH does not override)."""
    import shutil
    mapped = loader.what_is_mapped()
    own = [f["path"] for f in mapped.get("libgomp", [])]
    if len(own) != 1:
        pytest.skip(f"this torch maps {len(own)} OpenMP runtime(s) (libgomp): nothing to plant a copy of")
    planted = tmp_path / "planted"
    planted.mkdir()
    copy = planted / Path(own[0]).name
    shutil.copy2(own[0], copy)
    roots = loader.stack_roots(expect.given)
    bare = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "LD_PRELOAD")}
    lane = _lane(bare, roots, str(copy))
    record.environment({"runpath_alone": lane["alone"]})
    assert not lane["alone"], "with LD_LIBRARY_PATH unset: " + "; ".join(lane["alone"])
    # what this process maps against what torch's RUNPATH alone resolves: a library that differs is shadowed
    # by LD_LIBRARY_PATH or LD_PRELOAD (a given image's too, whose system libraries are otherwise its own)
    here = loader.paths(mapped)
    shadowed = [f"{lib}: {', '.join(here[lib])} is mapped here (LD_LIBRARY_PATH={os.environ.get('LD_LIBRARY_PATH', '')!r}, "
                f"LD_PRELOAD={os.environ.get('LD_PRELOAD', '')!r}), where torch's RUNPATH alone maps {', '.join(paths)}"
                for lib, paths in lane["mapped"].items() if lib in here and sorted(here[lib]) != sorted(paths)]
    assert not shadowed, "; ".join(shadowed)
    assert any(str(copy) in p and "mapped from 2 files" in p for p in lane["beside"]), (
        f"a second libgomp ({copy}) loaded beside the stack's was not caught: {lane['beside']}")
    if not expect.given:
        first = {**os.environ, "LD_LIBRARY_PATH": os.pathsep.join(filter(None, (str(planted), os.environ.get("LD_LIBRARY_PATH"))))}
        lane = _lane(first, roots)
        shadowed = any(str(copy) in paths for paths in lane["mapped"].values())
        record.environment({"ld_library_path_shadows_libgomp": shadowed})  # False: RPATH or a dlopen by path wins
        if shadowed:
            assert any(str(copy) in p and "outside the stack's environment" in p for p in lane["alone"]), (
                f"a libgomp put first on LD_LIBRARY_PATH ({copy}) was loaded and not caught: {lane['alone']}")
