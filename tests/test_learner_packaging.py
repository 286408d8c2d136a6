"""What a learner installs (issue 15): the extras cover what the chapters import, requirements.txt pins
satisfy them, binder/ is requirements.txt's reader subset on the notebooks' Python, the repository
URL is written in one place, and a wheel built from the checkout carries every file the package
reads. (Installing and running it all in fresh venvs is `make test-learner`.)"""
from __future__ import annotations

import ast
import importlib.util
import re
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import nbformat
import pytest
import yaml
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import preln

try:
    import tomllib
except ModuleNotFoundError:      # Python 3.10: the same parser as the tomli package (requirements.txt)
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
# scripts/learner_check.py (`make test-learner`), loaded by its path: scripts/ is not a package on sys.path
_spec = importlib.util.spec_from_file_location("learner_check", ROOT / "scripts" / "learner_check.py")
learner_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(learner_check)
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
REPO_URL = CONFIG["repository"]["url"].rstrip("/")
BRANCH = CONFIG["repository"]["branch"]
CHAPTERS = sorted((ROOT / "book").glob("*.ipynb"))
ASSIGNMENTS = sorted((ROOT / "assignments" / "release").glob("*/*.ipynb"))
# imports that are optional by design, each guarded by try/except ImportError where it occurs
OPTIONAL_IMPORTS = {
    "torch": "the PyTorch reference of the benchmark and tests, never a dependency",
    "transformers": "the LlamaDecoderLayer reference of the benchmark and tests, never a dependency",
    "myst_nb": "preln.nb.glue falls back to showing the value without the book's toolchain",
    "gguf": "preln.gguf reads GGUF files with it (the gguf extra); an error names the install command",
    "tokenizers": "preln.gguf builds the tokenizer with it (the gguf extra)",
    "jinja2": "preln.gguf renders a chat template with it (the gguf extra)",
    "llama_cpp": "preln.gguf.bench adds a llama.cpp row when it happens to be installed, never a dependency",
}
# the Jupyter of preln[notebooks]: a kernel and the notebook server
JUPYTER = {"ipykernel", "notebook"}
# the oldest versions of them Colab's runtime has shipped (the notebooks extra's bounds must admit them)
COLAB_JUPYTER = {"ipykernel": "5.5.6", "notebook": "6.5.5"}
# what binder/ must not carry: tests, the site's build stack, packaging tools
NOT_FOR_READERS = {"pytest", "pytest-timeout", "pytest-xdist", "execnet", "nbval", "hypothesis", "playwright", "jupyter-book",
                   "myst-nb", "sphinxcontrib-bibtex", "setuptools", "nbconvert", "nbgrader"}


def requirement_lines(path):
    return [ln.split("#", 1)[0].strip() for ln in Path(path).read_text().splitlines()
            if ln.split("#", 1)[0].strip()]


def pins(path, python):
    """{name: version} of the == pins in a requirements file that apply to Python ``python`` ("3.11")."""
    env = {"python_version": python, "python_full_version": python + ".0"}
    out = {}
    for line in requirement_lines(path):
        if line.startswith("-"):
            continue
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate(env):
            spec = [s for s in req.specifier if s.operator == "=="]
            if spec:
                out[canonicalize_name(req.name)] = spec[0].version
    return out


def extra(name):
    return [Requirement(r) for r in PROJECT["optional-dependencies"][name]]


def dependencies():
    return [Requirement(r) for r in PROJECT["dependencies"]]


# --- the chapters' imports -------------------------------------------------------------------------

def imported_modules(source):
    """Top-level modules imported anywhere in ``source`` (cell magics and shell lines dropped)."""
    code = "\n".join(ln for ln in source.splitlines() if not ln.lstrip().startswith(("%", "!")))
    mods = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            mods |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            mods.add(node.module.split(".")[0])
    return mods


def notebook_imports(path):
    nb = nbformat.read(str(path), as_version=4)
    return set().union(*(imported_modules(c.source) for c in nb.cells if c.cell_type == "code"))


