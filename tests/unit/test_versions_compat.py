from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from stackgate import compat, fleet
from stackgate.errors import ConfigError
from stackgate.model import GpuClass
from stackgate.versions import CudaVariant, nightly_date, parse_driver, parse_python, parse_torch

ROOT = Path(__file__).resolve().parents[2]
TABLE = compat.load_compat(ROOT / "matrix" / "compat.toml")


def test_torch_versions_are_parsed_not_string_compared() -> None:
    assert parse_torch("2.10.0") > parse_torch("2.9.1")  # "2.10" < "2.9" as strings
    assert parse_torch("2.13.0+cpu").local == "cpu"
    assert parse_torch("2.15.0.dev20261120") < parse_torch("2.15.0")
    assert parse_torch("2.14.0rc2").is_prerelease
    assert str(nightly_date(parse_torch("2.15.0.dev20261120"))) == "2026-11-20"
    assert nightly_date(parse_torch("2.14.1")) is None


@pytest.mark.parametrize("bad", ["two.fourteen", "2", "", "latest"])
def test_bad_torch_version_is_a_config_error(bad: str) -> None:
    with pytest.raises(ConfigError):
        parse_torch(bad)


def test_cuda_variants() -> None:
    assert CudaVariant.parse("13.0") == CudaVariant("cu130")
    assert str(CudaVariant.parse("cu126").cuda_version) == "12.6"
    assert CudaVariant.parse("cpu").cuda_version is None
    assert CudaVariant("cpu") < CudaVariant("cu126") < CudaVariant("cu130")
    with pytest.raises(ConfigError):
        CudaVariant.parse("cuda13")


def test_driver_keeps_its_spelling_and_orders_numerically() -> None:
    assert str(parse_driver("580.65.06")) == "580.65.06"
    assert parse_driver("580.65.06") > parse_driver("580")
    assert parse_driver("525.60.13") < parse_driver("550.54.14")
    with pytest.raises(ConfigError):
        parse_driver("r580")
    assert parse_python("3.14t") == "3.14t"


def _check(**kw: object) -> compat.Compatibility:
    args = {"torch": parse_torch("2.14.1"), "cuda": CudaVariant("cu130"), "python": "3.11",
            "driver": parse_driver("580.65.06"), "gpu_class": GpuClass.DATACENTER}
    args.update(kw)
    return compat.check(TABLE, **args)  # type: ignore[arg-type]


def test_cuda13_needs_driver_580() -> None:
    bad = _check(driver=parse_driver("550.54.14"))
    assert not bad.ok
    assert any("CUDA 13.0 needs driver >= 580; driver is 550.54.14" in o.detail for o in bad.failures)
    assert _check().ok


def test_cuda12_minor_version_compat_floor_and_118() -> None:
    assert _check(cuda=CudaVariant("cu126"), driver=parse_driver("525.60.13")).ok
    assert not _check(cuda=CudaVariant("cu126"), driver=parse_driver("520.61.05")).ok
    torch211 = parse_torch("2.11.0")
    assert "11.8" in TABLE.drivers and str(TABLE.drivers["11.8"].min_driver) == "520.61.05"
    assert not compat.check(TABLE, torch=torch211, cuda=CudaVariant("cu126"), driver=parse_driver("520.61.05")).ok


def test_forward_compat_only_datacenter_with_compat_package() -> None:
    old = parse_driver("535.274.02")  # R535: a Long Term Support Branch
    assert _check(driver=old, has_compat_package=True).ok
    assert _check(driver=old, has_compat_package=True).uses_forward_compat
    consumer = _check(driver=old, has_compat_package=True, gpu_class=GpuClass.CONSUMER)
    assert not consumer.ok
    assert any("only for datacenter" in o.detail for o in consumer.failures)
    assert not _check(driver=old, has_compat_package=False).ok


