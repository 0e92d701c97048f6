"""Does the GPU image have everything the GPU kit imports? The check behind `scripts/gpu_kit.sh prepare`.

The GPU machines' image (benchmarks/gpu_kit_image.txt, copied from the device tool's KINDS.md) has torch but
no pydantic, and nothing can be installed there from the network: what it lacks travels as wheels
(benchmarks/gpu_kit_wheels.txt, downloaded into .whl/). This module answers, offline:

- `kit_imports()`: every third-party top-level module that the kit's code path imports, found statically from
  its entry points (the kit's own files, the `nanoplan` commands it calls, the torchrun targets those launch),
  following the project's modules transitively through every import statement, function-level ones included,
  and through string constants that name a project module (`-m runner.train`, the CLI's command table).
  Imports under `if TYPE_CHECKING:` are skipped; those in a `try` that catches ImportError are optional.
- `coverage()`: each module's distribution (from this environment's metadata) against the image's list plus
  the kit's wheels; and each carried wheel's own requirements (from .whl/ when given, else from this
  environment when it has the same version) against the same two lists.

    python benchmarks/gpu_kit_imports.py [--wheels .whl]     # exit 1 if something is missing
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
import zipfile
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
IMAGE_FILE = REPO / "benchmarks" / "gpu_kit_image.txt"
WHEELS_FILE = REPO / "benchmarks" / "gpu_kit_wheels.txt"
PROJECT = ("planner", "runner", "nanoplan", "hardware_profiles")
# the kit's own code, run as files (benchmarks/ is no package)
ENTRY_FILES = ("benchmarks/gpu_kit.py", "benchmarks/gpu_kit_parts.py", "benchmarks/gpu_kit_report.py",
               "benchmarks/gpu_kit_imports.py",
               "benchmarks/gpu_suite.py", "examples/tiny/make_text.py")
# what it runs as `python -m`: the CLI, with only the commands the kit calls (benchmarks/gpu_kit_parts.py runs
# no other); their modules come from the CLI's own table, nanoplan.cli.COMMANDS
ENTRY_MODULES = ("nanoplan.__main__",)
KIT_COMMANDS = ("estimate", "prepare-data", "probe", "run")
CLI = "nanoplan.cli"      # its command table's strings name every command's module: not followed, see above
PYTHON = (3, 12)          # the image's Python (3.12.3): requirement markers are evaluated for it
_MODULE_STRING = re.compile(r"^(planner|runner|nanoplan)(\.[A-Za-z_][A-Za-z_0-9]*)+$")


def norm(name: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_list(path: Path) -> list[str]:
    """The non-comment lines of a list file."""
    return [ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def image_packages(path: Path = IMAGE_FILE) -> set[str]:
    return {norm(n) for n in read_list(path)}


def kit_wheels(path: Path = WHEELS_FILE) -> dict[str, str]:
    """{normalised name: version} of the pinned wheels; each line NAME==VERSION."""
    out: dict[str, str] = {}
    for ln in read_list(path):
        name, sep, ver = ln.partition("==")
        if not sep or not name.strip() or not ver.strip():
            raise ValueError(f"{path}: {ln!r} is not NAME==VERSION")
        if norm(name) in out:
            raise ValueError(f"{path}: {name} is listed twice (one version each)")
        out[norm(name)] = ver.strip()
    return out


# ---------------------------------------------------------------------------- the static walk


@dataclass
class Found:
    """Third-party top-level modules and where they are imported from."""

    modules: dict[str, set[str]] = field(default_factory=dict)        # module -> importers
    required: set[str] = field(default_factory=set)                    # imported outside try/except ImportError
    project: set[str] = field(default_factory=set)                     # project modules visited


def _module_file(name: str) -> Path | None:
    base = REPO.joinpath(*name.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


def _catches_import_error(node: ast.Try) -> bool:
    for h in node.handlers:
        names = [h.type] if not isinstance(h.type, ast.Tuple) else list(h.type.elts)
        if h.type is None or any(isinstance(n, ast.Name) and n.id in ("ImportError", "ModuleNotFoundError")
                                 for n in names):
            return True
    return False


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
           (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def command_modules(commands: tuple[str, ...] = KIT_COMMANDS) -> list[str]:
    """The modules of the given `nanoplan` commands, read from the CLI's COMMANDS table (without importing it)."""
    tree = ast.parse(_module_file(CLI).read_text())  # type: ignore[union-attr]
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign | ast.Assign):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            if any(isinstance(t, ast.Name) and t.id == "COMMANDS" for t in targets) and node.value is not None:
                table = ast.literal_eval(node.value)
                return sorted({table[c] for c in commands})
    raise LookupError(f"no COMMANDS table in {CLI}")