def package_imports(grader=False):
    """Third-party imports of the package; the grader's (preln/grade/, the `course` extra) apart."""
    grade = ROOT / "preln" / "grade"
    return set().union(*(imported_modules(p.read_text()) for p in (ROOT / "preln").rglob("*.py")
                         if (grade in p.parents) == grader))


def third_party(mods):
    return {m for m in mods if m not in sys.stdlib_module_names and m not in ("preln", "__future__")}


def requirement_closure(reqs):
    """Every distribution installed because of ``reqs`` (their requirements, recursively, as
    installed in this environment; extras followed)."""
    seen, todo = set(), [(r, set(r.extras)) for r in reqs]
    while todo:
        req, extras = todo.pop()
        name = canonicalize_name(req.name)
        key = (name, frozenset(extras))
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        for line in dist.requires or []:
            sub = Requirement(line)
            envs = [{"extra": e} for e in extras] or [{"extra": ""}]
            if sub.marker is None or any(sub.marker.evaluate(e) for e in envs):
                todo.append((sub, set(sub.extras)))
    return {n for n, _ in seen}


def test_notebooks_extra_covers_every_import_of_the_chapters_and_assignments():
    dists = metadata.packages_distributions()
    needed = {}
    for path in CHAPTERS + ASSIGNMENTS:
        for mod in third_party(notebook_imports(path)):
            needed.setdefault(mod, []).append(path.name)
    for mod in third_party(package_imports()) - set(OPTIONAL_IMPORTS):
        needed.setdefault(mod, []).append("preln/")
    assert needed, "no third-party import found: the scan is broken"
    provided = requirement_closure(dependencies() + extra("notebooks"))
    missing = {}
    for mod, where in sorted(needed.items()):
        names = {canonicalize_name(d) for d in dists.get(mod, [])}
        assert names, f"{mod} (imported by {where}) is not installed here, so its distribution is unknown"
        if not names & provided:
            missing[mod] = sorted(set(where))
    assert not missing, (f"imported but not installed by preln[notebooks] (nor by what it requires): {missing}; "
                         "add them to pyproject.toml's dependencies or the notebooks extra")


def test_course_extra_covers_the_graders_imports():
    """preln/grade/ runs with preln[course]: its imports beyond the notebooks' closure come with
    nbgrader (checked against the installed closure where nbgrader is installed, as in test-course)."""
    names = {canonicalize_name(r.name) for r in extra("course")}
    assert "nbgrader" in names
    dists = metadata.packages_distributions()
    provided = requirement_closure(dependencies() + extra("course"))
    # sandbox_lib/'s modules run in the sandbox as standalone files beside the others the grader
    # copies there (autograde.LIB_FILES: wire, grader_capture, preln/course.py as `course`)
    # (read from the source: autograde imports nbgrader, which test-unit's venv may not have)
    tree = ast.parse((ROOT / "preln" / "grade" / "autograde.py").read_text())
    lib_files = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                     and [t.id for t in n.targets if isinstance(t, ast.Name)] == ["LIB_FILES"])
    local = {q.stem for q in (ROOT / "preln" / "grade").rglob("*.py")} | {Path(f).stem for f in lib_files}
    for mod in sorted(third_party(package_imports(grader=True)) - local):
        found = {canonicalize_name(d) for d in dists.get(mod, [])}
        if not found:
            assert mod == "nbgrader", f"{mod} (imported by preln/grade/) is not installed here"
            continue
        if "nbgrader" in {canonicalize_name(d.metadata["Name"]) for d in metadata.distributions()}:
            assert found & provided, f"{mod} (imported by preln/grade/) is not installed by preln[course]"


def test_notebooks_extra_is_what_running_the_chapters_needs_and_no_more():
    names = {canonicalize_name(r.name) for r in extra("notebooks")}
    # gguf, tokenizers, jinja2: the chapter "A real model" reads SmolLM2's GGUF file (preln.gguf)
    assert names == {"matplotlib", "ipywidgets", "gguf", "tokenizers", "jinja2"} | JUPYTER, (
        "preln[notebooks] is the chapters' imports (matplotlib, ipywidgets; gguf, tokenizers, Jinja2 for "
        "the GGUF chapter) and a Jupyter to run them in (ipykernel, notebook); change this test with a "
        f"reason if that changes: {names}")


