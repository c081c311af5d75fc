"""Cross-version artifacts. Every stack writes `torch.save` (weights_only-loadable) and DCP
checkpoints of model + optimizer, a `torch.export` program and a TorchScript module into
$STACKGATE_ARTIFACTS/<role>/; the other stack loads them and must reproduce the outputs.
The harness runs production first (candidate reads: forward), then a rollback phase in which
production reads what the candidate wrote."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest
import torch

OTHER = {"production": "candidate", "candidate": "production"}


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def _trained() -> tuple[Net, torch.optim.Optimizer, torch.Tensor]:
    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    for _ in range(3):
        opt.zero_grad()
        net(x).square().mean().backward()
        opt.step()
    return net, opt, x


def _dir(expect, role: str) -> Path:
    if expect.artifacts is None:
        pytest.skip("STACKGATE_ARTIFACTS not set: cross-version checks need the harness")
    return expect.artifacts / role


def test_write_artifacts(expect) -> None:
    if not (expect.phase == "main" or expect.phase.startswith("rerun")):
        pytest.skip("written in the main phase (and in a rerun that confirms its failure)")
    out = _dir(expect, expect.role)
    if os.environ.get("STACKGATE_NODE_RANK", "0") != "0":
        return  # every node sees the same directory: node 0 writes, the others only read
    out.mkdir(parents=True, exist_ok=True)
    net, opt, x = _trained()
    with torch.no_grad():
        ref = net(x)
    torch.save({"model": net.state_dict(), "optim": opt.state_dict(), "input": x, "output": ref},
               out / "state.pt")
    import torch.distributed.checkpoint as dcp
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # single-process DCP warns that no process group exists
        dcp.save({"model": net.state_dict(), "optim": opt.state_dict()}, checkpoint_id=str(out / "dcp"))
    exported = torch.export.export(net.eval(), (x,))
    torch.export.save(exported, str(out / "net.pt2"))
    written = ["state.pt", "dcp", "net.pt2"]
    try:
        torch.jit.save(torch.jit.script(net), str(out / "net.ts"))
        written.append("net.ts")
    except Exception as exc:  # noqa: BLE001 - TorchScript is deprecated; its absence is reported, not fatal
        (out / "torchscript-unavailable.txt").write_text(str(exc))
    (out / "manifest.json").write_text(json.dumps({"torch": torch.__version__, "files": written}))


def _source(expect) -> tuple[Path, dict]:
    src = _dir(expect, OTHER[expect.role])
    manifest = src / "manifest.json"
    if not manifest.exists():
        pytest.skip(f"no artifacts from the {OTHER[expect.role]} stack in {src}")
    return src, json.loads(manifest.read_text())


@pytest.mark.crossversion
def test_load_torch_save_weights_only(expect) -> None:
    src, meta = _source(expect)
    blob = torch.load(src / "state.pt", weights_only=True)
    net = Net()
    net.load_state_dict(blob["model"])
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    opt.load_state_dict(blob["optim"])
    with torch.no_grad():
        torch.testing.assert_close(net(blob["input"]), blob["output"], rtol=1e-5, atol=1e-6,
                                   msg=lambda m: f"torch.save from torch {meta['torch']}: {m}")


def _key_mismatch(state: dict, checkpoint: Path) -> tuple[list[str], list[str]]:
    """(keys the state asks for that the checkpoint lacks, keys the checkpoint holds that the state does
    not ask for), in DCP's flattened names (`model.a.weight`, `optim.state.0.step`)."""
    import torch.distributed.checkpoint as dcp
    saved = set(dcp.FileSystemReader(str(checkpoint)).read_metadata().state_dict_metadata)
    try:
        from torch.distributed.checkpoint._nested_dict import flatten_state_dict  # what dcp.load flattens with
        wanted = set(flatten_state_dict(state)[0])
    except ImportError:  # a torch without it: the model's keys alone, on both sides
        wanted = {f"model.{k}" for k in state["model"]}
        saved = {k for k in saved if k.startswith("model.")}
    return sorted(wanted - saved), sorted(saved - wanted)


@pytest.mark.crossversion
def test_load_dcp_model_and_optimizer(expect) -> None:
    src, meta = _source(expect)
    import torch.distributed.checkpoint as dcp
    net, opt, x = _trained()
    ref = torch.load(src / "state.pt", weights_only=True)
    fresh = Net()
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    # optimizer state must exist before loading into it
    fresh_opt.zero_grad()
    fresh(x).sum().backward()
    fresh_opt.step()
    state = {"model": fresh.state_dict(), "optim": fresh_opt.state_dict()}
    # an exact key match, both ways: dcp.load ignores what the checkpoint holds and the state does not ask
    # for, and a partial load (allow_partial_load) hides what it lacks (torchtitan#886)
    missing, unexpected = _key_mismatch(state, src / "dcp")
    assert not missing and not unexpected, (f"DCP checkpoint from torch {meta['torch']}: missing keys {missing[:20]}, "
                                            f"unexpected keys {unexpected[:20]}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(state, checkpoint_id=str(src / "dcp"))
    fresh.load_state_dict(state["model"])
    fresh_opt.load_state_dict(state["optim"])
    with torch.no_grad():
        torch.testing.assert_close(fresh(ref["input"]), ref["output"], rtol=1e-5, atol=1e-6,
                                   msg=lambda m: f"DCP checkpoint from torch {meta['torch']}: {m}")
    step_ref = ref["optim"]["state"][0]["step"]
    assert float(state["optim"]["state"][0]["step"]) == float(step_ref), "optimizer step count not restored"


@pytest.mark.crossversion
def test_load_exported_program(expect) -> None:
    src, meta = _source(expect)
    ref = torch.load(src / "state.pt", weights_only=True)
    program = torch.export.load(str(src / "net.pt2"))
    torch.testing.assert_close(program.module()(ref["input"]), ref["output"], rtol=1e-5, atol=1e-6,
                               msg=lambda m: f"torch.export program from torch {meta['torch']}: {m}")


@pytest.mark.crossversion
def test_load_torchscript(expect) -> None:
    src, meta = _source(expect)
    if "net.ts" not in meta["files"]:
        pytest.skip(f"torch {meta['torch']} wrote no TorchScript module")
    ref = torch.load(src / "state.pt", weights_only=True)
    module = torch.jit.load(str(src / "net.ts"))
    torch.testing.assert_close(module(ref["input"]), ref["output"], rtol=1e-5, atol=1e-6)
