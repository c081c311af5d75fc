"""`stackgate promote RUN_DIR|RUN_ID [--to production] [--dry-run]`, only after GO: the promoted
stacks' pylock.toml (with their wheels), the new production.toml (and its patch), the changelog,
and in the registry the promoted digest tagged `<repository>:<to>`, the one it replaces `:previous`
(tags only move: nothing is rebuilt or pushed again). `--rollback` moves `:<to>` back to
`:previous` and writes the production.toml that was in force then. Both are recorded in the history
with who, when and the run that proved the image."""

from __future__ import annotations

import getpass
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Protocol

from stackgate import artifacts, history, promotion
from stackgate.console import Console, Printer
from stackgate.errors import ConfigError
from stackgate.options import Options
from stackgate.report.data import now
from stackgate.rundir.layout import Promotion, RunDir
from stackgate.sources import read_pip_config


class Tags(Protocol):
    """The registry's tags, through the Docker engine (`engine.DockerEngine`)."""

    def resolve_tag(self, name: str, tag: str) -> str | None: ...
    def move_tag(self, ref: str, name: str, tag: str) -> str: ...


def _engine() -> Tags:
    from stackgate.backends.docker import registry_tags
    return registry_tags()


@dataclass(frozen=True)
class Target:
    """Where a promotion writes, and to which tag."""

    tag: str = "production"
    dry_run: bool = False


def who(env: Mapping[str, str]) -> str:
    return env.get("GITHUB_ACTOR") or env.get("USER") or getpass.getuser()


def run_dir_of(opts: Options, given: str) -> Path:
    path = Path(given)
    if path.is_dir():
        return path.absolute()
    named = RunDir.of(opts.reports, given).root
    if named.is_dir():
        return named
    raise ConfigError(f"{given}: no such run directory, and no run {given!r} under {opts.reports}",
                      hint="give reports/<run-id> or the run id; `stackgate history` lists them")


def promote(opts: Options, env: Mapping[str, str], given: str, target: Target = Target(), say: Printer | None = None,
            *, tags: Callable[[], Tags] = _engine) -> int:
    say = Console(say).say
    run_dir = run_dir_of(opts, given)
    report = promotion.read_report(run_dir)
    promotion.require_go(report, run_dir)
    stacks = promotion.promoted(report)
    run_id = report.run.id or run_dir.name
    when, by = now(), who(env)
    out = RunDir(run_dir).promotion
    registry = artifacts.configured(opts.registry, opts.repository, opts.config_dir)
    images = sorted({s.image for s in stacks if s.image})
    moves = _moves(images, registry, target.tag)
    old_production = opts.config_dir / "production.toml"
    new_production = promotion.production_toml(stacks, run_id, when)
    say(f"promote run {run_id} (GO): {', '.join(s.label for s in stacks)} -> {out.root}")
    for image, name, tag in moves:
        say(f"  tag {name}:{tag} -> {image} (the tag it replaces becomes {name}:previous)")
    if images and not moves:
        say("  no registry configured (--registry / [registry]): no tag is moved")
    if target.dry_run:
        say("dry run: nothing written, no tag moved")
        return 0
    out.root.mkdir(parents=True, exist_ok=True)
    host_pip = read_pip_config(env)
    links = [Path(link.removeprefix("file://")) for link in host_pip.find_links if not link.startswith("http")]
    index = promotion.wheel_index([*sorted((opts.cache_dir / "wheelhouse").glob("*")), *links])
    for stack in stacks:
        def download(pins: Sequence[str], to: Path, of: promotion.Promoted = stack) -> None:
            _download(pins, to, of, env)
        lock = promotion.pylock(stack, out.stack(stack.label), index, download)
        say(f"  wrote {lock} ({len(stack.packages)} packages, the tested wheels beside it)")
    # everything that is written is computed, and every tag read, before a tag moves
    previous_toml = old_production.read_text() if old_production.is_file() else ""
    engine = tags() if moves else None
    befores = [engine.resolve_tag(name, tag) if engine is not None else None for _, name, tag in moves]
    moved = [m for (image, name, tag), before in zip(moves, befores, strict=True)
             for m in ([f"{name}:previous"] if before and before != image else []) + [f"{name}:{tag}"]]
    step = partial(history.Promotion, at=when, who=by, action="promote", run_id=run_id, production_toml=new_production,
                   previous_toml=previous_toml, run_dir=str(run_dir))
    steps = [step(stack=",".join(s.label for s in stacks if s.image == image), image=image, tag=f"{name}:{tag}",
                  previous=before or "") for (image, name, tag), before in zip(moves, befores, strict=True)]
    if not steps:
        steps.append(step(stack=",".join(s.label for s in stacks), image="", tag="", previous=""))
    log = promotion.changelog(report, stacks, run_id, when, by, moved)
    out.production_toml.write_text(new_production)
    out.patch.write_text(promotion.patch(old_production, new_production))
    out.changelog.write_text(log)
    for (image, name, tag), before in zip(moves, befores, strict=True):
        assert engine is not None
        if before and before != image:
            engine.move_tag(before, name, "previous")
        engine.move_tag(image, name, tag)
    history.record_promotion(opts.history, steps)
    say(f"  wrote {out.production_toml} (and its patch against {old_production}) and {out.changelog}")
    for tag in moved:
        say(f"  moved {tag}")
    return 0


