"""Stacks as registry artifacts: the registry a fleet shares (`[registry]` in stackgate.toml or
fleet.toml, `--registry`), and `stacks.json`, which `stackgate build --push` writes and every pool
runner reads: stack (label and content hash) -> the image by digest (`repo@sha256:...`), its size and its SBOM's digest.

stackgate never reads or stores a registry credential: pushing and pulling go through the Docker
engine's client, so `docker login` and credential helpers work as they do for `docker push`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from stackgate import tomlfile
from stackgate.boundary import stacks as stacks_boundary
from stackgate.boundary.fleet import RegistryOnly
from stackgate.errors import ConfigError
from stackgate.report.files import atomic_write

SCHEMA = stacks_boundary.SCHEMA
DEFAULT_REPOSITORY = "stackgate/stack"
_REGISTRY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]*(:[0-9]+)?(/[a-z0-9._/-]+)?$")
_REPOSITORY = re.compile(r"^[a-z0-9]+([._-][a-z0-9]+)*(/[a-z0-9]+([._-][a-z0-9]+)*)*$")


@dataclass(frozen=True)
class Registry:
    """Where stack images are pushed: `url` is host[:port][/path], `repository` the name under it."""

    url: str
    repository: str = DEFAULT_REPOSITORY

    @property
    def name(self) -> str:
        """The image name without tag or digest: url/repository."""
        return f"{self.url.rstrip('/')}/{self.repository}"


def registry(url: str | None, repository: str | None, where: str) -> Registry | None:
    """A checked registry, or None when no url is configured."""
    if not url:
        return None
    url = url.removeprefix("https://").removeprefix("http://").rstrip("/")
    if not _REGISTRY.match(url):
        raise ConfigError(f"{where}: registry {url!r} is not host[:port][/path]",
                          hint='for example url = "127.0.0.1:5000" or "ghcr.io/my-org"')
    repo = repository or DEFAULT_REPOSITORY
    if not _REPOSITORY.match(repo):
        raise ConfigError(f"{where}: repository {repo!r} is not a valid image name (lowercase, / separated)",
                          hint='for example repository = "ml-platform/stack"')
    return Registry(url, repo)


def configured(url: str | None, repository: str | None, config_dir: Path) -> Registry | None:
    """The run's registry: `--registry` (or stackgate.toml's [registry], already in the options), else
    the fleet's `[registry]` table; None when neither names one."""
    if url:
        return registry(url, repository, "--registry")
    fleet_url, fleet_repository = from_toml(config_dir / "fleet.toml")
    return registry(fleet_url, repository or fleet_repository, f"{config_dir / 'fleet.toml'} [registry]")


def from_toml(path: Path) -> tuple[str | None, str | None]:
    """The `[registry]` table of a stackgate.toml or fleet.toml (url, repository), if there is one."""
    if not path.is_file():
        return None, None
    found = tomlfile.validate(tomlfile.load(path), RegistryOnly).registry
    return found.url, found.repository


@dataclass(frozen=True)
class StackArtifact:
    """One stack image in the registry, as `stackgate build --push` pushed it."""

    stack: str  # the stack.s ident: its label and content hash, e.g. cpu-torch2.13.0-py3.11-1a2b3c4d
    image: str  # repo@sha256:...: what every runner pulls
    key: str  # the content key it was built from
    size: int  # bytes, as the engine reports the image
    sbom_digest: str  # sha256 of its `pip freeze --all`
    torch: str
    cuda: str
    python: str

    @property
    def digest(self) -> str:
        return self.image.rsplit("@", 1)[1]


def write(path: Path, found: Mapping[str, StackArtifact], registry_name: str) -> None:
    atomic_write(path, json.dumps({"schema": SCHEMA, "registry": registry_name,
                                   "stacks": {k: asdict(v) for k, v in sorted(found.items())}}, indent=1) + "\n")


def read(path: Path) -> dict[str, StackArtifact]:
    """stacks.json, checked at the boundary: every entry names its image by digest."""
    return {label: StackArtifact(**entry.model_dump()) for label, entry in stacks_boundary.read(path).stacks.items()}
