"""torch.compile: at least one graph captured, compiled output equals eager within tolerance;
compile time recorded."""

from __future__ import annotations

import os
import time

import pytest
import record
import torch


@pytest.fixture
def shared_compile_cache(expect) -> str:
    """Where this run's compile caches are, for messages. Under the harness they are the caches a node's
    stacks share (#43): it points every node's TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR at them, so
    production's main run fills them, the candidate's main run compiles on what production left, and
    production's rollback run on what the candidate left (pytorch#150494, #173679: a newer torch's
    entries crashed the older one). Without the harness: the process's own caches, not named."""
    return os.environ.get("TORCHINDUCTOR_CACHE_DIR", "") if expect.artifacts is not None else ""


@pytest.mark.crossversion  # the rollback phase runs it too: production on the candidate's caches
def test_compile_matches_eager_and_captures_a_graph(expect, shared_compile_cache) -> None:
    device = "cuda" if expect.device == "cuda" else "cpu"
    where = f" (compile caches shared with the other stack: {shared_compile_cache})" if shared_compile_cache else ""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 16)).to(device)
    x = torch.randn(32, 64, device=device)

    explain = torch._dynamo.explain(model)(x)  # noqa: SLF001 - the public explain API lives here
    assert explain.graph_count >= 1, f"dynamo captured no graph (breaks: {explain.break_reasons})"

    torch._dynamo.reset()  # noqa: SLF001
    compiled = torch.compile(model)
    t0 = time.perf_counter()
    try:
        out = compiled(x)
    except Exception as exc:
        raise AssertionError(f"torch.compile failed in torch {torch.__version__}{where}: {exc}") from exc
    compile_s = time.perf_counter() - t0
    ref = model(x)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5,
                               msg=lambda m: f"compiled != eager in torch {torch.__version__}{where}: {m}")
    calls = []
    for _ in range(20):
        t0 = time.perf_counter()
        compiled(x)
        if device == "cuda":
            torch.cuda.synchronize()
        calls.append((time.perf_counter() - t0) * 1e3)
    record.metric("compile.time", compile_s, "s", test="compile", better="lower")
    record.metric("compile.graphs", explain.graph_count, "graphs", test="compile", better="equal")
    record.metric("compile.call_time", calls, "ms", test="compile", better="lower")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_compile_elementwise_parity(expect, dtype) -> None:
    device = "cuda" if expect.device == "cuda" else "cpu"
    x = torch.linspace(-3, 3, 4096, dtype=getattr(torch, dtype), device=device)
    fn = torch.compile(lambda t: torch.sin(t) + torch.cos(t) * torch.tanh(t))
    torch.testing.assert_close(fn(x), torch.sin(x) + torch.cos(x) * torch.tanh(x))
