"""The `stackgate` command. One catch site: every StackgateError becomes its exit code here."""

from __future__ import annotations

import argparse
import errno
import json
import os
import signal
import sys
import threading
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from stackgate import __version__, fleet, options
from stackgate.errors import ConfigError, ExitCode, InfraError, Interrupted, StackgateError, disk_full


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stackgate", description="GO / NO-GO for ML stack upgrades")
    parser.add_argument("--version", action="version", version=f"stackgate {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a matrix and decide")
    options.add_arguments(run, "run")
    run.add_argument("--dry-run", action="store_true", help="print what each cell would run (with --launcher slurm: "
                                                            "the job scripts) and exit; nothing is built or written")

    bld = sub.add_parser("build", help="build every stack of the matrix once as an image; with --push, push each "
                                       "and write stacks.json (stack -> image by digest) for the pool runners")
    options.add_arguments(bld, "build")
    bld.add_argument("--push", action="store_true", help="push each stack image to the registry and write stacks.json")

    pro = sub.add_parser("promote", help="after GO: pylock.toml, production.toml (by digest), a changelog, and the "
                                         "registry's :production tag moved to the tested image; --rollback undoes it")
    pro.add_argument("run", nargs="?", metavar="RUN_DIR|RUN_ID", help="the GO run to promote")
    pro.add_argument("--to", default="production", metavar="TAG", help="the registry tag to move (default production)")
    pro.add_argument("--dry-run", action="store_true", help="say what would be written and moved; do nothing")
    pro.add_argument("--rollback", action="store_true", help="move the tag back to :previous and write the "
                                                            "production.toml in force before the last promotion")
    options.add_arguments(pro, "promote")

    wa = sub.add_parser("watch", help="re-check production (the last promotion): new advisories, outdated allow-list "
                                      "entries, and whether its rollback still exists; exit 1 on findings")
    options.add_arguments(wa, "run")  # the canary's options: --matrix, --pool, --suite, --backend, --profile, ...
    wa.add_argument("--no-canary", action="store_true", help="skip the canary run of production (the drift check)")

    mg = sub.add_parser("merge", help="one verdict over the bundles (run directories) of a fleet run")
    mg.add_argument("bundles", nargs="+", metavar="BUNDLE", help="run directories written by `stackgate run --pool`")
    mg.add_argument("--out", metavar="DIR", help="write the merged run here (default reports/<run-id>)")
    options.add_arguments(mg, "merge")

    cal = sub.add_parser("calibrate", help="A/A runs of production: this runner's noise per gated metric, "
                                           "and the tolerance and repeats a target change needs")
    options.add_arguments(cal, "run")
    options.add_arguments(cal, "calibrate")

    bis = sub.add_parser("bisect", help="the first bad nightly between a good and a bad one (binary search by date)")
    bis.add_argument("--good", metavar="VERSION", help="a nightly that passes, e.g. 2.15.0.dev20261120")
    bis.add_argument("--bad", metavar="VERSION", help="a later nightly that fails")
    options.add_arguments(bis, "run")  # --matrix, --only, --test, --find-links, ...; --resume BISECT_ID continues

    ci = sub.add_parser("ci", help="CI workflows").add_subparsers(dest="ci_command", required=True)
    gh = ci.add_parser("github", help="write .github/workflows/{nightly,upgrade-gate}.yml from matrix/fleet.toml")
    gh.add_argument("--config-dir", help="default: matrix (in this directory), else the bundled data")
    gh.add_argument("--out", default=".github/workflows", help="directory to write (default .github/workflows)")
    gh.add_argument("--check", action="store_true", help="write nothing; exit 1 if the files differ from generated")

    comp = sub.add_parser("compat", help="compatibility rules").add_subparsers(dest="compat_command", required=True)
    check = comp.add_parser("check", help="can this driver run this CUDA build of this torch?")
    check.add_argument("--driver", help="NVIDIA driver version (omit for a CPU runner)")
    check.add_argument("--cuda", required=True, help="CUDA version or variant: 13.0, cu130, cpu")
    check.add_argument("--torch", required=True)
    check.add_argument("--python")
    check.add_argument("--gpu-class", default="datacenter", choices=["datacenter", "consumer", "none"])
    check.add_argument("--compat-package", action="store_true", help="the image carries cuda-compat")
    check.add_argument("--compat-file", help="compatibility table (default: the bundled compat.toml)")
    check.add_argument("--json", action="store_true")
    refresh = comp.add_parser("refresh", help="derive each torch release's CUDA variants, Pythons and PyPI default "
                                              "from wheel indexes; exit 1 when compat.toml differs")
    refresh.add_argument("--index", action="append", required=True, metavar="URL",
                         help="a PEP 503 index root (https://pypi.org/simple, https://download.pytorch.org/whl, "
                              "file://DIR; repeatable: the rows are the union)")
    refresh.add_argument("--compat-file", help="compatibility table (default: the bundled compat.toml)")
    refresh.add_argument("--series", action="append", default=[], metavar="X.Y",
                         help="only these release series (default: every one the indexes list)")
    refresh.add_argument("--write", action="store_true", help="rewrite the rows that differ in --compat-file")

    mx = sub.add_parser("matrix", help="matrix tools").add_subparsers(dest="matrix_command", required=True)
    show = mx.add_parser("show", help="print the expanded matrix with reasons")
    show.add_argument("file", nargs="?", help="matrix file or bundled name (default: the bundled upgrade.toml)")
    options.add_arguments(show, "matrix show")  # --matrix (as the file), --config-dir, --candidate, --only
    show.add_argument("--json", action="store_true")

    hist = sub.add_parser("history", help="list past runs")
    options.add_arguments(hist, "history")  # --history
    hist.add_argument("--limit", type=int, default=20)
    hist.add_argument("--matrix")
    hist.add_argument("--json", action="store_true")
    hist.add_argument("--last-green", action="store_true",
                      help="print the last green nightly (and the first red one after it); exit 1 when there is none")

    base = sub.add_parser("base-image", help="bootstrap the local Debian base image (debootstrap + docker import)")
    base.add_argument("--tag", default="stackgate/base:bookworm")
    options.add_arguments(base, "base-image")  # --debian-mirror
    base.add_argument("--mirror", dest="debian_mirror", default=None, help="the same as --debian-mirror")
    base.add_argument("--force", action="store_true", help="rebuild even if the tag exists")

    prune = sub.add_parser("prune", help="remove old stack images (keeps the newest per stack) and build stages")
    prune.add_argument("--keep", type=int, default=1, help="images to keep per stack label")
    prune.add_argument("--dry-run", action="store_true")

    st = sub.add_parser("selftest", help="inject known faults and check the gate catches each")
    st.add_argument("--json", action="store_true")
    return parser


