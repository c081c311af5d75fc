"""Stack images on Slurm nodes (#42): how a task runs a node's command in the image with the node's own
container runtime: podman (the task runs `podman run`), Apptainer (`apptainer exec`) or pyxis (srun's
`--container-image`: the task itself runs in the image). Only the plan's variables go in, never the
harness's; the image is named by digest in each runtime's own syntax."""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from stackgate.errors import ConfigError
from stackgate.model import Cell, SlurmSpec
from stackgate.suite import NodeCommand


@dataclass(frozen=True)
class Container:
    """How a Slurm pool's nodes run the stack's image: the runtime, the image (by digest when it went
    through a registry, else the local build), the mounts (host, container, rw|ro; `DockerBackend.mounts`)
    and whether the cell hands its GPUs over."""

    runtime: str  # podman | pyxis | apptainer
    image: str  # repo@sha256:... or a local tag (the engine's build, on a single-host cluster)
    mounts: tuple[tuple[str, str, str], ...]
    gpu: bool = False
    name: str = "sg"  # podman's container name prefix (the attempt's tag)

    @property
    def by_digest(self) -> bool:
        return "@sha256:" in self.image

    def reference(self) -> str:
        """The image in the runtime's own syntax."""
        if self.runtime == "pyxis":  # enroot: registry#repository, or the local engine's image
            if not self.by_digest:
                return f"dockerd://{self.image}"
            host, _, rest = self.image.partition("/")
            return f"{host}#{rest}" if rest and ("." in host or ":" in host or host == "localhost") else self.image
        if self.runtime == "apptainer":
            return f"docker://{self.image}" if self.by_digest else f"docker-daemon://{self.image}"
        return f"docker://{self.image}" if self.by_digest else f"docker-daemon:{self.image}"


def missing(runtime: str) -> str:
    return (f"command -v {runtime} >/dev/null 2>&1 || {{ echo \"[stackgate] {runtime} is not installed on node "
            f"$(hostname): cannot run the stack's image\" >&2; exit 127; }}")


def names(command: NodeCommand, multi_node: bool) -> list[str]:
    return sorted({*command.env, *(["STACKGATE_RDZV_ENDPOINT"] if multi_node else [])})


def pull(container: Container, status: str) -> str:
    """The job's first step on every node: pull the image (by digest) into the node's podman; its exit
    code goes to `status` (a shell path), which the node's script reads before it runs anything."""
    return (f"{missing('podman')}; podman pull --quiet {shlex.quote(container.reference())} >/dev/null; "
            f"echo $? > {status}")


def podman(command: NodeCommand, container: Container, multi_node: bool) -> list[str]:
    """podman on the node: host networking (the rendezvous) and PIDs, the node's user, the mounts, the plan's
    variables by name, CDI for GPUs; removed when it ends, and when Slurm ends the task (TERM). The
    job's pull step left the image there (or the reason it could not)."""
    name = f"{container.name}-{command.label}-node{command.node}"
    pulled = f'"$(dirname "$0")/node{command.node}-{command.label}.pulled"'
    check = (f"pulled=$(cat {pulled} 2>/dev/null || echo 127); [ \"$pulled\" = 0 ] || {{ echo \"[stackgate] podman "
             f"could not pull {container.reference()} on node $(hostname) (exit $pulled)\" >&2; exit 125; }}")
    # the host's PID namespace, as enroot's and Apptainer's containers share it: torchrun names each node's
    # agent by host name and PID, and two nodes' agents that are both PID 1 on one host would be one
    argv = ["podman", "run", "--rm", "--name", name, "--network", "host", "--pid", "host", "--pull", "missing",
            "--user", f"{os.getuid()}:{os.getgid()}", "--workdir", str(command.cwd)]
    for host, inside, mode in container.mounts:
        argv += ["--volume", f"{host}:{inside}:{mode}"]
    for key in names(command, multi_node):
        argv += ["--env", key]
    if container.gpu:
        argv += ["--device", "nvidia.com/gpu=all"]
    argv += [container.reference(), *command.argv]
    return [missing("podman"), check,
            f"trap 'podman rm -f -t 5 {name} >/dev/null 2>&1; exit 143' TERM INT",
            shlex.join(argv) + " &",
            "wait $!"]


def apptainer(command: NodeCommand, container: Container, multi_node: bool) -> list[str]:
    """Apptainer on the node: a clean environment holding only the plan's variables, no home, the mounts,
    --nv for GPUs; it runs as the task's own process, so it ends with the job."""
    lines = [missing("apptainer")]
    lines += [f'export APPTAINERENV_{key}="${key}"' for key in names(command, multi_node)]
    binds = ",".join(f"{host}:{inside}:{mode}" for host, inside, mode in container.mounts)
    argv = ["apptainer", "exec", "--cleanenv", "--contain", "--no-home", "--pwd", str(command.cwd), "--bind", binds]
    if container.gpu:
        argv.append("--nv")
    return [*lines, "exec " + shlex.join([*argv, container.reference(), *command.argv])]


def pyxis_options(container: Container, scripts: Path) -> list[str]:
    """pyxis's srun options: the image, the mounts (and the job's scripts directory at its own path: the
    task runs inside the image), no home; GPUs as Slurm assigns them (pyxis's default)."""
    mounts = [*(f"{host}:{inside}:{mode}" for host, inside, mode in container.mounts), f"{scripts}:{scripts}:rw"]
    return [f"--container-image={container.reference()}", f"--container-mounts={','.join(mounts)}",
            "--no-container-mount-home"]


# podman's own failures (125: the image could not be pulled or the container not created) and the node
# script's "the runtime is not installed" (127); Apptainer says 255 when it cannot fetch or start the image
RUNTIME_FAILED = (125, 127, 255)


def check_pairing(spec: SlurmSpec, backend: str, cell: Cell) -> None:
    """A Slurm pool with a container runtime runs images (the docker backend builds or pulls them); one
    without runs the venv: the other pairing is a configuration error naming the pool."""
    if spec.container and backend != "docker":
        raise ConfigError(f"pool {cell.pool.name}: container = \"{spec.container}\" runs the stack's image on the "
                          f"nodes, but the {backend} backend prepares venvs", hint="use --backend docker (or auto)")
    if not spec.container and backend == "docker":
        raise ConfigError(f"pool {cell.pool.name}: its Slurm nodes need a container runtime to run the stack's image",
                          hint='set container = "podman" | "pyxis" | "apptainer" for the pool in fleet.toml (or '
                               "--container RUNTIME), or use --backend venv")