def _imports(tree: ast.AST, package: str, strings: bool = True) -> list[tuple[str, bool]]:
    """(absolute module name, optional) for every import in the tree, and project modules named in strings
    (unless `strings` is false)."""
    out: list[tuple[str, bool]] = []

    def visit(node: ast.AST, optional: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child, optional)
            return
        if isinstance(node, ast.Try):
            opt = optional or _catches_import_error(node)
            for child in node.body:
                visit(child, opt)
            for child in [*node.handlers, *node.orelse, *node.finalbody]:
                visit(child, optional)
            return
        if isinstance(node, ast.Import):
            out.extend((a.name, optional) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            out.append((base, optional))
            out.extend((f"{base}.{a.name}", optional) for a in node.names if a.name != "*")
        elif (strings and isinstance(node, ast.Constant) and isinstance(node.value, str)
              and _MODULE_STRING.match(node.value)):
            out.append((node.value, optional))
        for child in ast.iter_child_nodes(node):
            visit(child, optional)

    visit(tree, False)
    return out


def kit_imports(entry_files: tuple[str, ...] = ENTRY_FILES, entry_modules: tuple[str, ...] = ENTRY_MODULES,
                commands: tuple[str, ...] = KIT_COMMANDS) -> Found:
    """Third-party modules imported on the kit's code path (static, transitive through the project)."""
    stdlib = set(sys.stdlib_module_names)
    found = Found()
    todo: list[tuple[str, Path, str]] = []        # (module name, file, package for relative imports)
    for f in entry_files:
        todo.append((f, REPO / f, ""))
    for m in (*entry_modules, *command_modules(commands)):
        path = _module_file(m)
        if path is None:
            raise FileNotFoundError(f"entry module {m} not found under {REPO}")
        todo.append((m, path, m if path.name == "__init__.py" else m.rpartition(".")[0]))
    seen: set[Path] = set()
    while todo:
        name, path, package = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        if name.split(".")[0] in PROJECT:
            found.project.add(name)
        for mod, optional in _imports(ast.parse(path.read_text(), str(path)), package, strings=name != CLI):
            top = mod.split(".")[0]
            if not top or top in stdlib or top == "__future__":
                continue
            local = path.parent / f"{top}.py"      # a script's own folder is on sys.path (benchmarks/*.py)
            if name.endswith(".py") and local.is_file():
                todo.append((str(local.relative_to(REPO)), local, ""))
                continue
            if top in PROJECT:
                # a name may be a module or an attribute of one: follow every prefix that is a module
                parts = mod.split(".")
                for i in range(1, len(parts) + 1):
                    sub = ".".join(parts[:i])
                    p = _module_file(sub)
                    if p is not None and p not in seen:
                        todo.append((sub, p, sub if p.name == "__init__.py" else sub.rpartition(".")[0]))
                continue
            found.modules.setdefault(top, set()).add(name)
            if not optional:
                found.required.add(top)
    return found


# ---------------------------------------------------------------------------- coverage


def distribution_of(module: str, table: dict[str, list[str]] | None = None) -> str:
    """The distribution that provides a top-level module here (yaml -> pyyaml), else the module's own name."""
    table = metadata.packages_distributions() if table is None else table
    dists = table.get(module) or [module]
    return norm(dists[0])


def _wheel_requires(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    return [ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("Requires-Dist:")]


def wheel_files(wheels_dir: Path) -> dict[str, Path]:
    """{normalised name: wheel} in a folder (the distribution name is the wheel file's first field)."""
    return {norm(w.name.split("-")[0]): w for w in sorted(wheels_dir.glob("*.whl"))}


def _applies(req: object) -> bool:
    """A requirement that pip would install on the image: no extra, markers true on CPython 3.12 Linux."""
    marker = getattr(req, "marker", None)
    if marker is None:
        return True
    env = {"python_version": f"{PYTHON[0]}.{PYTHON[1]}", "python_full_version": f"{PYTHON[0]}.{PYTHON[1]}.3",
           "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
           "implementation_name": "cpython", "platform_python_implementation": "CPython", "os_name": "posix",
           "extra": ""}
    return bool(marker.evaluate(env))


def requirement_problems(wheels: dict[str, str], image: set[str], wheels_dir: Path | None = None) -> tuple[
        list[str], list[str]]:
    """(problems, notes) of the carried wheels' own requirements: each must be carried (at a version that
    satisfies it) or be in the image (its version unknown: a note)."""
    from packaging.requirements import Requirement

    problems: list[str] = []
    notes: list[str] = []
    files = wheel_files(wheels_dir) if wheels_dir else {}
    for name, ver in wheels.items():
        if name in files:
            reqs, origin = _wheel_requires(files[name]), files[name].name
        else:
            try:
                here = metadata.version(name)
            except metadata.PackageNotFoundError:
                notes.append(f"{name}=={ver}: not installed here and no wheel given; its requirements are unchecked")
                continue
            if here != ver:
                notes.append(f"{name}: {here} here, {ver} pinned; its requirements are unchecked (run prepare)")
                continue
            reqs, origin = metadata.requires(name) or [], f"{name} {here} (installed here)"
        for raw in reqs:
            req = Requirement(raw)
            if not _applies(req):
                continue
            dep = norm(req.name)
            if dep in wheels:
                if req.specifier and not req.specifier.contains(wheels[dep], prereleases=True):
                    problems.append(f"{origin} requires {raw}, the kit carries {dep}=={wheels[dep]}")
            elif dep in image:
                if req.specifier:
                    notes.append(f"{origin} requires {raw}: in the image, version not recorded")
            else:
                problems.append(f"{origin} requires {raw}: neither in the image nor among the kit's wheels")
    return problems, notes


# ---------------------------------------------------------------------------- the wheels in .whl/

MAX_GLIBC = (2, 39)    # Python 3.12.3 is Ubuntu 24.04's (glibc 2.39); prepare asks for manylinux <= 2_28 anyway


def _fits(tag: object) -> bool:
    """A wheel tag that pip installs on CPython 3.12, Linux x86-64."""
    interp, abi, plat = tag.interpreter, tag.abi, tag.platform  # type: ignore[attr-defined]
    py_ok = interp in ("cp312", "py3", "py312") or (abi == "abi3" and interp.startswith("cp3")
                                                   and interp[3:].isdigit() and int(interp[3:]) <= PYTHON[1])
    abi_ok = abi in ("cp312", "abi3", "none")
    m = re.fullmatch(r"manylinux_(\d+)_(\d+)_x86_64", plat)
    plat_ok = plat == "any" or plat in ("manylinux1_x86_64", "manylinux2010_x86_64", "manylinux2014_x86_64") or (
        m is not None and (int(m[1]), int(m[2])) <= MAX_GLIBC)
    return py_ok and abi_ok and plat_ok


def _wheels_by_name(wheels_dir: Path) -> tuple[dict[str, list[tuple[str, Path]]], list[str]]:
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    seen: dict[str, list[tuple[str, Path]]] = {}
    problems = []
    for w in sorted(wheels_dir.glob("*.whl")):
        try:
            name, ver, _build, tags = parse_wheel_filename(w.name)
        except InvalidWheelFilename:
            problems.append(f"{w.name}: not a wheel's file name")
            continue
        seen.setdefault(norm(name), []).append((str(ver), w))
        if not any(_fits(t) for t in tags):
            problems.append(f"{w.name}: not for CPython {PYTHON[0]}.{PYTHON[1]} on manylinux x86-64")
    return seen, problems


def _same_version(a: str, b: str) -> bool:
    from packaging.version import Version

    return Version(a) == Version(b)


def wheel_problems(wheels_dir: Path, pins: dict[str, str]) -> list[str]:
    """Exactly one wheel per pin, at the pinned version, for the image's Python; nothing else."""
    seen, problems = _wheels_by_name(wheels_dir)
    for name, ver in pins.items():
        got = seen.get(name, [])
        if not got:
            problems.append(f"{name}=={ver}: no wheel in {wheels_dir} (run scripts/gpu_kit.sh prepare)")
        elif len(got) > 1:
            problems.append(f"{name}: {len(got)} wheels ({', '.join(w.name for _, w in got)}); keep one version")
        elif not _same_version(got[0][0], ver):
            problems.append(f"{name}: {got[0][1].name} is {got[0][0]}, {WHEELS_FILE.name} pins {ver}")
    problems += [f"{got[0][1].name}: not in {WHEELS_FILE.name}" for name, got in seen.items() if name not in pins]
    return problems


def prune(wheels_dir: Path, pins: dict[str, str]) -> list[Path]:
    """Remove the wheels (plain files) that are not a pinned NAME==VERSION; the removed paths."""
    seen, _ = _wheels_by_name(wheels_dir)
    gone = []
    for name, got in seen.items():
        for ver, w in got:
            if (name not in pins or not _same_version(ver, pins[name])) and w.is_file() and not w.is_symlink():
                w.unlink()
                gone.append(w)
    return gone


def has(wheels_dir: Path, pin: str) -> bool:
    """One wheel of NAME==VERSION is there."""
    name, _, ver = pin.partition("==")
    got = _wheels_by_name(wheels_dir)[0].get(norm(name), [])
    return len(got) == 1 and _same_version(got[0][0], ver.strip())


@dataclass
class Coverage:
    rows: list[tuple[str, str, str, str]]     # (module, distribution, covered by: image | kit | MISSING, importers)
    problems: list[str]
    notes: list[str]


def coverage(wheels_dir: Path | None = None, image_file: Path = IMAGE_FILE, wheels_file: Path = WHEELS_FILE,
             found: Found | None = None, dist_table: dict[str, list[str]] | None = None) -> Coverage:
    """Every third-party module on the kit's path, and every carried wheel's requirement, against the image
    plus the kit's wheels."""
    image, wheels = image_packages(image_file), kit_wheels(wheels_file)
    found = kit_imports() if found is None else found
    table = metadata.packages_distributions() if dist_table is None else dist_table
    rows, problems = [], []
    for mod in sorted(found.modules):
        dist = distribution_of(mod, table)
        by = "kit" if dist in wheels else "image" if dist in image else "MISSING"
        who = sorted(found.modules[mod])
        importers = who[0] + (f" and {len(who) - 1} more" if len(who) > 1 else "")
        if by == "MISSING" and mod in found.required:
            problems.append(f"{mod} (distribution {dist}), imported by {importers}: neither in the GPU image "
                            f"nor among the kit's wheels; add it to {wheels_file.name}")
        rows.append((mod, dist, by if mod in found.required or by != "MISSING" else "optional, MISSING", importers))
    req_problems, notes = requirement_problems(wheels, image, wheels_dir)
    return Coverage(rows, problems + req_problems, notes)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--wheels", default=None, help="the folder of downloaded wheels (their METADATA is checked)")
    p.add_argument("--quiet", action="store_true", help="print only problems and the verdict")
    p.add_argument("--check-wheels", action="store_true", help="also: one wheel per pin in --wheels, nothing else")
    p.add_argument("--prune", action="store_true", help="remove from --wheels what is not pinned, then exit")
    p.add_argument("--has", metavar="NAME==VERSION", help="exit 0 if --wheels holds that wheel, else 1")
    a = p.parse_args(argv)
    wheels_dir = Path(a.wheels) if a.wheels else None
    if a.prune or a.has:
        if wheels_dir is None:
            p.error("--prune and --has need --wheels")
        if a.has:
            return 0 if has(wheels_dir, a.has) else 1
        for w in prune(wheels_dir, kit_wheels()):
            print(f"removed {w} (not in {WHEELS_FILE.name})")
        return 0
    cov = coverage(wheels_dir)
    if a.check_wheels and wheels_dir is not None:
        cov.problems[:0] = wheel_problems(wheels_dir, kit_wheels())
    if not a.quiet:
        print(f"{'module':<11} {'package':<11} {'from':<6} imported by")
        for mod, dist, by, importers in cov.rows:
            print(f"{mod:<11} {dist:<11} {by:<6} {importers}")
        for n in cov.notes:
            print(f"note: {n}")
    for prob in cov.problems:
        print(f"error: {prob}", file=sys.stderr)
    print(f"imports: {len(cov.rows)} third-party modules on the kit's path, "
          + ("all in the GPU image or the wheels" if not cov.problems else f"{len(cov.problems)} problem(s)"))
    return 1 if cov.problems else 0


if __name__ == "__main__":
    sys.exit(main())
