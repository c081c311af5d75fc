"""Thin sessions: one per verb; the logic lives in the stackgate package."""

from __future__ import annotations

import nox

nox.options.default_venv_backend = "uv|virtualenv"
nox.options.sessions = ["tests", "lint"]
nox.options.reuse_existing_virtualenvs = True

PYTHON = "3.11"


def _stackgate(session: nox.Session, *args: str) -> None:
    session.install("-e", ".")
    session.run("stackgate", *args, *session.posargs, external=False)


@nox.session(name="upgrade-torch", python=PYTHON)
def upgrade_torch(session: nox.Session) -> None:
    """Production vs a candidate torch (default from matrix/upgrade.toml; `-- --candidate X`)."""
    _stackgate(session, "run", "--matrix", "matrix/upgrade.toml")


@nox.session(python=PYTHON)
def nightly(session: nox.Session) -> None:
    """Production vs the torch nightly (`-- --find-links DIR` or `--index-url URL`)."""
    _stackgate(session, "run", "--matrix", "matrix/nightly.toml")


@nox.session(python=PYTHON)
def watch(session: nox.Session) -> None:
    """Re-check production (the last promotion): new advisories, outdated allow-list entries, the rollback (`-- --vuln-db DIR`)."""
    _stackgate(session, "watch", "--config-dir", "matrix")


@nox.session(python=PYTHON)
def matrix(session: nox.Session) -> None:
    """Print the expanded matrix with the reason for every pruned or not-run cell."""
    _stackgate(session, "matrix", "show")


@nox.session(name="base-image", python=PYTHON)
def base_image(session: nox.Session) -> None:
    """Bootstrap the local Debian base image (debootstrap + docker import) for registry-less hosts."""
    _stackgate(session, "base-image")


@nox.session(python=PYTHON)
def selftest(session: nox.Session) -> None:
    """Inject known faults into recorded results and check the gate catches each."""
    _stackgate(session, "selftest")


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The harness's tests, every tier (`-- --fast`: the unit tier and its property tests, for the edit-test loop)."""
    session.install("-e", ".", "hypothesis>=6.100", "pytest-xdist>=3.5")
    # one worker per core (at most 4): a real run of a stack keeps about one core busy (pip, torch's import, one
    # pytest), so two workers on CI's two cores take the tiers side by side; the Docker and registry tiers
    # share one worker (one engine), as does the Slurm tier (tests/budgets.py: share_of). At the end each
    # tier's time, the files over budget (tests/budgets.toml) and the 15 slowest tests.
    session.run("pytest", *(session.posargs or ["tests", "-n", "auto", "--maxprocesses", "4", "--dist", "loadfile",
                                                "--no-loadscope-reorder", "--durations=15"]))


@nox.session(name="bad-inputs", python=PYTHON)
def bad_inputs(session: nox.Session) -> None:
    """>= 10,000 generated bad inputs through the readers, the gate and the commands: crashes, hangs, false GOs."""
    session.install("-e", ".", "hypothesis>=6.100")
    session.run("python", "benchmarks/bad_inputs.py", *session.posargs)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff, mypy --strict on the package, and the generated CI workflows: current and schema-valid."""
    session.install("-e", ".", "ruff==0.17.6", "mypy==2.4.1", "check-jsonschema==0.39.0")
    session.run("ruff", "check", "src", "tests", "noxfile.py")
    session.run("mypy")
    session.run("stackgate", "ci", "github", "--check")
    session.run("python", "-m", "stackgate.boundary.schemas", "--check")  # the shipped JSON Schemas
    session.run("check-jsonschema", "--builtin-schema", "vendor.github-workflows", ".github/workflows/nightly.yml",
                ".github/workflows/upgrade-gate.yml")


@nox.session(name="ci-workflows", python=PYTHON)
def ci_workflows(session: nox.Session) -> None:
    """Regenerate .github/workflows from matrix/fleet.toml."""
    _stackgate(session, "ci", "github")


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """stackgate vs a hand-written nox baseline, cold and warm, side by side (prints figures)."""
    session.install("-e", ".")
    session.run("python", "benchmarks/bench.py")


@nox.session(python=PYTHON)
def sensitivity(session: nox.Session) -> None:
    """Plant known slowdowns and count how often the real gate says NO-GO (prints the table)."""
    session.install("-e", ".")
    session.run("python", "benchmarks/sensitivity.py", *session.posargs)