def rollback(opts: Options, env: Mapping[str, str], target: Target = Target(), say: Printer | None = None,
             *, tags: Callable[[], Tags] = _engine) -> int:
    """`:<to>` back to `:previous`, and the production.toml in force before the last promotion."""
    say = Console(say).say
    done = [p for p in history.promotions(opts.history) if p.action == "promote"]
    if not done:
        raise ConfigError(f"no promotion recorded in {opts.history}: nothing to roll back",
                          hint="`stackgate promote RUN` records each promotion there")
    last = done[-1]
    registry = artifacts.configured(opts.registry, opts.repository, opts.config_dir)
    when, by = now(), who(env)
    out = Promotion(opts.reports / f"rollback-{when.replace(':', '').replace('-', '')[:15]}")
    name = registry.name if registry else ""
    say(f"roll back the promotion of run {last.run_id} ({last.stack}, {last.at} by {last.who})")
    if target.dry_run:
        say(f"dry run: would move {name}:{target.tag} back to {name}:previous and write {out.production_toml}")
        return 0
    back = ""
    if registry is not None:
        engine = tags()
        back = engine.resolve_tag(name, "previous") or ""
        if not back:
            raise ConfigError(f"{name}:previous does not exist: there is no earlier production image to go back to")
        engine.move_tag(back, name, target.tag)
        say(f"  moved {name}:{target.tag} -> {back}")
    out.root.mkdir(parents=True, exist_ok=True)
    out.production_toml.write_text(last.previous_toml)
    history.record_promotion(opts.history, [history.Promotion(
        at=when, who=by, action="rollback", run_id=last.run_id, stack=last.stack, image=back,
        tag=f"{name}:{target.tag}" if name else "", previous=last.image, production_toml=last.previous_toml,
        previous_toml=last.production_toml, run_dir=last.run_dir)])
    say(f"  wrote {out.production_toml} (the production.toml before run {last.run_id} was promoted)")
    return 0


def _moves(images: Sequence[str], registry: artifacts.Registry | None, tag: str) -> list[tuple[str, str, str]]:
    """(image, name, tag) for the promoted image in the run's registry: one `:<tag>` names one image, so a
    run that promotes several images of one repository is refused (exit 2) rather than guessed at."""
    if registry is None:
        return []
    mine = [i for i in images if i.split("@", 1)[0] == registry.name]
    if len(mine) > 1:
        raise ConfigError(f"the run promotes {len(mine)} images of {registry.name}: one `:{tag}` tag cannot name them all",
                          hint="promote a run of one stack per repository, or give each stack its own --repository")
    return [(i, registry.name, tag) for i in mine]


def _download(pins: Sequence[str], to: Path, stack: promotion.Promoted, env: Mapping[str, str]) -> None:
    """The exact versions the run's caches do not hold, fetched once as wheels (no dependencies)."""
    from stackgate.backends.docker import download_wheels
    download_wheels(pins, to, stack.python, env)
