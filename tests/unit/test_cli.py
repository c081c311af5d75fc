from __future__ import annotations

import json
from pathlib import Path

import pytest

from stackgate import selftest
from stackgate.cli import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


def test_compat_check_exit_codes_and_reasons(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compat", "check", "--driver", "550.54.14", "--cuda", "13.0", "--torch", "2.14.1"]) == 1
    out = capsys.readouterr().out
    assert "NOT compatible" in out and "CUDA 13.0 needs driver >= 580; driver is 550.54.14" in out
    assert main(["compat", "check", "--driver", "580.65.06", "--cuda", "13.0", "--torch", "2.14.1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["compatible"] is True


def test_bad_input_exits_2_with_a_message(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["compat", "check", "--driver", "r580", "--cuda", "13.0", "--torch", "2.14.1"]) == 2
    assert "unparseable NVIDIA driver version" in capsys.readouterr().err
    assert main(["run", "--candidate", "2.12.0", "--reports", str(tmp_path)]) == 2
    assert "older than production" in capsys.readouterr().err
    assert main(["run", "--candidate", "banana", "--reports", str(tmp_path)]) == 2
    assert main(["run", "--only", "nothing-*", "--reports", str(tmp_path)]) == 2
    assert "zero cells" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # nothing half-written


def test_matrix_show_and_selftest(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["matrix", "show"]) == 0
    out = capsys.readouterr().out
    assert "not run here" in out and "pruned: cuda-min-driver" in out
    assert main(["selftest"]) == 0
    assert f"selftest: {len(selftest.CASES)} passed, 0 failed" in capsys.readouterr().out
    assert main(["history", "--history", "/nonexistent/h.sqlite"]) == 0


def test_history_of_a_file_that_is_not_a_database_is_exit_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """#18 item 12: a traceback and exit 1 (the code of "no green nightly") before."""
    garbage = tmp_path / "history.sqlite"
    garbage.write_bytes(bytes(range(256)) * 20)
    for extra in ([], ["--last-green"]):
        assert main(["history", "--history", str(garbage), *extra]) == 3
        err = capsys.readouterr().err
        assert f"cannot read the history database {garbage}: file is not a database" in err
        assert "Traceback" not in err
