"""#19 item 11: the suite's environment is an allow-list; secret values are masked in what is written."""

from __future__ import annotations

from pathlib import Path

from stackgate import masking, options
from stackgate.model import CellResult, Role, Status, TestOutcome

HOST = {"PATH": "/usr/bin", "HOME": "/root", "LC_ALL": "C.UTF-8", "NCCL_SOCKET_IFNAME": "eth0",
        "AWS_SECRET_ACCESS_KEY": "aws-canary-5678", "GITHUB_TOKEN": "ghp-canary-9012", "EDITOR": "vim",
        "NCCL_API_KEY": "nccl-secret-0000", "CUDA_VISIBLE_DEVICES": "0,1"}


def test_a_node_starts_from_an_allow_list_of_the_host_environment() -> None:
    base = masking.node_base(HOST)
    assert base == {"PATH": "/usr/bin", "HOME": "/root", "LC_ALL": "C.UTF-8", "NCCL_SOCKET_IFNAME": "eth0",
                    "CUDA_VISIBLE_DEVICES": "0,1"}  # never a secret-looking name, even with a stack prefix
    assert masking.node_base(HOST, ["EDITOR"])["EDITOR"] == "vim"


def test_secret_values_are_masked_in_results_and_files(tmp_path: Path) -> None:
    mask = masking.Masker.of(HOST, [("HF_TOKEN", "hf-passed-1234"), ("NCCL_NET", "Socket")])
    assert set(mask.values) == {"aws-canary-5678", "ghp-canary-9012", "nccl-secret-0000", "hf-passed-1234"}
    result = CellResult("c", Role.CANDIDATE, Status.FAILED, reason="failed: ghp-canary-9012",
                        tests=(TestOutcome("t::x", "failed", message="{'HF_TOKEN': 'hf-passed-1234'}"),),
                        environment={"env": {"GITHUB_TOKEN": "ghp-canary-9012"}}, log_tail="aws-canary-5678\n")
    masked = mask.result(result).to_json()
    assert "canary" not in str(masked) and "hf-passed" not in str(masked)
    assert masked["tests"][0]["message"] == "{'HF_TOKEN': '***'}" and masked["reason"] == "failed: ***"
    (tmp_path / "junit.xml").write_text("<failure>aws-canary-5678</failure>")
    (tmp_path / "node0.log").write_text("nothing secret")
    assert mask.scrub(tmp_path) == 1
    assert (tmp_path / "junit.xml").read_text() == "<failure>***</failure>"


def test_report_options_mask_secret_looking_suite_env() -> None:
    opts = options.read({"suite_env": ["HF_TOKEN=hf-1234", "NCCL_NET=Socket"]}, {})
    assert opts.describe()["suite_env"]["value"] == ["HF_TOKEN=***", "NCCL_NET=Socket"]


def test_short_or_structural_values_never_mangle_a_report() -> None:
    """nox sets NOX_CURRENT_SESSION=tests: masking it turned "testsuites" into "***uites" and dropped
    every result's "tests" key (CI caught it)."""
    mask = masking.Masker.of({"NOX_CURRENT_SESSION": "tests", "MY_TOKEN": "true", "SSH_AUTH": "abc"},
                             [("HF_TOKEN", "hf12")])
    assert mask.values == ("hf12",)
    result = CellResult("c", Role.CANDIDATE, Status.PASSED, tests=(TestOutcome("t::x", "passed"),),
                        environment={"hf12": "hf12"})
    masked = mask.result(result)
    assert masked.tests == result.tests and masked.environment.to_json() == {"hf12": "***"}
