"""Run a function on every rank under torchrun and gather the per-rank results.

Single node: `--standalone`. Several nodes (containers, or processes standing in for nodes): every
node's pytest runs the same tests in the same order, and each distributed test meets its peers at
STACKGATE_RDZV_ENDPOINT with a per-test rendezvous id.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

WORKER = Path(__file__).resolve().parent / "_worker.py"


@dataclass
class Topology:
    nnodes: int
    nproc_per_node: int
    node_rank: int
    endpoint: str
    device: str

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node


def topology_from_env(nproc_per_node: int | None = None) -> Topology:
    env = os.environ
    return Topology(
        nnodes=int(env.get("STACKGATE_NNODES", "1")),
        nproc_per_node=nproc_per_node or int(env.get("STACKGATE_NPROC_PER_NODE", "2")),
        node_rank=int(env.get("STACKGATE_NODE_RANK", "0")),
        endpoint=env.get("STACKGATE_RDZV_ENDPOINT", ""),
        device=env.get("STACKGATE_DEVICE", "cpu"),
    )


class DistributedFailure(AssertionError):
    pass


def launch(target: str, outdir: Path, *, nproc_per_node: int | None = None, timeout_s: float = 180,
           config: dict | None = None, test_id: str = "", extra_env: dict | None = None) -> list[dict]:
    """Run MODULE:FUNCTION on every rank; return this node's rank results (ok, value, error)."""
    topo = topology_from_env(nproc_per_node)
    outdir.mkdir(parents=True, exist_ok=True)
    cfg = {"device": topo.device, "timeout_s": timeout_s, **(config or {})}
    argv = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={topo.nproc_per_node}",
            "--max-restarts=0", "--monitor-interval=0.5"]
    if topo.nnodes > 1:
        digest = hashlib.sha1(f"{os.environ.get('STACKGATE_RUN_ID', '')}:{test_id}".encode()).hexdigest()
        rdzv = digest[:12]
        # every test meets on its own port: a peer that is still tearing down the previous test's
        # store (after a failure, say) cannot swallow the next test's rendezvous
        host, _, port = topo.endpoint.rpartition(":")
        endpoint = f"{host}:{int(port) + int(digest[12:16], 16) % 2000}"
        if topo.node_rank != 0:
            _wait_for(endpoint, timeout_s)  # node 0 hosts the store; joining before it listens fails fast
        argv += [f"--nnodes={topo.nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}",
                 f"--rdzv-id={rdzv}", f"--node-rank={topo.node_rank}", "--rdzv-conf=join_timeout=120"]
    else:
        argv += ["--standalone", "--nnodes=1"]
    argv += [str(WORKER), target, str(outdir), json.dumps(cfg)]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), **(extra_env or {})}
    if topo.device == "cuda":
        # NCCL flight recorder: on a collective timeout each rank dumps its last collectives here
        env.setdefault("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000")
        env.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
        env.setdefault("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", str(outdir / "nccl_trace_rank_"))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(WORKER.parent), env.get("PYTHONPATH", "")]))
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s + 30)
        timed_out = False
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # ranks orphaned by a dead agent must not linger
    except subprocess.TimeoutExpired:
        timed_out = True
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
                out, _ = proc.communicate(timeout=10)
                break
            except (ProcessLookupError, subprocess.TimeoutExpired):
                out = ""
                continue
    results = []
    for path in sorted(outdir.glob("rank*.json"), key=lambda p: int(p.stem[4:])):
        results.append(json.loads(path.read_text()))
    expected_local = topo.nproc_per_node
    if timed_out or proc.returncode != 0 or len(results) < expected_local or not all(r["ok"] for r in results):
        raise DistributedFailure(_explain(outdir, out or "", proc.returncode, timed_out, timeout_s, results,
                                          expected_local))
    return results


def _wait_for(endpoint: str, timeout_s: float) -> None:
    host, _, port = endpoint.rpartition(":")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((host, int(port)), timeout=2):
            return
        time.sleep(0.2)


def _explain(outdir: Path, launcher_out: str, rc: int | None, timed_out: bool, timeout_s: float,
             results: list[dict], expected: int) -> str:
    lines = []
    if timed_out:
        lines.append(f"distributed test timed out after {timeout_s:.0f}s (hang); stack dumps are in the rank logs")
    failed = [r["rank"] for r in results if not r["ok"]]
    missing = expected - len(results)
    lines.append(f"torchrun exit code {rc}; failed ranks: {failed or 'none'}; ranks with no result: {max(missing, 0)}")
    for log in sorted(outdir.glob("rank*.log"), key=lambda p: int(p.stem[4:])):
        text = log.read_text(errors="replace").splitlines()
        lines.append(f"----- {log.stem} (last 40 lines) -----")
        lines.extend(text[-40:])
    lines.append("----- torchrun (last 20 lines) -----")
    lines.extend(launcher_out.splitlines()[-20:])
    return "\n".join(lines)

