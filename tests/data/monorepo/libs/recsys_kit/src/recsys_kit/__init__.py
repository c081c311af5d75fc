"""A team's recommender building blocks: a bag-of-embeddings model and one training step."""

from __future__ import annotations

import torch

__version__ = "0.3.0"


class TwoTower(torch.nn.Module):
    """Users and items embedded into one space; the score is their dot product."""

    def __init__(self, users: int, items: int, dim: int = 8) -> None:
        super().__init__()
        self.users = torch.nn.EmbeddingBag(users, dim, mode="mean")
        self.items = torch.nn.Embedding(items, dim)

    def forward(self, history: torch.Tensor, offsets: torch.Tensor, item: torch.Tensor) -> torch.Tensor:
        return (self.users(history, offsets) * self.items(item)).sum(-1)


def train(steps: int = 30, seed: int = 0) -> list[float]:
    """Losses of a short run on a fixed synthetic task."""
    torch.manual_seed(seed)
    model = TwoTower(users=50, items=40)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    history = torch.randint(0, 50, (64 * 3,))
    offsets = torch.arange(0, 64 * 3, 3)
    item = torch.randint(0, 40, (64,))
    label = (item % 2).float()
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(history, offsets, item), label)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses
