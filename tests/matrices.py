"""Matrix TOML for the tiers that run the small 2.13.0+cpu stack as both production and candidate:
their tests are about where cells run (pools, containers, bundles), not about an upgrade."""

from __future__ import annotations


def one_cpu_stack(name: str, pools: list[str], topology: str) -> str:
    """A matrix of one stack (torch 2.13.0, CPU, Python 3.11) on `pools` at `topology`, every test required."""
    return f"""[matrix]
name = "{name}"
channel = "stable"
pools = {pools!r}
torch = ["2.13.0"]
cuda = ["cpu"]
python = ["3.11"]
required = ["*"]

[matrix.cpu]
cuda = ["cpu"]
topology = ["{topology}"]
""".replace("'", '"')
