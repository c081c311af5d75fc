"""Matrix model: load production and a matrix file; expand to cells over the fleet's pools (`fleet`);
prune; select. Pure functions over parsed data."""

from __future__ import annotations

import difflib
import fnmatch
import itertools
import platform
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from packaging.version import Version

from stackgate import compat as compat_mod
from stackgate import fleet, tomlfile
from stackgate import sources as sources_mod
from stackgate.boundary.matrix import ExcludeRow, IncludeRow, MatrixFile, ProductionFile
from stackgate.errors import ConfigError
from stackgate.given import Declared, Probed, declared_stacks
from stackgate.model import (
    Cell,
    NotHere,
    Pruned,
    Role,
    RunnerPool,
    Stack,
    Topology,
    WheelSource,
)
from stackgate.versions import CudaVariant, parse_python, parse_torch

DEFAULT_VARIANT = "default"  # a cuda axis value: the release's PyPI default build (compat.toml pypi_default)
_TOPOLOGY = re.compile(r"^([0-9]+)x([0-9]+)$")


@dataclass(frozen=True)
class AxisSet:
    cuda: tuple[CudaVariant, ...]
    topology: tuple[str, ...]
    release_default: bool = False  # cuda = ["default"]: each torch release's PyPI default variant (compat.toml)

    def variants(self, torch: Version, table: compat_mod.CompatTable) -> tuple[CudaVariant, ...]:
        """The CUDA variants of this axis for one torch release."""
        release = table.release(torch)
        extra = (release.pypi_default,) if self.release_default and release and release.pypi_default else ()
        return tuple(dict.fromkeys((*self.cuda, *extra)))


@dataclass(frozen=True)
class Rule:
    """An include or exclude row: field -> glob (excludes) or value (includes)."""

    fields: tuple[tuple[str, str], ...]
    line: int | None

    def get(self, key: str) -> str | None:
        return dict(self.fields).get(key)


@dataclass(frozen=True)
class Production:
    torch: Version
    python: str
    cuda: CudaVariant
    cpu_cuda: CudaVariant
    path: Path

    def stack_for(self, pool: RunnerPool, source: WheelSource) -> Stack:
        cuda = self.cuda if pool.has_gpu else self.cpu_cuda
        return Stack(torch=self.torch, cuda=cuda, python=self.python, source=source, channel="production")


@dataclass(frozen=True)
class MatrixSpec:
    path: Path
    name: str
    channel: str
    pools: tuple[str, ...]
    torch: tuple[str, ...]
    python: tuple[str, ...]
    gpu_axes: AxisSet
    cpu_axes: AxisSet
    required: tuple[str, ...]
    includes: tuple[Rule, ...]
    excludes: tuple[Rule, ...]
    source: WheelSource
    doc: tomlfile.Doc = field(repr=False, compare=False)
    fallback: str = ""  # nightly: "last-green" = run the last green nightly when the newest fails a guard
    stacks: tuple[Declared, ...] = ()  # [[stack]]: a candidate / production stack the team has (given.py)


@dataclass(frozen=True)
class Expansion:
    """The whole matrix: cells that can run here, cells for other pools, and pruned cells."""

    cells: tuple[Cell, ...]
    not_here: tuple[NotHere, ...]
    pruned: tuple[Pruned, ...]

    @property
    def all_cells(self) -> tuple[Cell, ...]:
        return self.cells + tuple(n.cell for n in self.not_here)


# ---------------------------------------------------------------------------------------------- load

def load_production(path: Path) -> Production:
    """production.toml (`boundary.matrix.ProductionFile`), its versions parsed at their lines."""
    doc = tomlfile.load(path)
    row = tomlfile.validate(doc, ProductionFile).production
    for label, image in row.images.items():
        if "@sha256:" not in image:  # the tested images, by digest
            raise doc.error(f"production image {label!r} must be named by digest (repo@sha256:...)", "production",
                            "images", label)
    return Production(
        torch=tomlfile.parsed(doc, parse_torch, row.torch, "production", "torch"),
        python=tomlfile.parsed(doc, parse_python, row.python, "production", "python"),
        cuda=tomlfile.parsed(doc, CudaVariant.parse, row.cuda, "production", "cuda"),
        cpu_cuda=tomlfile.parsed(doc, CudaVariant.parse, row.cpu.cuda, "production", "cpu", "cuda"),
        path=path,
    )


