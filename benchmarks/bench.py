"""`nox -s bench`: stackgate against the hand-written nox baseline (benchmarks/noxfile.py), run with
nox's default backend (virtualenv + pip) and with its uv backend, the same two
tests (an FSDP + all-reduce + DCP job under torchrun, an import check) and the same torch versions
(2.13.0+cpu, 2.14.1), cold (fresh environment caches) and warm, side by side in one run. Prints wall
times and the ratios stackgate / each baseline (targets: cold <= 0.7, warm <= 1.0), and each stackgate
cell's time beside plain pytest on the same files in the same environment.

A benchmark, not a test: this machine is shared, so figures are printed, never asserted.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from stackgate.sources import read_pip_config

HERE = Path(__file__).resolve().parent


def uv_environment() -> dict[str, str]:
    """The wheel sources a CI job would give uv (which does not read pip's configuration)."""
    pip = read_pip_config(dict(os.environ))
    env = dict(os.environ)
    if pip.find_links:
        env["UV_FIND_LINKS"] = " ".join(pip.find_links)
    if pip.extra_index_urls:
        env["UV_EXTRA_INDEX_URL"] = " ".join(pip.extra_index_urls)
    if pip.index_url:
        env["UV_INDEX_URL"] = pip.index_url
    env["UV_INDEX_STRATEGY"] = "unsafe-best-match"
    return env


def timed(argv: list[str], cwd: Path, env: dict[str, str]) -> float:
    start = time.monotonic()
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    took = time.monotonic() - start
    if proc.returncode not in (0, 1):
        sys.exit(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return took


BASELINES = {"nox (pip)": [], "nox (uv)": ["--default-venv-backend", "uv"]}


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="stackgate-bench-"))
    env = uv_environment()
    nox = [sys.executable, "-m", "nox", "-f", str(HERE / "noxfile.py")]
    runs = {name: [*nox, *extra, "--envdir", str(work / f"nox-envs-{i}")] for i, (name, extra) in enumerate(BASELINES.items())}
    runs["stackgate"] = [sys.executable, "-m", "stackgate", "run", "--backend", "venv", "--suite", str(HERE / "suite"),
                         "--no-platform-checks", "--no-rollback", "--cache-dir", str(work / "sg-cache"),
                         "--reports", str(work / "sg-reports")]
    times: dict[tuple[str, str], list[float]] = {}
    for kind, rounds in (("cold", 1), ("warm", 2)):
        for i in range(rounds):
            for name, argv in runs.items():  # one after the other, each round, so drift hits all three
                extra = ["--run-id", f"{kind}{i}"] if name == "stackgate" else ["-r"] if kind == "warm" else []
                times.setdefault((name, kind), []).append(timed([*argv, *extra], HERE, env))
    med = {k: statistics.median(v) for k, v in times.items()}
    cells = []
    for cell in json.loads((work / "sg-reports" / "warm1" / "report.json").read_text())["cells"]:
        python = next((work / "sg-cache" / "envs").glob(f"{cell['stack']['cuda']}-torch*/bin/python"))
        plain = timed([str(python), "-m", "pytest", str(HERE / "suite"), "-q", "-p", "no:cacheprovider"], HERE, env)
        cells.append((cell["id"], cell["duration_s"], plain))
    names = list(BASELINES)
    print(f"{'':6} " + " ".join(f"{n:>11}" for n in names) + f" {'stackgate':>11}  "
          + "  ".join(f"{'ratio to ' + n:>19}" for n in names) + "  target")
    for kind, target in (("cold", 0.7), ("warm", 1.0)):
        s = med[("stackgate", kind)]
        print(f"{kind:6} " + " ".join(f"{med[(n, kind)]:10.1f}s" for n in names) + f" {s:10.1f}s  "
              + "  ".join(f"{s / med[(n, kind)]:19.2f}" for n in names) + f"  <= {target}")
    print(f"\n{'cell':48} {'stackgate cell':>14} {'plain pytest':>12} {'difference':>10}")
    for cell_id, cell_s, plain_s in cells:
        print(f"{cell_id:48} {cell_s:13.1f}s {plain_s:11.1f}s {cell_s - plain_s:+9.1f}s")
    samples = {f"{name} {kind}": [round(x, 1) for x in v] for (name, kind), v in times.items()}
    print(f"\nall samples: {json.dumps(samples)}")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
