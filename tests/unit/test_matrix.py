from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from stackgate import compat, fleet, matrix
from stackgate.cli import render_matrix_json
from stackgate.errors import ConfigError
from stackgate.versions import parse_driver, parse_torch

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden"
CPU = fleet.LocalHost()
GPU = fleet.LocalHost(driver=parse_driver("580.65.06"), gpu="NVIDIA H200", gpu_count=1)


def _expand(name: str, local: fleet.LocalHost, candidate: str = "2.14.1") -> matrix.Expansion:
    table = compat.load_compat(ROOT / "matrix" / "compat.toml")
    spec = matrix.load_matrix(ROOT / "matrix" / name)
    prod = matrix.load_production(ROOT / "matrix" / "production.toml")
    pools = fleet.load_pools(ROOT / "matrix" / "fleet.toml", local)
    return matrix.expand(spec, pools, prod, table, torch_versions=[parse_torch(candidate)])


@pytest.mark.parametrize(("name", "local", "golden"), [
    ("upgrade.toml", CPU, "upgrade-cpu-host.json"),
    ("upgrade.toml", GPU, "upgrade-h200-host.json"),
])
def test_expansion_matches_golden_file(name: str, local: fleet.LocalHost, golden: str) -> None:
    """Regenerate with STACKGATE_UPDATE_GOLDEN=1 after an intended change, and review the diff."""
    got = render_matrix_json(_expand(name, local))
    path = GOLDEN / golden
    if os.environ.get("STACKGATE_UPDATE_GOLDEN"):
        path.write_text(json.dumps(got, indent=2) + "\n")
    assert got == json.loads(path.read_text())


def test_cpu_host_runs_cpu_cells_and_reports_gpu_pools_not_here() -> None:
    exp = _expand("upgrade.toml", CPU)
    ids = [c.id for c in exp.cells]
    assert ids == ["prod-local-cpu-cpu-torch2.13.0-py3.11-1x2", "local-cpu-cu130-torch2.14.1-py3.11-1x2"]
    assert all(c.device == "cpu" for c in exp.cells)
    assert {n.cell.pool.name for n in exp.not_here} == {"p5-h100", "p4d-a100", "g5-a10g"}
    assert all("is not this machine" in n.reason for n in exp.not_here)
    pruned = {p.cell.id: p.reasons for p in exp.pruned}
    assert any("CUDA 13.0 needs driver >= 580; driver is 550.54.14" in r
               for r in pruned["g5-a10g-drv550-cu130-torch2.14.1-py3.11-1x1"])


def test_gpu_host_gets_gpu_topology_and_required_production() -> None:
    exp = _expand("upgrade.toml", GPU)
    local = [c for c in exp.cells if c.pool.name == "local"]
    assert {str(c.topology) for c in local} == {"1x1"}
    assert all(c.device == "cuda" and c.required for c in local)
    assert {c.stack.cuda.tag for c in local if c.role.value == "candidate"} == {"cu126", "cu130"}


def test_selection_keeps_production_partner_and_shards_by_pair() -> None:
    exp = _expand("upgrade.toml", CPU)
    chosen = matrix.select(exp, ["local-cpu-cu130-*"])
    assert [c.role.value for c in chosen.cells] == ["production", "candidate"]
    assert matrix.select(exp, ["nothing-*"]).cells == ()
    shard0, shard1 = matrix.select(exp, (), (0, 2)), matrix.select(exp, (), (1, 2))
    assert len(shard0.cells) + len(shard1.cells) == len(exp.cells)


def test_unknown_pool_is_a_config_error(tmp_path: Path) -> None:
    bad = tmp_path / "m.toml"
    bad.write_text("[matrix]\npools = ['local', 'p9-b300']\ntorch=['2.14.1']\ncuda=['cu130']\npython=['3.11']\n")
    table = compat.load_compat(ROOT / "matrix" / "compat.toml")
    with pytest.raises(ConfigError, match="unknown runner pool 'p9-b300'") as info:
        matrix.expand(matrix.load_matrix(bad), fleet.load_pools(ROOT / "matrix" / "fleet.toml", CPU),
                      matrix.load_production(ROOT / "matrix" / "production.toml"), table,
                      torch_versions=[parse_torch("2.14.1")])
    assert info.value.line == 2


def test_nvidia_smi_parsing() -> None:
    host = fleet.parse_nvidia_smi("580.65.06, NVIDIA H200\n580.65.06, NVIDIA H200\n")
    assert host.gpu_count == 2 and str(host.driver) == "580.65.06"
    assert host.gpu_class.value == "datacenter"
    assert fleet.parse_nvidia_smi("575.51.03, NVIDIA GeForce RTX 4090\n").gpu_class.value == "consumer"
    assert fleet.parse_nvidia_smi("").driver is None
    assert fleet.parse_nvidia_smi("ERR!, NVIDIA H100\n").driver is None


def _expand_file(path: Path, local: fleet.LocalHost = CPU) -> matrix.Expansion:
    table = compat.load_compat(ROOT / "matrix" / "compat.toml")
    prod = matrix.load_production(ROOT / "matrix" / "production.toml")
    pools = fleet.load_pools(ROOT / "matrix" / "fleet.toml", local)
    return matrix.expand(matrix.load_matrix(path), pools, prod, table, torch_versions=[parse_torch("2.14.1")])


def test_a_required_glob_that_matches_no_cell_is_an_error_with_did_you_mean(tmp_path: Path) -> None:
    """#18 item 1: `required = ["lcoal-*"]` (a typo) made nothing required, and a failing candidate GO."""
    text = (ROOT / "matrix" / "upgrade.toml").read_text().replace('required = ["local-*"]', 'required = ["lcoal-*"]')
    assert "lcoal-*" in text
    path = tmp_path / "upgrade.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        _expand_file(path)
    assert "required = 'lcoal-*' matches no cell of the matrix" in str(info.value)
    assert info.value.line == next(i for i, line in enumerate(text.splitlines(), 1) if "lcoal-*" in line)
    assert info.value.hint is not None and "did you mean 'local-*'" in info.value.hint


def test_a_required_glob_of_the_policy_that_matches_no_cell_is_an_error(tmp_path: Path) -> None:
    expansion = _expand("upgrade.toml", CPU)
    policy_file = tmp_path / "policy.toml"
    with pytest.raises(ConfigError) as info:
        matrix.require(expansion, ["b300-*"], where=(policy_file, 3))
    assert f"{policy_file}:3:" in str(info.value) and "matches no cell" in str(info.value)
    # a glob that names a cell for another pool (not run here) is fine: it matches the expanded matrix
    away = _expand("upgrade.toml", CPU).not_here
    if away:
        matrix.require(expansion, [away[0].cell.id])
    assert matrix.require(expansion, ["local-*"]).cells