_RULE_KEYS = ("pool", "cuda", "torch", "python", "topology")


def load_matrix(path: Path) -> MatrixSpec:
    """A matrix file (`boundary.matrix.MatrixFile`), its versions and topologies parsed and
    range-checked at their lines."""
    doc = tomlfile.load(path)
    f = tomlfile.validate(doc, MatrixFile)
    m = f.matrix
    gpu = AxisSet(
        cuda=tuple(tomlfile.parsed(doc, CudaVariant.parse, v, "matrix", "cuda") for v in m.cuda if v != DEFAULT_VARIANT),
        topology=tuple(_topology_word(doc, t, "matrix") for t in m.topology),
        release_default=DEFAULT_VARIANT in m.cuda,
    )
    cpu_cuda = m.cpu.cuda if m.cpu.cuda is not None else m.cuda
    cpu = AxisSet(
        cuda=tuple(tomlfile.parsed(doc, CudaVariant.parse, v, "matrix", "cpu", "cuda")
                   for v in cpu_cuda if v != DEFAULT_VARIANT),
        topology=tuple(_topology_word(doc, t, "matrix", "cpu") for t in m.cpu.topology),
        release_default=DEFAULT_VARIANT in cpu_cuda,
    )
    for t in m.torch:
        if t != "nightly":
            tomlfile.parsed(doc, parse_torch, t, "matrix", "torch")
    includes = []
    for index, row in enumerate(f.include):  # its values are range-checked like the axes' (an exclude's are globs)
        _check_include(doc, row)
        includes.append(Rule(fields=_fields(row), line=doc.nth_header("include", index)))
    excludes = tuple(Rule(fields=_fields(row), line=doc.nth_header("exclude", index))
                     for index, row in enumerate(f.exclude))
    return MatrixSpec(
        path=path,
        name=m.name if m.name is not None else path.stem,
        channel=m.channel,
        pools=tuple(m.pools),
        torch=tuple(m.torch),
        python=tuple(tomlfile.parsed(doc, parse_python, p, "matrix", "python") for p in m.python),
        gpu_axes=gpu,
        cpu_axes=cpu,
        required=tuple(m.required),
        includes=tuple(includes),
        excludes=excludes,
        source=WheelSource(name=f.source.name, index_url=f.source.index_url,
                           extra_index_urls=tuple(f.source.extra_index_urls), find_links=tuple(f.source.find_links),
                           inherit_pip_config=f.source.inherit_pip_config, pre=f.source.pre),
        doc=doc,
        fallback=m.fallback,
        stacks=declared_stacks(doc, f.stack),
    )


def _fields(row: IncludeRow | ExcludeRow) -> tuple[tuple[str, str], ...]:
    return tuple((k, value) for k in _RULE_KEYS if (value := getattr(row, k)) is not None)


def _check_include(doc: tomlfile.Doc, row: IncludeRow) -> None:
    for key, parse in (("torch", parse_torch), ("cuda", CudaVariant.parse), ("python", parse_python)):
        value = getattr(row, key)
        if value is not None:
            tomlfile.parsed(doc, parse, value, "include", key)
    if row.topology is not None:
        _topology_word(doc, row.topology, "include")


def _topology_word(doc: tomlfile.Doc, word: str, *where: str) -> str:
    match = _TOPOLOGY.match(word)
    if match and not (max(len(match.group(1)), len(match.group(2))) <= 6 and 1 <= int(match.group(1)) <= fleet.MAX_NODES and 1 <= int(match.group(2)) <= fleet.MAX_PROCS_PER_NODE):
        raise doc.error(f"topology {word!r} needs at least one node and one process per node, and at most "
                        f"{fleet.MAX_NODES} nodes and {fleet.MAX_PROCS_PER_NODE} processes per node", *where, "topology",
                        hint="for example 1x2 or 2x8")
    if word in ("node", "pool") or match:
        return word
    raise doc.error(f"unknown topology {word!r}", *where, "topology", hint="use 'node', 'pool' or NODESxPROCS such as 2x2")