def test_forward_compat_only_on_ltsb_and_production_branches() -> None:
    unlisted = _check(driver=parse_driver("550.54.14"), has_compat_package=True)
    assert not unlisted.ok and any("R550 is not a driver branch listed" in o.detail for o in unlisted.failures)
    nfb_table = replace(TABLE, forward_compat_branches={**TABLE.forward_compat_branches, "575": "nfb"})
    nfb = compat.check(nfb_table, torch=parse_torch("2.14.1"), cuda=CudaVariant("cu130"), python="3.11",
                       driver=parse_driver("575.51.03"), gpu_class=GpuClass.DATACENTER, has_compat_package=True)
    assert not nfb.ok and any("New Feature Branch" in o.detail for o in nfb.failures)
    assert TABLE.forward_compat_branches["580"] == "ltsb" and TABLE.forward_compat_branches["610"] == "nfb"


@pytest.mark.parametrize("gpu", ["NVIDIA GH200 480GB", "NVIDIA B200", "NVIDIA B300", "NVIDIA GB200", "NVIDIA H200"])
def test_new_datacenter_gpus_are_datacenter_class(gpu: str) -> None:
    assert fleet.LocalHost(driver=parse_driver("580.65.06"), gpu=gpu, gpu_count=1).gpu_class is GpuClass.DATACENTER


def test_torch_ships_only_some_variants_and_pythons() -> None:
    r = _check(cuda=CudaVariant("cu134"))
    assert not r.ok and r.failures[0].rule == "torch-ships-variant"
    assert not _check(python="3.9").ok
    unknown = _check(torch=parse_torch("3.0.0"))
    assert not unknown.ok and unknown.failures[0].rule == "torch-release-known"


def test_cpu_build_and_cpu_runner_need_no_driver() -> None:
    assert _check(cuda=CudaVariant("cpu"), torch=parse_torch("2.13.0+cpu"), driver=None).ok
    assert _check(driver=None).ok  # a CUDA build in CPU mode
    mismatch = _check(cuda=CudaVariant("cu130"), torch=parse_torch("2.13.0+cpu"))
    assert not mismatch.ok and mismatch.failures[0].rule == "local-label-matches"


def test_environment_requirements_follow_pypi_default_variant() -> None:
    from stackgate.model import Stack
    from stackgate.plan import requirements
    cpu = Stack(parse_torch("2.13.0"), CudaVariant("cpu"), "3.11")
    default = Stack(parse_torch("2.14.1"), CudaVariant("cu130"), "3.11", extra_requirements=("torchvision==0.29.1",))
    assert requirements(TABLE, cpu) == ["torch==2.13.0+cpu", "numpy", "pytest"]
    assert requirements(TABLE, default) == ["torch==2.14.1", "torchvision==0.29.1", "numpy", "pytest"]
    assert requirements(TABLE, Stack(parse_torch("2.14.1"), CudaVariant("cu126"), "3.11"), ())[0] == "torch==2.14.1+cu126"


# ---- #18 item 3c: the stack's identity comes from what was resolved, checked before anything is built

def test_a_stale_pypi_default_is_found_from_the_resolved_pins_naming_the_row(tmp_path: Path) -> None:
    from stackgate import resolve
    from stackgate.model import Stack
    from stackgate.versions import CudaVariant
    text = (ROOT / "matrix" / "compat.toml").read_text()
    stale = tmp_path / "compat.toml"
    stale.write_text(text.replace('pypi_default = "cu132"', 'pypi_default = "cu130"'))
    table = compat.load_compat(stale)
    pins = ("torch==2.15.0", "nvidia-cuda-runtime==13.2.86", "nvidia-nccl-cu13==2.31.1", "numpy==2.4.6")
    wrong = resolve.identity_problem(Stack(parse_torch("2.15.0"), CudaVariant("cu130"), "3.11"), pins, table)
    assert wrong is not None
    row = next(i for i, line in enumerate(stale.read_text().splitlines(), 1)
               if line.startswith("pypi_default") and i > stale.read_text().splitlines().index('[torch."2.15"]'))
    assert wrong.line == row and f"{stale}:{row}:" in str(wrong)
    assert "a CUDA 13.2 build (it resolves with nvidia-cuda-runtime==13.2.86)" in str(wrong)
    assert wrong.hint is not None and 'set pypi_default = "cu132"' in wrong.hint
    fixed = compat.load_compat(ROOT / "matrix" / "compat.toml")
    assert resolve.identity_problem(Stack(parse_torch("2.15.0"), CudaVariant("cu132"), "3.11"), pins, fixed) is None
    # a CPU stack that resolves to CUDA wheels is not what the cell asked for either
    cpu = resolve.identity_problem(Stack(parse_torch("2.14.1"), CudaVariant("cpu"), "3.11"),
                                   ("torch==2.14.1", "nvidia-cuda-runtime==13.0.96"), fixed)
    assert cpu is not None and "not cpu" in str(cpu)
    assert resolve.identity_problem(Stack(parse_torch("2.13.0"), CudaVariant("cpu"), "3.11"),
                                    ("torch==2.13.0+cpu", "numpy==2.4.6"), fixed) is None
    assert resolve.cuda_of(("nvidia-cuda-runtime-cu12==12.6.77",)) == "12.6"


