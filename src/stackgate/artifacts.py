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
from typing import Any

from stackgate import tomlfile
from stackgate.errors import ConfigError
from stackgate.report.files import atomic_write

SCHEMA = 1
DEFAULT_REPOSITORY = "stackgate/stack"
DIGEST_REF = re.compile(r"^[a-z0-9][^@\s]*@sha256:[0-9a-f]{64}$")
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
    doc = tomlfile.load(path)
    table = tomlfile.get(doc, doc.data, "registry", dict, default={})
    tomlfile.check_keys(doc, table, ["url", "repository"], "registry")
    url = tomlfile.get(doc, table, "url", str, "registry", default=None)
    repository = tomlfile.get(doc, table, "repository", str, "registry", default=None)
    return url, repository


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
    """stacks.json, checked: every entry names its image by digest."""
    try:
        data: Any = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"--stacks {path}: no such file",
                          hint="`stackgate build --push` writes it (or pass the file your build job produced)") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--stacks {path}: not readable JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("stacks"), dict):
        raise ConfigError(f"--stacks {path}: not a stacks.json of schema {SCHEMA}",
                          hint="write it with `stackgate build --push`")
    out = {}
    fields = set(StackArtifact.__dataclass_fields__)
    for label, entry in data["stacks"].items():
        if not isinstance(entry, dict) or set(entry) != fields:
            raise ConfigError(f"--stacks {path}: stack {label!r} needs exactly {', '.join(sorted(fields))}")
        artifact = StackArtifact(**entry)
        if not DIGEST_REF.match(artifact.image) or artifact.stack != label:
            raise ConfigError(f"--stacks {path}: stack {label!r}: image {artifact.image!r} is not repo@sha256:<64 hex>",
                              hint="a pool runner pulls by digest only; a tag can move")
        out[label] = artifact
    return out