def test_notebooks_extra_installs_no_second_jupyter_on_colab():
    """The bootstrap pip-installs preln[notebooks] into Colab's kernel: the Jupyter lower bounds must
    be met by what Colab ships (ipykernel 5.5 and notebook 6.5 at the oldest), or pip would replace
    the server Colab runs."""
    for req in extra("notebooks"):
        if canonicalize_name(req.name) in JUPYTER:
            assert req.specifier.contains(COLAB_JUPYTER[canonicalize_name(req.name)]), req


@pytest.mark.parametrize("mod", sorted(OPTIONAL_IMPORTS))
def test_optional_imports_are_guarded(mod):
    """Every import of an optional module in preln/ sits in a try whose handler catches ImportError
    (or is inside a function that the optional path alone calls, e.g. the torch comparison)."""
    unguarded = []
    for path in sorted((ROOT / "preln").rglob("*.py")):
        tree = ast.parse(path.read_text())
        guarded, in_function = set(), set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Try) and any(
                    h.type is None or "ImportError" in ast.unparse(h.type) or "Exception" in ast.unparse(h.type)
                    for h in node.handlers):
                guarded |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                in_function |= {id(n) for n in ast.walk(node)}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                if any(n.split(".")[0] == mod for n in names) and id(node) not in guarded:
                    if id(node) not in in_function:
                        unguarded.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not unguarded, f"{mod} ({OPTIONAL_IMPORTS[mod]}) imported at module level without a guard: {unguarded}"


# --- pins and extras agree ---------------------------------------------------------------------------

@pytest.mark.parametrize("python", ["3.10", "3.11"])
def test_requirements_pins_satisfy_every_requirement_of_the_package(python):
    pinned = pins(ROOT / "requirements.txt", python) | pins(ROOT / "requirements-course.txt", python)
    env = {"python_version": python, "python_full_version": python + ".0", "extra": ""}
    wrong = []
    reqs = dependencies() + [r for name in PROJECT["optional-dependencies"] for r in extra(name)]
    for req in reqs:
        name = canonicalize_name(req.name)
        if name == "preln" or (req.marker and not req.marker.evaluate(env)):
            continue
        if name not in pinned:
            wrong.append(f"{req}: no pin in requirements.txt / requirements-course.txt")
        elif not req.specifier.contains(pinned[name], prereleases=True):
            wrong.append(f"{req}: the pin is {pinned[name]}")
    assert not wrong, wrong


def test_extras_build_on_notebooks():
    for name in ("lab", "book", "course"):
        assert "preln[notebooks]" in PROJECT["optional-dependencies"][name], name
    assert {canonicalize_name(r.name) for r in extra("lab")} >= {"jupyterlab", "jupyterlab-myst"}
    assert {canonicalize_name(r.name) for r in extra("book")} >= {"jupyter-book", "myst-nb"}
    assert {canonicalize_name(r.name) for r in extra("course")} >= {"nbgrader"}