def test_cpu_pools_take_each_releases_pypi_default_build() -> None:
    from tests.unit.test_matrix import _expand
    ids = {c.id for c in _expand("upgrade.toml", fleet.LocalHost(), candidate="2.15.0").cells}
    assert "local-cpu-cu132-torch2.15.0-py3.11-1x2" in ids
    ids = {c.id for c in _expand("upgrade.toml", fleet.LocalHost(), candidate="2.14.1").cells}
    assert "local-cpu-cu130-torch2.14.1-py3.11-1x2" in ids


def _index(root: Path, wheels: dict[str, str]) -> str:
    """A PEP 503 index with torch wheels (empty files) and their PEP 658 .metadata."""
    page = root / "torch"
    page.mkdir(parents=True)
    anchors = []
    for name, metadata in wheels.items():
        (page / name).write_bytes(b"")
        (page / f"{name}.metadata").write_text(metadata)
        anchors.append(f'<a href="{name}">{name}</a>')
    (page / "index.html").write_text("<html><body>" + "\n".join(anchors) + "</body></html>")
    return root.as_uri()


def test_compat_refresh_derives_variants_pythons_and_the_pypi_default_from_an_index(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from stackgate.cli import main
    base = "Metadata-Version: 2.1\nName: torch\nRequires-Dist: filelock\n"
    url = _index(tmp_path / "index", {
        "torch-2.15.0-cp311-cp311-manylinux_2_28_x86_64.whl":
            base + 'Requires-Dist: nvidia-cuda-runtime==13.2.86; platform_system == "Linux"\n',
        "torch-2.15.0+cu130-cp311-cp311-manylinux_2_28_x86_64.whl": base,
        "torch-2.15.0+cpu-cp314-cp314t-manylinux_2_28_x86_64.whl": base,
        "torch-2.15.0-cp312-none-macosx_11_0_arm64.whl": base,  # a Python, never the default's CUDA
        "torch-2.16.0.dev20261201+cpu-cp311-cp311-manylinux_2_28_x86_64.whl": base,  # not a release
    })
    stale = tmp_path / "compat.toml"
    stale.write_text((ROOT / "matrix" / "compat.toml").read_text().replace('pypi_default = "cu132"',
                                                                           'pypi_default = "cu130"'))
    assert main(["compat", "refresh", "--index", url, "--compat-file", str(stale)]) == 1
    out = capsys.readouterr().out
    assert '[torch."2.15"] pypi_default = "cu130", the index serves "cu132" by default' in out
    assert 'cuda = ["cpu", "cu130", "cu132"]' in out and 'python = ["3.11", "3.12", "3.14t"]' in out
    assert "2.16" not in out
    assert main(["compat", "refresh", "--index", url, "--compat-file", str(stale), "--write"]) == 0
    fixed = compat.load_compat(stale)
    row = fixed.torch["2.15"]
    assert row.pypi_default == CudaVariant("cu132") and [v.tag for v in row.cuda] == ["cpu", "cu130", "cu132"]
    assert row.python == ("3.11", "3.12", "3.14t")
    assert fixed.torch["2.14"] == TABLE.torch["2.14"]  # the other rows, and the comments, are kept
    assert "min_driver" in stale.read_text() and stale.read_text().count("#") == (
        ROOT / "matrix" / "compat.toml").read_text().count("#") - 1  # (the 2.15 row's own comment was rewritten)
    capsys.readouterr()
    assert main(["compat", "refresh", "--index", url, "--compat-file", str(stale)]) == 0
    assert "agrees with the index(es)" in capsys.readouterr().out
