"""Host-probe decisions on nvidia-smi -q -x / dmesg data (tests/data/probe) and through the NVML
bindings' API (a stand-in module with pynvml's names): every state the issue lists."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from stackgate import probe
from stackgate.model import GpuClass, RunnerPool, Transport
from stackgate.versions import parse_driver

DATA = Path(__file__).resolve().parents[1] / "data" / "probe"
H100 = RunnerPool("p5-h100", parse_driver("580.65.06"), GpuClass.DATACENTER, gpu="H100", gpus_per_node=8,
                  transport=Transport.EFA, nodes=2)
A100 = RunnerPool("p4d-a100", parse_driver("570.172.08"), GpuClass.DATACENTER, gpu="A100", gpus_per_node=8,
                  transport=Transport.EFA, nodes=2)


def _facts(xml: str, dmesg: str = "dmesg-clean.txt") -> probe.HostFacts:
    facts = probe.facts_from_smi_xml((DATA / xml).read_text())
    return replace(facts, xid=probe.xid_events((DATA / dmesg).read_text()), kernel_log="dmesg")


def test_a_healthy_host_that_matches_its_pool() -> None:
    result = probe.check(H100, _facts("h100-healthy.xml"), needs_cuda=("13.0",))
    assert result.status == "ok" and result.ok
    assert "driver 580.65.06 (CUDA 13.0), 8 x NVIDIA H100 80GB HBM3" in result.evidence[0]


def test_an_a100_with_a_pending_row_remap_is_unhealthy() -> None:
    result = probe.check(A100, _facts("a100-row-remap-pending.xml"), needs_cuda=("12.6",))
    assert result.status == "host-unhealthy" and not result.ok
    assert result.evidence == ("GPU 3 (NVIDIA A100-SXM4-80GB GPU-8f3e1a44-7c2b-4a1e-b0d1-000000000003) has a row "
                               "remap pending (a reset is needed)",)


def test_an_h100_with_xid_79_in_the_kernel_log_is_unhealthy() -> None:
    result = probe.check(H100, _facts("h100-healthy.xml", "dmesg-xid79.txt"), needs_cuda=("13.0",))
    assert result.status == "host-unhealthy"
    assert len(result.evidence) == 1 and "Xid (PCI:0000:3a:00): 79" in result.evidence[0]
    assert "GPU has fallen off the bus" in result.evidence[0] and "SXid" not in result.evidence[0]


def test_a_driver_that_differs_from_the_declaration_is_a_mismatch() -> None:
    result = probe.check(A100, _facts("h100-healthy.xml"))
    assert result.status == "host-mismatch"
    assert "driver 580.65.06, but pool p4d-a100 declares 570.172.08" in result.evidence
    assert any("GPU model NVIDIA H100 80GB HBM3, but pool p4d-a100 declares A100" in e for e in result.evidence)


def test_gpu_count_and_cuda_support_mismatches() -> None:
    small = replace(H100, gpus_per_node=4)
    assert "8 GPU(s), but pool p5-h100 declares 4 per node" in probe.check(small, _facts("h100-healthy.xml")).evidence
    old = probe.check(A100, _facts("a100-row-remap-pending.xml"), needs_cuda=("13.0",))
    assert old.status == "host-mismatch" and "the driver supports CUDA 12.8; cells need CUDA 13.0" in old.evidence


def test_uncorrectable_ecc_in_the_older_layout_and_a_gpu_in_an_error_state() -> None:
    pool = replace(A100, driver=parse_driver("550.54.14"))
    ecc = probe.check(pool, _facts("a100-ecc-uncorrectable-old-layout.xml"))
    assert ecc.status == "host-unhealthy" and "has 2 uncorrectable ECC error(s)" in ecc.evidence[0]
    err = probe.check(H100, _facts("h100-gpu-in-error-state.xml"))
    assert err.status == "host-unhealthy" and "GPU 7" in err.evidence[0] and "error state" in err.evidence[0]


def test_no_driver_answering_is_a_mismatch_and_cpu_pools_need_no_probe() -> None:
    none = probe.HostFacts("none", errors=("nvml: NVML Shared Library Not Found",))
    assert probe.check(H100, none).status == "host-mismatch"
    cpu = RunnerPool("cpu-a", None, GpuClass.NONE)
    assert probe.check(cpu, none).status == "no-gpu" and probe.check(cpu, none).ok


class _NVMLError(Exception):
    pass


def _fake_nvml(remap_pending: int = 0, unc: int = 0) -> Any:
    """pynvml's API surface, as NVML answers on a healthy (or not) 2 x H100 host."""
    devices = ["h0", "h1"]
    return SimpleNamespace(
        NVMLError=_NVMLError, NVML_MEMORY_ERROR_TYPE_UNCORRECTED=1, NVML_VOLATILE_ECC=0,
        nvmlInit=lambda: None, nvmlShutdown=lambda: None,
        nvmlSystemGetDriverVersion=lambda: b"580.65.06", nvmlSystemGetCudaDriverVersion_v2=lambda: 13000,
        nvmlDeviceGetCount=lambda: len(devices), nvmlDeviceGetHandleByIndex=lambda i: devices[i],
        nvmlDeviceGetName=lambda h: "NVIDIA H100 80GB HBM3", nvmlDeviceGetUUID=lambda h: f"GPU-{h}",
        nvmlDeviceGetTotalEccErrors=lambda h, kind, counter: unc if h == "h1" else 0,
        nvmlDeviceGetRemappedRows=lambda h: (0, 0, remap_pending if h == "h0" else 0, 0),
        nvmlDeviceGetRetiredPagesPendingStatus=lambda h: (_ for _ in ()).throw(_NVMLError("Not Supported")),
    )


@pytest.mark.parametrize(("remap", "unc", "status"), [(0, 0, "ok"), (1, 0, "host-unhealthy"),
                                                      (0, 3, "host-unhealthy")])
def test_decisions_through_the_nvml_bindings(remap: int, unc: int, status: str) -> None:
    facts = probe.facts_from_nvml(_fake_nvml(remap, unc))
    assert facts.source == "nvml" and facts.driver == "580.65.06" and facts.cuda_driver == "13.0"
    pool = replace(H100, gpus_per_node=2)
    assert probe.check(pool, facts, needs_cuda=("13.0",)).status == status


def test_a_probe_result_is_recorded_in_run_json_and_read_back(tmp_path: Path) -> None:
    """The host probe's facts (tuples of GPUs, Xid lines, errors) went into run.json as tuples, which the
    manifest's model refuses: `run --pool` on a host that failed its probe crashed writing run.json."""
    from stackgate.rundir import manifest
    facts = probe.HostFacts("nvml", driver="580.65.06", gpus=(probe.Gpu(0, "H100", ecc_uncorrectable=2),),
                            xid=("NVRM: Xid 79",), errors=("nvml: slow",))
    found = probe.ProbeResult("p5", "host-unhealthy", ("GPU 0 fell off the bus",), facts)
    manifest.write(tmp_path, defined={"matrix": "m"}, selected={"pools": "p5"}, cells=["c"],
                   host_probe={found.pool: found.to_json()})
    row = manifest.read(tmp_path).host_probe["p5"]
    assert (row.status, row.evidence, row.facts["xid"]) == ("host-unhealthy", ["GPU 0 fell off the bus"], ["NVRM: Xid 79"])
    assert row.facts["gpus"] == [{**vars(facts.gpus[0])}]
