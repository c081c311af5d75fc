"""The suite's environment is an allow-list, and secrets never reach a report, a log or a bundle.

A node runs with only: what the suite contract sets (`suite.suite_env`), what a process needs to run
at all (`BASE`: PATH, HOME, locale, TMPDIR, ...), what the stack may need from the machine (`STACK`
prefixes: CUDA_, NCCL_, FI_, ...; never a secret-looking name), and what the user passes explicitly
(`--suite-env KEY=VALUE`, `--pass-env NAME`). Values whose names look secret (TOKEN, SECRET, KEY,
PASSWORD, CREDENTIAL, ...), from the host or passed to the suite, are replaced by `***` wherever
stackgate writes: results.jsonl, every report, node and build logs, the JUnit and records files a
cell leaves in its directory, and the options report.json records, as CI systems mask secrets.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stackgate.boundary.results import from_json as result_from_json
from stackgate.model import CellResult

MASK = "***"
# (not SESSION: nox's NOX_CURRENT_SESSION=tests would mask every "tests" in a report)
_SECRET = re.compile(r"TOKEN|SECRET|PASSW|PASSPHRASE|CREDENTIAL|API_?KEY|ACCESS_?KEY|PRIVATE|_KEY$|^KEY$|AUTH|COOKIE|"
                     r"SIGNATURE|_PAT$|WEBHOOK", re.I)
BASE = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM", "SHELL", "PWD",
        "LD_LIBRARY_PATH", "SSL_CERT_FILE", "SSL_CERT_DIR")
STACK = ("LC_", "CUDA_", "NVIDIA_", "NCCL_", "FI_", "OMP_", "MKL_", "TORCH_", "PYTORCH_", "TORCHINDUCTOR_",
         "TRITON_", "GLOO_", "UCX_", "HIP_", "ROCR_")
# the same names as shell globs, for a job script (`case` with nocasematch)
SECRET_GLOBS = ("*TOKEN*|*SECRET*|*PASSW*|*PASSPHRASE*|*CREDENTIAL*|*API_KEY*|*APIKEY*|*ACCESS_KEY*|*ACCESSKEY*|"
                "*PRIVATE*|*_KEY|KEY|*AUTH*|*COOKIE*|*SIGNATURE*|*_PAT|*WEBHOOK*")
# Shorter values are not masked: they would mask ordinary words ("true", "tests") all over a report. A
# value passed to the suite explicitly is masked from 4 characters, one that is only in the host's
# environment (which the suite never sees) from 8.
MIN_PASSED, MIN_HOST = 4, 8


def looks_secret(name: str) -> bool:
    return bool(_SECRET.search(name))


def node_base(host: Mapping[str, str], pass_env: Iterable[str] = ()) -> dict[str, str]:
    """The host variables a node's command starts from (the plan's own variables go on top)."""
    wanted = set(pass_env)
    return {k: v for k, v in host.items()
            if k in wanted or (not looks_secret(k) and (k in BASE or k.startswith(STACK)))}


@dataclass(frozen=True)
class Masker:
    """Replaces every secret value with `***` in what stackgate writes."""

    values: tuple[str, ...] = ()

    @classmethod
    def of(cls, host: Mapping[str, str], passed: Iterable[tuple[str, str]] = ()) -> Masker:
        found = {v for k, v in host.items() if looks_secret(k) and len(v) >= MIN_HOST}
        found |= {v for k, v in passed if looks_secret(k) and len(v) >= MIN_PASSED}
        return cls(tuple(sorted(found, key=len, reverse=True)))  # longest first: a value inside another

    def text(self, text: str) -> str:
        for value in self.values:
            if value in text:
                text = text.replace(value, MASK)
        return text

    def data(self, value: Any) -> Any:
        """The same structure (dicts, lists, strings) with every string value masked; keys are the
        structure's own names and stay as they are."""
        if not self.values:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {k: self.data(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.data(v) for v in value]
        return value

    def result(self, result: CellResult) -> CellResult:
        return result_from_json(self.data(result.to_json())) if self.values else result

    def scrub(self, folder: Path) -> int:
        """Rewrite the files directly in `folder` (a cell's JUnit, records, node logs; build logs) that
        hold a secret; returns how many were rewritten."""
        if not self.values or not folder.is_dir():
            return 0
        secrets = [v.encode() for v in self.values]
        rewritten = 0
        for path in folder.iterdir():
            if not path.is_file() or path.is_symlink():
                continue
            data = path.read_bytes()
            if any(s in data for s in secrets):
                for s in secrets:
                    data = data.replace(s, MASK.encode())
                path.write_bytes(data)
                rewritten += 1
        return rewritten