# -------------------------------------------------------------------------------------------- expand

def resolve_topology(word: str, pool: RunnerPool) -> Topology | str:
    """A topology for this pool, or the reason it cannot exist there."""
    if word == "node":
        return Topology(1, pool.gpus_per_node) if pool.has_gpu else Topology(1, 2)
    if word == "pool":
        return Topology(pool.nodes, pool.gpus_per_node) if pool.has_gpu else Topology(pool.nodes, 2)
    match = _TOPOLOGY.match(word)
    if match is None:  # pragma: no cover - validated at load
        return f"bad topology {word}"
    topo = Topology(int(match.group(1)), int(match.group(2)))
    if topo.nodes > pool.nodes:
        return f"topology {topo} needs {topo.nodes} nodes; pool {pool.name} has {pool.nodes}"
    if pool.has_gpu and topo.nproc_per_node > pool.gpus_per_node:
        return f"topology {topo} needs {topo.nproc_per_node} GPUs per node; pool {pool.name} has {pool.gpus_per_node}"
    return topo


def _rule_matches(rule: Rule, values: Mapping[str, str]) -> bool:
    return all(fnmatch.fnmatchcase(values.get(k, ""), pattern) for k, pattern in rule.fields)


def expand(
    spec: MatrixSpec,
    pools: Mapping[str, RunnerPool],
    production: Production,
    table: compat_mod.CompatTable,
    *,
    torch_versions: Sequence[Version],
    source: WheelSource | None = None,
    production_source: WheelSource | None = None,
    given: Probed | None = None,
    production_given: Probed | None = None,
) -> Expansion:
    """Candidate cells over pools x torch x cuda x python x topology, pruned by the compat rules,
    plus one production cell per (pool, topology) that has a candidate. A `given` stack (an
    interpreter or image the team has) replaces the torch, CUDA and Python axes with what it holds."""
    source = source or spec.source
    production_source = production_source or production_source_for(spec, source)
    for name in spec.pools:
        if name not in pools:
            raise spec.doc.error(f"unknown runner pool {name!r}", "matrix", "pools",
                                 hint=f"pools defined: {', '.join(sorted(pools))}")
    combos: list[tuple[RunnerPool, Version, CudaVariant, str, str]] = []
    for name in spec.pools:
        pool = pools[name]
        axes = spec.gpu_axes if pool.has_gpu else spec.cpu_axes
        for torch in torch_versions:
            variants = [given.cuda] if given else axes.variants(torch, table)
            for cuda, python, topo in itertools.product(variants, [given.python] if given else spec.python,
                                                        axes.topology):
                combos.append((pool, torch, cuda, python, topo))
    for rule in () if given else spec.includes:  # (a given stack is one stack: no extra combinations)
        pool_name = rule.get("pool") or ""
        if pool_name not in pools:
            raise ConfigError(f"[[include]] names unknown pool {pool_name!r}", path=spec.path, line=rule.line)
        pool = pools[pool_name]
        axes = spec.gpu_axes if pool.has_gpu else spec.cpu_axes
        torches = [parse_torch(rule.get("torch") or "")] if rule.get("torch") else list(torch_versions)
        pythons = [rule.get("python") or ""] if rule.get("python") else list(spec.python)
        topos = [rule.get("topology") or ""] if rule.get("topology") else list(axes.topology)
        for torch in torches:
            cudas = [CudaVariant.parse(rule.get("cuda") or "")] if rule.get("cuda") else list(axes.variants(torch, table))
            for cuda, python, topo in itertools.product(cudas, pythons, topos):
                combos.append((pool, torch, cuda, python, topo))

    cells: dict[str, Cell] = {}
    pruned: dict[str, Pruned] = {}
    for pool, torch, cuda, python, topo_word in combos:
        values = {"pool": pool.name, "cuda": cuda.tag, "torch": str(torch), "python": python, "topology": topo_word}
        if any(_rule_matches(rule, values) for rule in spec.excludes):
            continue
        stack = Stack(torch=torch, cuda=cuda, python=python, source=source, channel=spec.channel,
                      given=given.given if given else "")
        resolved = resolve_topology(topo_word, pool)
        cell = Cell(stack=stack, pool=pool, topology=resolved if isinstance(resolved, Topology) else Topology(0, 0),
                    role=Role.CANDIDATE)
        _admit(cell, table, spec.required, cells, pruned, resolved if isinstance(resolved, str) else None)

    for candidate in list(cells.values()):
        stack = production.stack_for(candidate.pool, production_source)
        if production_given is not None:
            stack = replace(stack, torch=production_given.torch, cuda=production_given.cuda,
                            python=production_given.python, given=production_given.given)
        prod = Cell(stack=stack, pool=candidate.pool, topology=candidate.topology, role=Role.PRODUCTION)
        # a baseline is required exactly when a required candidate is compared with it
        partners_required = any(c.required for c in cells.values()
                                if c.role is Role.CANDIDATE and c.comparison_key == prod.comparison_key)
        _admit(prod, table, ("*",) if partners_required else (), cells, pruned, None)
        if prod.id in cells:  # the pair is computed here, once; a pruned baseline leaves it empty
            cells[candidate.id] = replace(cells[candidate.id], baseline=prod.id)

    unmatched_globs(spec.required, [*cells], [*pruned.values()], where=(spec.path, spec.doc.line_of("matrix", "required")))
    ordered = sorted(cells.values(), key=lambda c: (c.pool.name, str(c.topology), c.role is Role.CANDIDATE, c.id))
    here = tuple(c for c in ordered if c.pool.is_local)
    away = tuple(
        NotHere(c, f"runner pool {c.pool.name} ({c.pool.gpu or 'cpu'}, driver {c.pool.driver}) is not this machine; "
                   f"run `stackgate run --pool {c.pool.name}` on that pool and `stackgate merge` the bundles")
        for c in ordered if not c.pool.is_local
    )
    return Expansion(cells=here, not_here=away, pruned=tuple(sorted(pruned.values(), key=lambda p: p.cell.id)))


