"""A suite for the nightly tests (issue 13): one test regresses from a planted date on. It reads the
build date from torch.__version__ (2.15.0.devYYYYMMDD+cpu) and the planted date from
$PLANTED_REGRESSION (given with --suite-env); a release, or no planted date, passes."""

import os
import re

import torch


def test_feature_that_regresses() -> None:
    built = re.search(r"dev(\d{8})", torch.__version__)
    planted = os.environ.get("PLANTED_REGRESSION", "")
    if built and planted and built.group(1) >= planted:
        raise AssertionError(f"regressed in {torch.__version__} (planted from {planted} on)")


def test_tensor_math() -> None:
    assert torch.allclose(torch.ones(3) * 2, torch.full((3,), 2.0))