def test_version_has_one_source():
    assert "version" not in PROJECT and "version" in PROJECT["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "preln.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", preln.__version__)
    installed = metadata.version("preln")
    assert installed == preln.__version__, (
        f"the installed metadata says {installed}, preln/__init__.py {preln.__version__}: run make install")


# --- binder/ -----------------------------------------------------------------------------------------

def test_binder_runtime_is_the_python_of_the_stored_outputs():
    runtime = (ROOT / "binder" / "runtime.txt").read_text().strip()
    m = re.fullmatch(r"python-(\d+\.\d+)", runtime)
    assert m, f"binder/runtime.txt: expected python-X.Y; got {runtime!r}"
    made_with = {".".join(nbformat.read(str(p), as_version=4).metadata.language_info.version.split(".")[:2])
                 for p in CHAPTERS}
    assert made_with == {m.group(1)}, (f"the stored outputs were made with Python {sorted(made_with)}, "
                                       f"binder/runtime.txt gives {m.group(1)}")


def test_binder_requirements_are_the_readers_subset_of_requirements_txt():
    lines = requirement_lines(ROOT / "binder" / "requirements.txt")
    assert "-e ." in lines, "binder/requirements.txt must install the repository itself (-e .)"
    assert all(ln == "-e ." or not ln.startswith("-") for ln in lines), lines
    python = re.search(r"python-(\S+)", (ROOT / "binder" / "runtime.txt").read_text()).group(1)
    binder = pins(ROOT / "binder" / "requirements.txt", python)
    unpinned = [ln for ln in lines if ln != "-e ." and "==" not in ln]
    assert not unpinned, f"binder/requirements.txt: pin every line with == (as requirements.txt): {unpinned}"
    reference = pins(ROOT / "requirements.txt", python)
    differ = {n: (v, reference.get(n)) for n, v in binder.items() if reference.get(n) != v}
    assert not differ, f"binder pin vs requirements.txt pin for Python {python}: {differ}"
    # repo2docker's base environment runs the Jupyter server and brings ipykernel: pinning them here
    # would replace the server it starts, so binder/ lists the rest of preln[notebooks]
    wanted = ({canonicalize_name(r.name) for r in dependencies() + extra("notebooks")} - JUPYTER
              | {"jupyterlab-myst"})
    assert set(binder) == wanted, (f"binder/requirements.txt should list the package's dependencies, "
                                   f"preln[notebooks] but its Jupyter, and jupyterlab-myst: missing "
                                   f"{sorted(wanted - set(binder))}, extra {sorted(set(binder) - wanted)}")
    assert not set(binder) & NOT_FOR_READERS


# --- the repository URL, in one place ---------------------------------------------------------------

URL_FILES = ["README.md", "book/running.md", "book/course.md", "book/intro.md", "pyproject.toml",
             "scripts/bootstrap_cell.py", "assignments/CONVENTIONS.md", "binder/requirements.txt"]


def test_config_names_a_github_repository():
    assert re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+", REPO_URL), REPO_URL


def test_pyproject_urls_are_the_configured_repository():
    urls = PROJECT["urls"]
    assert urls["Repository"].rstrip("/") == REPO_URL
    assert all(u.startswith(REPO_URL) for u in urls.values()), urls


@pytest.mark.parametrize("name", URL_FILES)
def test_every_link_to_the_repository_is_the_configured_one(name):
    """A link that looks like this project's (its owner or its name) must be _config.yml's repository;
    Binder and Colab launch links must name it and its branch. Links to other projects are fine.
    (The notebooks' bootstrap is checked by tests/test_bootstrap.py.)"""
    path = ROOT / name
    assert path.exists(), f"{name} is listed here but missing"
    text = path.read_text()
    owner_name = REPO_URL.split("github.com/", 1)[1]
    owner, repo = owner_name.split("/")
    wrong = []
    for m in re.finditer(r"https://github\.com/([\w.-]+)/([\w-]+(?:\.(?!git\b)[\w-]+)*)", text):
        if (m.group(1) == owner or m.group(2) == repo) and f"{m.group(1)}/{m.group(2)}" != owner_name:
            wrong.append(m.group(0))
    for m in re.finditer(r"https://mybinder\.org/v2/gh/([\w.-]+/[\w.-]+)/([\w.-]+)", text):
        if (m.group(1), m.group(2)) != (owner_name, BRANCH):
            wrong.append(m.group(0))
    for m in re.finditer(r"https://colab\.research\.google\.com/github/([\w.-]+/[\w.-]+)/blob/([\w.-]+)/", text):
        if (m.group(1), m.group(2)) != (owner_name, BRANCH):
            wrong.append(m.group(0))
    assert not wrong, f"{name} links another repository than _config.yml's {REPO_URL} ({BRANCH}): {wrong}"


def test_course_page_launch_links_point_at_the_committed_student_notebooks():
    text = (ROOT / "book" / "course.md").read_text()
    links = re.findall(r"https://mybinder\.org/v2/gh/[^)\s]+urlpath=lab/tree/([^)\s]+)", text)
    links += re.findall(r"https://colab\.research\.google\.com/github/[\w.-]+/[\w.-]+/blob/[\w.-]+/([^)\s]+)", text)
    assert links, "book/course.md has no launch links"
    assert all((ROOT / p).is_file() for p in links), [p for p in links if not (ROOT / p).is_file()]
    assert {p for p in links} == {str(p.relative_to(ROOT)) for p in ASSIGNMENTS}


def test_install_lines_name_the_repository_and_release():
    line = f'pip install "preln[notebooks] @ git+{REPO_URL}@v{preln.__version__}"'
    for name in ("README.md", "book/running.md"):
        assert line in (ROOT / name).read_text(), f"{name} should give the install line {line}"


# --- the wheel ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """A wheel built from the files of this checkout that git tracks or would add."""
    tmp = tmp_path_factory.mktemp("wheel")
    src, dist = tmp / "src", tmp / "dist"
    files = learner_check.checkout_files()
    for f in files:
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, src / f, follow_symlinks=False)      # a link stays a link, as build_wheel copies
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(dist), str(src)], check=True, capture_output=True, timeout=600)
    (whl,) = dist.glob("preln-*.whl")
    return whl, files


