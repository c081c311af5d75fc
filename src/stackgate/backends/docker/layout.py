"""Where things are inside a stack image and a node container: every in-image path and mount point,
spelled once (the Dockerfile template and its fragments in resources/images/ use the same paths)."""

from __future__ import annotations

from pathlib import PurePosixPath

VENV = PurePosixPath("/opt/venv")  # the stack's environment
SBOM_DIR = PurePosixPath("/opt/stackgate/sbom")
PIP_FREEZE = SBOM_DIR / "pip-freeze.txt"  # `pip freeze --all` of the stack, written at build

# a cell's host directories, mounted into each node container
OUT = PurePosixPath("/sg/out")  # the cell's directory: node logs, each attempt's JUnit and records
ARTIFACTS = PurePosixPath("/sg/artifacts")
SHARED = PurePosixPath("/sg/shared")
SUITE = PurePosixPath("/sg/suite")  # the suite a cell runs, read-only (never part of an image)
PREFIX = PurePosixPath("/sg/prefix")  # a given image: what the suite needs and the image lacks, read-only
BUNDLED_SUITE = PurePosixPath("/sg/bundled")  # the bundled suite beside a user's, for its platform checks
HOME = PurePosixPath("/sg/home")  # the home of a user the image has no entry for (a tmpfs of its own)
