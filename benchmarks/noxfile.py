"""The hand-written baseline a platform engineer would write: one venv per torch version, the same
test files, plain pytest. (stackgate's own benchmark drives it: see bench.py.)

uv does not read pip's configuration, so the wheel sources come from the environment as uv expects
(UV_FIND_LINKS, UV_EXTRA_INDEX_URL, UV_INDEX_STRATEGY), the way a CI job would set them.
"""

import nox

nox.options.default_venv_backend = "uv"


@nox.session(python="3.11")
@nox.parametrize("torch", ["2.13.0+cpu", "2.14.1"])
def suite(session: nox.Session, torch: str) -> None:
    session.install(f"torch=={torch}", "numpy", "pytest")
    session.run("pytest", "suite", "-q", "-p", "no:cacheprovider")
