"""`stackgate build [--push]`: every stack of the matrix (all pools, not only this machine's), built
once as an image (reused by its content key when unchanged) and, with `--push`, pushed to the
registry; `stacks.json` then names each by digest, for the pool runners (`run --stacks`) that pull
it and never build."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from stackgate import artifacts, inputs, matrix
from stackgate.backends.base import PrepareFailed
from stackgate.backends.choose import REAL, Machinery
from stackgate.console import Console, Printer
from stackgate.errors import ConfigError, ExitCode, InfraError
from stackgate.options import Options
from stackgate.plan import plan_envs
from stackgate.suite_deps import SuiteDeps

STACKS_FILE = "stacks.json"


def build(opts: Options, env: Mapping[str, str], say: Printer | None = None, *, push: bool,
          machinery: Machinery = REAL) -> int:
    """Exit 0 when every stack was built (and pushed), 1 when a stack cannot be built, 3 when the
    machinery (engine, registry) failed; stacks.json is written only when every stack was pushed."""
    say = Console(say).say
    loaded = inputs.load(opts, env, machinery.local())
    registry = artifacts.configured(opts.registry, opts.repository, opts.config_dir)
    if push and registry is None:
        raise ConfigError("--push needs a registry", hint="pass --registry HOST[:PORT], or set [registry] url in "
                                                         "stackgate.toml or fleet.toml")
    everywhere = matrix.select(inputs.expand(loaded), opts.only, None)
    cells = [*everywhere.cells, *(n.cell for n in everywhere.not_here)]
    stacks = [p.stack for p in plan_envs(cells) if not p.stack.given]  # (a given stack is never built)
    if not stacks:
        raise ConfigError(f"the matrix {opts.matrix} has no stack to build"
                          + (f" (--only {' '.join(opts.only)})" if opts.only else ""))
    backend = machinery.backend(replace(opts, backend="docker", launcher="local", stacks=None), loaded, env, say,
                                SuiteDeps())  # the stack alone: the suite is never part of its image
    publish = getattr(backend, "publish", None)
    if publish is None:
        raise ConfigError(f"stackgate build needs the docker backend (got {backend.name})")
    logs = opts.reports / "build"
    logs.mkdir(parents=True, exist_ok=True)
    pushed: dict[str, artifacts.StackArtifact] = {}
    failed = []
    try:
        for stack in stacks:
            say(f"stack {stack.ident}")
            try:
                handle = backend.prepare(stack, logs / f"{stack.ident}.log")
            except PrepareFailed as exc:
                say(f"  cannot build {stack.ident}: {exc} (log: {logs / f'{stack.ident}.log'})")
                failed.append(stack.ident)
                continue
            say(f"  {'reused' if handle.reused else 'built'} {handle.ref}")
            if push:
                pushed[stack.ident] = publish(handle)
                say(f"  pushed {pushed[stack.ident].image}")
    finally:
        backend.close()
    if failed:
        say(f"{len(failed)} stack(s) cannot be built: {', '.join(failed)}; stacks.json not written")
        return int(ExitCode.NO_GO)
    if not push:
        say(f"{len(stacks)} stack image(s) here; nothing pushed (stacks.json is written by --push)")
        return 0
    assert registry is not None
    out = opts.stacks or Path(STACKS_FILE).absolute()
    try:
        artifacts.write(out, pushed, registry.name)
    except OSError as exc:
        raise InfraError(f"cannot write {out}: {exc.strerror}") from None
    say(f"wrote {out}: {len(pushed)} stack(s) in {registry.name}")
    return 0
