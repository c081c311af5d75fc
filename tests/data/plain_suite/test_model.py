"""A third-party-style suite: plain pytest and torch, nothing of stackgate."""

import torch


def test_linear_layer_trains() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 4), torch.randn(32, 1)
    first = None
    for _ in range(10):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        first = first if first is not None else float(loss)
    assert float(loss) < first


def test_matmul_matches_numpy() -> None:
    a, b = torch.randn(8, 8, dtype=torch.float64), torch.randn(8, 8, dtype=torch.float64)
    assert torch.allclose(a @ b, torch.from_numpy(a.numpy() @ b.numpy()))
