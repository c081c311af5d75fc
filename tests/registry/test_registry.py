"""Issue 21's registry acceptance, for real: a real registry (Debian's docker-registry), the real
engine and the CLI as a user types it, from a project directory with relative paths.

A fleet of two pools on one machine: `stackgate build --push` once, every local copy of the stack
image removed, then each pool's runner pulls the stack by digest (and builds nothing), and the merge
of the two bundles says GO; a bundle edited to name another digest is refused. With the htpasswd
registry: a push without `docker login` is an infrastructure error that says so; after it, the
password is in no layer, report, log or bundle. The small CPU stack (2.13.0+cpu, ~1.4 GB) keeps the
round trips cheap."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

from stackgate import history
from stackgate.backends.docker.engine import DockerEngine
from stackgate.shipped import MATRIX_DIR
from tests.matrices import one_cpu_stack
from tests.registry.conftest import Registries

pytestmark = [pytest.mark.docker, pytest.mark.registry]
ROOT = Path(__file__).resolve().parents[2]
MATRIX = one_cpu_stack("fleet-test", ["cpu-a", "cpu-b"], "1x2")
POOLS = """
[pool.cpu-a]
gpu_class = "none"
nodes = 1

[pool.cpu-b]
gpu_class = "none"
nodes = 1
"""
COMMON = ("--matrix", "cfg/fleet-test.toml", "--config-dir", "cfg", "--suite", "suite", "--no-platform-checks")


def _project(tmp_path: Path, registry: str, repository: str) -> None:
    shutil.copytree(MATRIX_DIR, tmp_path / "cfg")
    (tmp_path / "cfg" / "fleet.toml").write_text(f'[registry]\nurl = "{registry}"\nrepository = "{repository}"\n'
                                                 + POOLS)
    (tmp_path / "cfg" / "fleet-test.toml").write_text(MATRIX)
    shutil.copytree(ROOT / "tests" / "data" / "plain_suite", tmp_path / "suite")


def _stackgate(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "stackgate", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=1800, check=False)
    print(f"$ stackgate {' '.join(args)}  -> exit {proc.returncode}\n{proc.stdout[-4000:]}{proc.stderr[-3000:]}")
    return proc


def _forget(engine: DockerEngine, ref: str) -> list[str]:
    """Remove every local name of the image `ref` (its local tags, registry tags and digests): after
    this the engine has to pull it. Returns the local stackgate tags, to restore the cache after."""
    import docker
    image = engine.client.images.get(ref)
    local = [t for t in image.tags if t.startswith("stackgate/stack:")]
    for name in [*image.tags, *image.attrs.get("RepoDigests", [])]:
        with contextlib.suppress(docker.errors.ImageNotFound):  # (the last tag took the image with it)
            engine.client.images.remove(name)
    assert engine.facts(ref) is None
    return local


def _restore(engine: DockerEngine, ref: str, tags: list[str]) -> None:
    """The pulled image is the same image (same id): tag it back for the tiers after this one."""
    image = engine.client.images.get(ref)
    for tag in tags:
        image.tag(*tag.split(":", 1))


def test_two_pools_pull_the_stack_by_digest_build_nothing_and_merge_to_go(
        tmp_path: Path, registries: Registries, engine: DockerEngine) -> None:
    _project(tmp_path, registries.plain, "stackgate-test/fleet")
    built = _stackgate(tmp_path, "build", "--push", "--matrix", "cfg/fleet-test.toml", "--config-dir", "cfg")
    assert built.returncode == 0
    stacks = json.loads((tmp_path / "stacks.json").read_text())["stacks"]
    [image] = {s["image"] for s in stacks.values()}  # production and candidate: the same 2.13.0+cpu image
    assert re.fullmatch(rf"{re.escape(registries.plain)}/stackgate-test/fleet@sha256:[0-9a-f]{{64}}", image)
    again = _stackgate(tmp_path, "build", "--push", "--matrix", "cfg/fleet-test.toml", "--config-dir", "cfg")
    assert again.returncode == 0 and "building image" not in again.stdout  # unchanged: a no-op
    assert json.loads((tmp_path / "stacks.json").read_text())["stacks"] == stacks

    local = _forget(engine, image)
    try:
        logs = {}
        for pool in ("a", "b"):
            ran = _stackgate(tmp_path, "run", "--pool", f"cpu-{pool}", "--stacks", "stacks.json", *COMMON,
                             "--reports", f"r{pool}", "--run-id", pool)
            assert ran.returncode == 1  # alone, a pool cannot be GO: the other pool's required cells did not run
            assert "building image" not in ran.stdout and "resolving wheels" not in ran.stdout
            logs[pool] = ran.stdout
        assert f"pulling {image} (by digest)" in logs["a"] and f"{image} is already here (by digest)" in logs["b"]
        for pool in ("a", "b"):
            manifest = json.loads((tmp_path / f"r{pool}" / pool / "run.json").read_text())
            assert manifest["stacks"] and all(v == [image] for v in manifest["stacks"].values())
        merged = _stackgate(tmp_path, "merge", "ra/a", "rb/b", "--out", "merged/ab", *COMMON)
        assert merged.returncode == 0 and "GO (gating verdict GO, exit 0)" in merged.stdout
        report = json.loads((tmp_path / "merged" / "ab" / "report.json").read_text())
        assert {r["image"] for r in report["stack_images"]} == {image}
        assert image in (tmp_path / "merged" / "ab" / "report.md").read_text()

        _promote_and_roll_back(tmp_path, engine, image, f"{registries.plain}/stackgate-test/fleet")

        # a bundle that says it ran another digest of the stack is refused, naming stack and bundles
        other = image[:-64] + ("0" * 64 if not image.endswith("0" * 64) else "1" * 64)
        shutil.copytree(tmp_path / "rb" / "b", tmp_path / "rb" / "b-edited")
        for name in ("run.json", "results.jsonl"):
            path = tmp_path / "rb" / "b-edited" / name
            path.write_text(path.read_text().replace(image, other))
        refused = _stackgate(tmp_path, "merge", "ra/a", "rb/b-edited", "--out", "merged/edited", *COMMON)
        assert refused.returncode == 2 and "ran as different images" in refused.stderr
        assert other in refused.stderr and "rb/b-edited" in refused.stderr
    finally:
        if engine.facts(image) is None:
            engine.pull(image, None)
        _restore(engine, image, local)


def _canonical(freeze: str) -> list[str]:
    return sorted(f"{canonicalize_name(n)}=={v}" for n, _, v in (line.partition("==") for line in freeze.split()))


def _promote_and_roll_back(tmp_path: Path, engine: DockerEngine, image: str, name: str) -> None:
    """`stackgate promote` of the merged GO run: the tested digest becomes `:production`, the one it
    replaces `:previous`; its pylock.toml reproduces the tested freeze offline; `--rollback` moves
    `:production` back; a run that is not GO is refused (exit 2). Each step is in the history."""
    old = tmp_path / "old-production"  # what production was before: a tiny image of its own
    old.mkdir()
    (old / "README").write_text("the production stack before this promotion\n")
    engine.import_rootfs(old, "stackgate-test/old:1")
    before = engine.move_tag("stackgate-test/old:1", name, "production")
    assert before != image

    refused = _stackgate(tmp_path, "promote", "ra/a", "--config-dir", "cfg")  # one pool alone: INCONCLUSIVE
    assert refused.returncode == 2 and "not GO: only a GO run is promoted" in refused.stderr
    dry = _stackgate(tmp_path, "promote", "merged/ab", "--config-dir", "cfg", "--dry-run")
    assert dry.returncode == 0 and not (tmp_path / "merged" / "ab" / "promotion").exists()
    assert engine.resolve_tag(name, "production") == before

    promoted = _stackgate(tmp_path, "promote", "merged/ab", "--config-dir", "cfg")
    assert promoted.returncode == 0
    assert engine.resolve_tag(name, "production") == image and engine.resolve_tag(name, "previous") == before
    out = tmp_path / "merged" / "ab" / "promotion"
    production = (out / "production.toml").read_text()
    assert image in production and 'run = "ab"' in production and 'torch = "2.13.0"' in production
    assert image in (out / "CHANGELOG.md").read_text() and (out / "production.toml.patch").read_text().startswith("---")
    report = json.loads((tmp_path / "merged" / "ab" / "report.json").read_text())
    [tested] = {tuple(c["environment"]["stack_packages"]) for c in report["cells"] if c["role"] == "candidate"}
    subprocess.run([sys.executable, "-m", "uv", "venv", "-q", "--python", "3.11", "fresh"], cwd=tmp_path, check=True)
    synced = subprocess.run([sys.executable, "-m", "uv", "pip", "sync", "--offline", "--python", "fresh/bin/python",
                             str(out / "cpu-torch2.13.0-py3.11" / "pylock.toml")], cwd=tmp_path, capture_output=True,
                            text=True, check=False)
    assert synced.returncode == 0, synced.stderr
    freeze = subprocess.run([sys.executable, "-m", "uv", "pip", "freeze", "--python", "fresh/bin/python"], cwd=tmp_path,
                            capture_output=True, text=True, check=True).stdout
    assert _canonical(freeze) == _canonical("\n".join(tested))  # the tested environment, exactly

    _watch_the_rollback(tmp_path, engine, name, before)
    back = _stackgate(tmp_path, "promote", "--rollback", "--config-dir", "cfg")
    assert back.returncode == 0 and engine.resolve_tag(name, "production") == before
    [rolled] = list((tmp_path / "reports").glob("rollback-*/production.toml"))
    assert rolled.read_text() == (tmp_path / "cfg" / "production.toml").read_text()
    steps = history.promotions(tmp_path / "reports" / "history.sqlite")
    assert [(p.action, p.run_id, p.image) for p in steps] == [("promote", "ab", image), ("rollback", "ab", before)]
    assert all(p.who and p.at for p in steps)


def _watch_the_rollback(tmp_path: Path, engine: DockerEngine, name: str, before: str) -> None:
    """#44: `stackgate watch` after the promotion finds `:production` and `:previous` where the history
    says (one manifest request each); with `:previous` deleted from the registry, the rollback check
    names it and what to re-push; pushed again, the rollback below goes on as promoted."""
    import urllib.request

    def watched() -> dict[str, dict[str, object]]:
        done = _stackgate(tmp_path, "watch", "--config-dir", "cfg", "--vuln-db", str(ROOT / "tests" / "data" / "osv"),
                          "--no-canary")  # the rollback is the subject here; tests/unit/test_watch.py has the canary
        assert done.returncode in (0, 1), done.stderr  # advisories of the image's Debian packages may be found
        [report] = list((tmp_path / "reports").glob("watch-*/watch.json"))
        checks = {c["name"]: c for c in json.loads(report.read_text())["checks"]}
        shutil.rmtree(report.parent)
        return checks

    checks = watched()
    assert checks["advisories"]["state"] in ("clean", "findings") and checks["allow-list"]["state"] == "clean"
    assert checks["rollback"]["state"] == "clean", checks["rollback"]
    host, _, repository = name.partition("/")
    digest = before.rpartition("@")[2]
    request = urllib.request.Request(f"http://{host}/v2/{repository}/manifests/{digest}", method="DELETE")
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert answer.status == 202
    assert engine.manifest_digest(name, "previous") is None
    checks = watched()
    [gone] = checks["rollback"]["findings"]
    assert gone["subject"] == f"{name}:previous" and gone["fix"] == f"re-push {before} as {name}:previous"
    assert engine.move_tag("stackgate-test/old:1", name, "previous") == before  # the same manifest again
    assert watched()["rollback"]["state"] == "clean"


def _grep_stream(chunks: object, secret: bytes) -> bool:
    tail = b""
    for chunk in chunks:  # type: ignore[attr-defined]
        if secret in tail + chunk:
            return True
        tail = chunk[-len(secret):]
    return False


def test_with_an_htpasswd_registry_no_credential_reaches_a_layer_report_log_or_bundle(
        tmp_path: Path, registries: Registries, engine: DockerEngine) -> None:
    _project(tmp_path, registries.auth, "stackgate-test/secret")
    subprocess.run(["docker", "logout", registries.auth], capture_output=True, check=False)
    refused = _stackgate(tmp_path, "build", "--push", "--matrix", "cfg/fleet-test.toml", "--config-dir", "cfg")
    assert refused.returncode == 3 and f"docker login {registries.auth}" in refused.stderr
    login = subprocess.run(["docker", "login", registries.auth, "-u", registries.user, "--password-stdin"],
                           input=registries.password, capture_output=True, text=True, check=False)
    assert login.returncode == 0, login.stderr
    try:
        built = _stackgate(tmp_path, "build", "--push", "--matrix", "cfg/fleet-test.toml", "--config-dir", "cfg")
        assert built.returncode == 0
        [image] = {s["image"] for s in json.loads((tmp_path / "stacks.json").read_text())["stacks"].values()}
        ran = _stackgate(tmp_path, "run", "--pool", "cpu-a", "--stacks", "stacks.json", *COMMON, "--reports", "r",
                         "--run-id", "a")
        assert ran.returncode == 1
        secret = registries.password.encode()
        for text in (built.stdout, built.stderr, ran.stdout, ran.stderr):
            assert registries.password not in text
        for path in tmp_path.rglob("*"):  # reports, bundle, build logs, stacks.json
            if path.is_file():
                assert secret not in path.read_bytes(), path
        history = subprocess.run(["docker", "history", "--no-trunc", image], capture_output=True, text=True,
                                 check=True).stdout
        inspect = subprocess.run(["docker", "inspect", image], capture_output=True, text=True, check=True).stdout
        assert registries.password not in history and registries.password not in inspect
        assert not _grep_stream(engine.client.images.get(image).save(chunk_size=1 << 20), secret)  # every layer
    finally:
        subprocess.run(["docker", "logout", registries.auth], capture_output=True, check=False)