def data_files_read_by_the_package():
    """Every literal data_path("a", "b") / data_path("a/b") argument in preln/ and scripts/."""
    found = set()
    for path in list((ROOT / "preln").rglob("*.py")) + list((ROOT / "scripts").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "data_path"
                    and node.args and all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in node.args)):
                found.add("/".join(a.value for a in node.args))
    return found


def test_wheel_carries_every_module_and_data_file(wheel):
    whl, files = wheel
    with zipfile.ZipFile(whl) as z:
        names = set(z.namelist())
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    data = [f for f in files if f.startswith("preln/data/")]
    modules = [f for f in files if f.startswith("preln/") and f.endswith(".py")]
    assert len(data) >= 5 and modules
    assert not [f for f in data + modules if f not in names]
    read = data_files_read_by_the_package()
    assert read, "no data_path(...) call found: the scan is broken"
    assert not [f for f in read if not any(n == f"preln/data/{f}" or n.startswith(f"preln/data/{f}/") for n in names)]
    # nothing of the repository outside the package
    assert not [n for n in names if not n.startswith(("preln/", "preln-"))]
    assert f"Version: {preln.__version__}" in meta
    assert f"Project-URL: Repository, {REPO_URL}" in meta
    assert "Provides-Extra: notebooks" in meta


def test_wheel_data_is_what_data_path_returns_from_the_wheel(wheel, tmp_path):
    """Installed from the wheel alone (unzipped into a folder, no checkout on the path), data_path
    finds the corpus inside the installed package."""
    whl, _ = wheel
    with zipfile.ZipFile(whl) as z:
        z.extractall(tmp_path / "site")
    code = ("import sys; from preln.resources import data_path; "
            "p = data_path('corpus.txt'); print(p); assert p.is_file() and str(p).startswith(sys.argv[1])")
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path / "site")], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300, env={"PATH": "/usr/bin:/bin", "OPENBLAS_NUM_THREADS": "1",
                                                    "PYTHONPATH": str(tmp_path / "site")})
    assert p.returncode == 0, p.stderr[-2000:]


def test_learner_stage_runs_every_chapter_and_an_assignment():
    """The learner stage covers what the issue asks: every chapter (from book/) and one assignment."""
    assert learner_check.chapters() == CHAPTERS
    assert learner_check.ASSIGNMENT in sorted((ROOT / "assignments" / "source").glob("*/*.ipynb"))
    assert set(learner_check.COLAB_PACKAGES) == {"numpy", "scipy", "matplotlib", "ipywidgets", "ipykernel",
                                                   "notebook"}
    makefile = (ROOT / "Makefile").read_text()
    test_line = next(ln for ln in makefile.splitlines() if ln.startswith("test:"))
    stages = test_line.split()[1:]
    if "test-learner-and-course" in stages:        # side by side with the course tests
        recipe = makefile.split("\ntest-learner-and-course:", 1)[1].split("\n\n", 1)[0]
        stages += recipe.split()
    assert "test-learner" in stages and "test-course" in stages, test_line