def production_source_for(spec: MatrixSpec, candidate_source: WheelSource) -> WheelSource:
    """Production keeps its own wheel source: on the nightly channel it never inherits the nightly
    index or pre-releases (it is a released stack), elsewhere it shares the matrix's source."""
    if spec.channel == "nightly":
        return WheelSource()
    return candidate_source


def wheel_target(spec: MatrixSpec) -> sources_mod.Target:
    """What the matrix's wheels must be built for (for resolving `nightly`)."""
    variants = {v.tag for v in (*spec.gpu_axes.cuda, *spec.cpu_axes.cuda)}
    return sources_mod.Target(pythons=spec.python, variants=tuple(sorted(variants)), arch=platform.machine())


def _admit(cell: Cell, table: compat_mod.CompatTable, required: Iterable[str], cells: dict[str, Cell],
           pruned: dict[str, Pruned], topology_problem: str | None) -> None:
    result = compat_mod.check(
        table, torch=cell.stack.torch, cuda=cell.stack.cuda, python=cell.stack.python,
        driver=cell.pool.driver if cell.pool.has_gpu else None, gpu_class=cell.pool.gpu_class,
        has_compat_package=cell.stack.cuda_compat,
    )
    reasons = [f"{o.rule}: {o.detail}" for o in result.failures]
    if topology_problem:
        reasons.append(f"topology: {topology_problem}")
    if reasons:
        pruned[cell.id] = Pruned(cell=cell, reasons=tuple(reasons))
        return
    is_required = any(fnmatch.fnmatchcase(cell.id, g) for g in required)
    cells[cell.id] = replace(cell, required=is_required)


# -------------------------------------------------------------------------------------------- select

