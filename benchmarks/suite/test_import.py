"""Import check: torch imports and reports its version."""

import torch


def test_torch_imports() -> None:
    assert torch.__version__
    assert torch.ones(2).sum().item() == 2.0
