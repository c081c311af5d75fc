"""Stands in for a monorepo's own trainer tests: plain pytest, metrics through the JSON-lines contract."""

import json
import os

import torch


def test_my_trainer_step() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(64, 8), torch.randn(64, 1)
    losses = []
    for _ in range(5):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert losses[-1] < losses[0]
    path = os.environ.get("STACKGATE_RESULTS")
    if path:
        with open(path, "a") as fh:  # noqa: PTH123 - a user suite, written the plain way
            fh.write(json.dumps({"name": "my_trainer.loss", "samples": losses, "unit": "", "better": "equal"}) + "\n")