def _raise_interrupted(signum: int, _frame: object) -> None:
    raise Interrupted(signum)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    reconfigure = getattr(sys.stdout, "reconfigure", None)
    if reconfigure is not None:  # a pipe under nox and CI: every progress line as it is printed, not per 8 KiB
        reconfigure(line_buffering=True)
    previous = None
    if threading.current_thread() is threading.main_thread():  # SIGTERM (a CI cancel) unwinds like Ctrl-C
        previous = signal.signal(signal.SIGTERM, _raise_interrupted)
    try:
        return _dispatch(args)
    except StackgateError as exc:
        print(exc.render(), file=sys.stderr)
        return int(exc.exit_code)
    except KeyboardInterrupt as exc:
        code = exc.exit_code if isinstance(exc, Interrupted) else 128 + signal.SIGINT
        print(f"interrupted (exit {code}); results written so far are kept", file=sys.stderr)
        return code
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            print(disk_full(exc.filename or ".", exc).render(), file=sys.stderr)
        else:
            print(f"error: {exc}", file=sys.stderr)
        return int(ExitCode.INFRA)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "run":
        from stackgate.commands.dry_run import dry_run
        from stackgate.commands.run import run
        cli = {k: v for k, v in vars(args).items() if k not in ("command", "dry_run")}
        opts = options.read(cli, os.environ, Path("stackgate.toml"))
        if args.dry_run:
            return dry_run(opts, dict(os.environ))
        return run(opts, dict(os.environ))
    if args.command == "build":
        from stackgate.commands.build import build
        cli = {k: v for k, v in vars(args).items() if k not in ("command", "push")}
        return build(options.read(cli, os.environ, Path("stackgate.toml")), dict(os.environ), push=args.push)
    if args.command == "promote":
        from stackgate.commands import promote
        cli = {k: v for k, v in vars(args).items() if k not in ("command", "run", "to", "dry_run", "rollback")}
        opts = options.read(cli, os.environ, Path("stackgate.toml"))
        target = promote.Target(tag=args.to, dry_run=args.dry_run)
        if args.rollback:
            return promote.rollback(opts, dict(os.environ), target)
        if not args.run:
            raise ConfigError("stackgate promote needs the GO run to promote (RUN_DIR or RUN_ID), or --rollback")
        return promote.promote(opts, dict(os.environ), args.run, target)
    if args.command == "watch":
        from stackgate.commands.watch import run_canary, watch
        opts = options.read({k: v for k, v in vars(args).items() if k not in ("command", "no_canary")}, os.environ,
                            Path("stackgate.toml"))
        if opts.sources.get("profile", "default") == "default":  # the canary is short unless told otherwise
            opts = replace(opts, profile="quick", sources={**opts.sources, "profile": "watch's default"})
        return watch(opts, dict(os.environ), canary=None if args.no_canary else run_canary)
    if args.command == "merge":
        from stackgate.commands.merge import merge
        cli = {k: v for k, v in vars(args).items() if k not in ("command", "bundles", "out")}
        if args.out:
            out = Path(args.out).absolute()
            cli.update(reports=str(out.parent), run_id=out.name)
        opts = options.read(cli, os.environ, Path("stackgate.toml"))
        return merge(opts, dict(os.environ), [Path(b).absolute() for b in args.bundles])
    if args.command == "bisect":
        from stackgate.commands import bisect
        cli = {k: v for k, v in vars(args).items() if k not in ("command", "good", "bad", "resume")}
        opts = options.read({**cli, "matrix": cli.get("matrix") or "nightly"}, os.environ, Path("stackgate.toml"))
        return bisect.run(opts, dict(os.environ), good=args.good, bad=args.bad, resume=args.resume)
    if args.command == "calibrate":
        from stackgate.commands.calibrate import calibrate
        opts = options.read({k: v for k, v in vars(args).items() if k != "command"}, os.environ, Path("stackgate.toml"))
        allow = opts.target / 5 if opts.allow is None else opts.allow
        return calibrate(opts, dict(os.environ), runs=opts.runs, target=opts.target, allow=allow)
    if args.command == "ci":
        return _ci_github(args)
    if args.command == "compat":
        return _compat_refresh(args) if args.compat_command == "refresh" else _compat_check(args)
    if args.command == "matrix":
        return _matrix_show(args)
    if args.command == "history":
        return _history(args)
    if args.command == "prune":
        return _prune(args)
    if args.command == "base-image":
        return _base_image(args)
    if args.command == "selftest":
        from stackgate import selftest
        return selftest.main(as_json=args.json)
    raise AssertionError(args.command)  # pragma: no cover - argparse enforces the choices


