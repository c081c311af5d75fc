"""torch.compile: at least one graph captured, compiled output equals eager within tolerance;
compile time recorded."""

from __future__ import annotations

import time

import pytest
import record
import torch


def test_compile_matches_eager_and_captures_a_graph(expect) -> None:
    device = "cuda" if expect.device == "cuda" else "cpu"
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 16)).to(device)
    x = torch.randn(32, 64, device=device)

    explain = torch._dynamo.explain(model)(x)  # noqa: SLF001 - the public explain API lives here
    assert explain.graph_count >= 1, f"dynamo captured no graph (breaks: {explain.break_reasons})"

    torch._dynamo.reset()  # noqa: SLF001
    compiled = torch.compile(model)
    t0 = time.perf_counter()
    out = compiled(x)
    compile_s = time.perf_counter() - t0
    ref = model(x)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
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
