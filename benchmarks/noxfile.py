"""The hand-written baseline a platform engineer would write: one venv per torch version, the same
test files, plain pytest. (stackgate's own benchmark drives it: see bench.py.)

It keeps nox's defaults (virtualenv + pip, which reads the machine's pip configuration); bench.py
also runs it with `--default-venv-backend uv`, the faster installer a team would switch to. uv does
not read pip's configuration, so there the wheel sources come from the environment as uv expects
(UV_FIND_LINKS, UV_EXTRA_INDEX_URL, UV_INDEX_STRATEGY), the way a CI job would set them.
"""

import nox


@nox.session(python="3.11")
@nox.parametrize("torch", ["2.13.0+cpu", "2.14.1"])
def suite(session: nox.Session, torch: str) -> None:
    session.install(f"torch=={torch}", "numpy", "pytest")
    session.run("pytest", "suite", "-q", "-p", "no:cacheprovider")
