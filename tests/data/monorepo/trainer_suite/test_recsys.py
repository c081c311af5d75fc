"""The team's trainer suite: plain pytest, torch, the team's own package and einops."""

import einops
import recsys_kit
import torch


def test_two_tower_trains() -> None:
    losses = recsys_kit.train()
    assert losses[-1] < 0.8 * losses[0], losses


def test_einops_rearranges_a_batch() -> None:
    x = torch.arange(24).reshape(2, 3, 4)
    y = einops.rearrange(x, "b c w -> b w c")
    assert torch.equal(y, x.transpose(1, 2))


def test_package_is_installed_not_imported_from_the_tree() -> None:
    assert "site-packages" in recsys_kit.__file__, recsys_kit.__file__
