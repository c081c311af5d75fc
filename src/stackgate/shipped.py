"""What ships inside the package: the integration suite, the default matrix and policy data, the
Dockerfile template and the selftest's recorded run. Found with importlib.resources, so a wheel
installed anywhere (not only an editable checkout) has them."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from stackgate.errors import InfraError


def resource(*parts: str) -> Path:
    """A file or directory under `stackgate/resources/`, as a real filesystem path."""
    found = resources.files("stackgate").joinpath("resources", *parts)
    path = Path(str(found))
    if not path.exists():
        raise InfraError(f"the stackgate package is missing its resource {'/'.join(parts)} ({path})",
                         hint="reinstall stackgate; a zipped install is not supported")
    return path


BUNDLED_SUITE = resource("integration_tests")
MATRIX_DIR = resource("matrix")
DOCKERFILE_TEMPLATE = resource("images", "Dockerfile.template")
SUITE_LAYER = resource("images", "suite-layer.Dockerfile")  # the suite's own wheels: a thin layer on a stack image
NODE_INIT = resource("images", "node-init.py")  # PID 1 of every node container