def _compat_refresh(args: argparse.Namespace) -> int:
    from stackgate import compat, compat_refresh
    from stackgate.shipped import MATRIX_DIR
    path = Path(args.compat_file).absolute() if args.compat_file else MATRIX_DIR / "compat.toml"
    table = compat.load_compat(path)
    rows = compat_refresh.derive(compat_refresh.list_torch_wheels(args.index), args.series)
    changed = compat_refresh.differences(table, rows)
    for row in rows.values():
        print(row.toml())
    if not changed:
        print(f"{path}: agrees with the index(es) for {', '.join(rows) or 'no release'}")
        return 0
    print(f"{path} differs from the index(es):")
    for line in changed:
        print(f"  - {line}")
    if args.write:
        path.write_text(compat_refresh.rewrite(path.read_text(), {k: rows[k] for k in rows
                                                                  if any(f'"{k}"' in c for c in changed)}))
        compat.load_compat(path)  # what was written must load
        print(f"wrote {path}")
        return 0
    print("rerun with --write to rewrite those rows")
    return 1


def _compat_check(args: argparse.Namespace) -> int:
    from stackgate import compat
    from stackgate.shipped import MATRIX_DIR
    table = compat.load_compat(Path(args.compat_file).absolute() if args.compat_file else MATRIX_DIR / "compat.toml")
    result = compat.check_strings(table, torch=args.torch, cuda=args.cuda, driver=args.driver, python=args.python,
                                  gpu_class=args.gpu_class, compat_package=args.compat_package)
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        what = f"torch {args.torch} / CUDA {args.cuda} on driver {args.driver or 'none (CPU)'} ({args.gpu_class})"
        print(f"{'compatible' if result.ok else 'NOT compatible'}: {what}")
        for o in result.outcomes:
            print(f"  [{'ok' if o.ok else 'FAIL'}] {o.rule}: {o.detail}")
    return 0 if result.ok else 1


def _matrix_show(args: argparse.Namespace) -> int:
    from stackgate import inputs
    cli = {k: v for k, v in vars(args).items() if k not in ("command", "matrix_command", "file", "json")}
    opts = options.read({**cli, "matrix": args.file or args.matrix}, os.environ, Path("stackgate.toml"))
    exp = inputs.select(opts, inputs.load(opts, dict(os.environ), fleet.detect_local()), shard=False)
    if args.json:
        print(json.dumps(render_matrix_json(exp), indent=2))
        return 0
    print(render_matrix_text(exp))
    return 0


def render_matrix_json(exp: object) -> dict[str, object]:
    from stackgate.matrix import Expansion
    assert isinstance(exp, Expansion)
    return {
        "cells": [c.to_json() for c in exp.cells],
        "not_run_here": [{**n.cell.to_json(), "reason": n.reason} for n in exp.not_here],
        "pruned": [{**p.cell.to_json(), "reasons": list(p.reasons)} for p in exp.pruned],
    }