def unmatched_globs(globs: Sequence[str], ids: Sequence[str], pruned: Sequence[Pruned],
                    where: tuple[Path | None, int | None]) -> None:
    """Every `required` glob names at least one cell of the expanded matrix (before any selection),
    or the run stops: a typo must never quietly make nothing required (a false GO)."""
    for glob in globs:
        if any(fnmatch.fnmatchcase(i, glob) for i in ids):
            continue
        gone = [p for p in pruned if fnmatch.fnmatchcase(p.cell.id, glob)]
        if gone:
            raise ConfigError(f"required = {glob!r} matches only pruned cells: {gone[0].cell.id} "
                              f"({'; '.join(gone[0].reasons)})", path=where[0], line=where[1],
                              hint="a required cell must be able to exist: fix the matrix axes or the glob")
        prefixes = sorted({"-".join(i.split("-")[:k]) + "-*" for i in ids for k in range(1, len(i.split("-")))})
        close = difflib.get_close_matches(glob, [*prefixes, *ids], n=3, cutoff=0.5)
        hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
        raise ConfigError(f"required = {glob!r} matches no cell of the matrix", path=where[0], line=where[1],
                          hint=hint + f"cells: {', '.join(sorted(ids)[:6])}" + (" ..." if len(ids) > 6 else ""))


def require(expansion: Expansion, globs: Sequence[str], where: tuple[Path | None, int | None] = (None, None)
            ) -> Expansion:
    """Mark the cells the policy requires (`[required] cells` globs), once, so that the gate and the
    report agree on what "required" means. A required candidate's baseline is required too. A glob
    that matches no cell is an error (see `unmatched_globs`)."""
    if not globs:
        return expansion
    unmatched_globs(globs, [c.id for c in expansion.all_cells], expansion.pruned, where)

    def mark(cells: Sequence[Cell]) -> dict[str, Cell]:
        out = {c.id: replace(c, required=True) if any(fnmatch.fnmatchcase(c.id, g) for g in globs) else c
               for c in cells}
        for c in list(out.values()):
            if c.required and c.baseline in out:
                out[c.baseline] = replace(out[c.baseline], required=True)
        return out

    here = mark(expansion.cells)
    away = mark([n.cell for n in expansion.not_here])
    return replace(expansion, cells=tuple(here[c.id] for c in expansion.cells),
                   not_here=tuple(replace(n, cell=away[n.cell.id]) for n in expansion.not_here))


def select(expansion: Expansion, only: Sequence[str] = (), shard: tuple[int, int] | None = None) -> Expansion:
    """Keep cells whose id matches any `--only` glob, then this shard (index, count) of them.

    A selected candidate keeps its production partner: a comparison needs both.
    """
    def keep(cell: Cell) -> bool:
        return not only or any(fnmatch.fnmatchcase(cell.id, g) for g in only)

    all_here = expansion.cells
    chosen = [c for c in expansion.cells if keep(c)]
    partners = {c.baseline for c in chosen if c.role is Role.CANDIDATE}
    chosen_ids = {c.id for c in chosen}
    chosen += [c for c in expansion.cells if c.id in partners and c.id not in chosen_ids]
    if shard is not None:
        index, count = shard
        groups = sorted({c.comparison_key for c in chosen})
        mine = {g for i, g in enumerate(groups) if i % count == index}
        chosen = [c for c in chosen if c.comparison_key in mine]
    order = {c.id: i for i, c in enumerate(expansion.cells)}
    chosen.sort(key=lambda c: order[c.id])
    not_here = tuple(n for n in expansion.not_here if keep(n.cell))
    # a partial selection is stated, and cannot give GO for the required cells it left out
    picked = {c.id for c in chosen}
    how = " ".join([*(f"--only {g}" for g in only), *([f"--shard {shard[0]}/{shard[1]}"] if shard else [])])
    left_out = tuple(NotHere(c, f"left out of this run by {how}") for c in all_here
                     if c.id not in picked and c.required)
    return Expansion(cells=tuple(chosen), not_here=not_here + left_out, pruned=expansion.pruned)