def render_matrix_text(exp: object) -> str:
    from stackgate.matrix import Expansion
    assert isinstance(exp, Expansion)
    lines = [f"{'cell':60} {'role':10} {'req':4} status"]
    for c in exp.cells:
        lines.append(f"{c.id:60} {c.role.value:10} {'yes' if c.required else 'no':4} runs here")
    for n in exp.not_here:
        lines.append(f"{n.cell.id:60} {n.cell.role.value:10} {'yes' if n.cell.required else 'no':4} not run here: "
                     f"{n.reason}")
    for p in exp.pruned:
        lines.append(f"{p.cell.id:60} {p.cell.role.value:10} {'-':4} pruned: {'; '.join(p.reasons)}")
    return "\n".join(lines)


def _history(args: argparse.Namespace) -> int:
    """`stackgate history`: a database that cannot be read is exit 3 with what it is, never a traceback
    (nor exit 1, which `--last-green` uses for "no green nightly")."""
    import sqlite3
    path = options.read({"history": args.history}, os.environ, Path("stackgate.toml")).history
    try:
        return _history_rows(args, path)
    except sqlite3.Error as exc:
        raise InfraError(f"cannot read the history database {path}: {exc}",
                         hint="is it a stackgate history (reports/history.sqlite)? pass --history PATH, or move the "
                              "file aside and a new one is started by the next run") from None


def _history_rows(args: argparse.Namespace, path: Path) -> int:
    from stackgate import history
    if args.last_green:
        return _last_green(path, args.matrix, args.json)
    skipped: list[str] = []
    rows = history.runs(path, args.limit, args.matrix, skipped)
    _say_skipped(path, skipped)
    if args.json:
        print(json.dumps([r.__dict__ for r in rows], indent=2))
        return 0
    if not rows:
        print(f"no runs recorded in {path}")
        return 0
    print(f"{'run':45} {'matrix':15} {'channel':8} {'decision':13} candidate")
    for r in rows:
        print(f"{r.run_id:45} {r.matrix:15} {r.channel:8} {r.decision:13} {r.candidate}")
    return 0


def _say_skipped(path: Path, skipped: list[str]) -> None:
    """Rows of the history that are not what stackgate writes (NULL, a BLOB, text where a number
    belongs): left out, and named on stderr."""
    if skipped:
        print(f"warning: {len(skipped)} row(s) of {path} are not stackgate's and were skipped: "
              + "; ".join(skipped[:5]), file=sys.stderr)


def _last_green(path: Path, matrix: str | None, as_json: bool) -> int:
    """`stackgate history --last-green`: the version on the first line, so a pipeline can pin it."""
    from stackgate import history
    skipped: list[str] = []
    green, red = history.standing(history.nightlies(path, matrix, skipped))
    _say_skipped(path, skipped)
    if as_json:
        print(json.dumps({"last_green": green.__dict__ if green else None,
                          "first_red_after": red.__dict__ if red else None}, indent=2))
        return 0 if green else 1
    if green is None:
        print(f"no green nightly recorded in {path}" + (f" for matrix {matrix}" if matrix else ""))
        return 1
    print(green.version)
    print(f"  last green: {green.version} (run {green.run_id}, {green.decision}, {green.finished})")
    if red is not None:
        print(f"  first red after it: {red.version} (run {red.run_id}, {red.decision}, {red.finished})")
    return 0


def _base_image(args: argparse.Namespace) -> int:
    from stackgate.backends import docker
    opts = options.read({"debian_mirror": args.debian_mirror}, os.environ, Path("stackgate.toml"))
    return docker.base_image(args.tag, mirror=opts.debian_mirror, force=args.force)


def _prune(args: argparse.Namespace) -> int:
    from stackgate.backends import docker
    return docker.prune(keep=args.keep, dry_run=args.dry_run)


def _ci_github(args: argparse.Namespace) -> int:
    from stackgate import artifacts, ci, matrix
    from stackgate.shipped import MATRIX_DIR
    cfg = Path(args.config_dir).absolute() if args.config_dir else (
        Path("matrix").absolute() if Path("matrix", "fleet.toml").is_file() else MATRIX_DIR)
    pools = fleet.load_pools(cfg / "fleet.toml", fleet.LocalHost())
    pools_of = {f"matrix/{name}.toml": ci.pools_for(matrix.load_matrix(cfg / f"{name}.toml").pools, pools)
                for name in ("nightly", "upgrade")}
    out = Path(args.out)
    stale = []
    has_registry = artifacts.from_toml(cfg / "fleet.toml")[0] is not None
    for filename, text in ci.workflows(pools_of, registry=has_registry).items():
        target = out / filename
        if args.check:
            if not target.is_file() or target.read_text() != text:
                stale.append(str(target))
            continue
        out.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        print(f"wrote {target}")
    if stale:
        print(f"out of date (run `stackgate ci github`): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0
