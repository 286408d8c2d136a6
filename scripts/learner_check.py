"""What a learner does, on this checkout: `make test-learner` (part of `make test`; issue 15).

    python scripts/learner_check.py [--only plain,colab,binder] [--jobs 2] [--keep]

1. wheel   Build the wheel from the checkout's files (the ones git tracks or would add) and check that
           it carries every file of preln/data and every module of preln/.
2. plain   A fresh venv: `pip install <wheel>`, then `python -m preln` from an empty folder outside
           the checkout must print the version, the module -> chapter map and the repository; then
           `pip install <wheel>[course]` and `python -m preln.grade --help` there must exit 0, with
           the wheel's copy of the instructor edition found.
3. colab   A fresh venv with only numpy, scipy, matplotlib, ipywidgets, ipykernel and notebook (what
           Colab gives a notebook). Each chapter, and one assignment (derivation_ops, with its solutions:
           the student edition stops at its first stub), is copied ALONE into an empty folder
           and executed there in a venv of its own that sees exactly that base's packages (a .pth
           file, as a venv with system site-packages sees the system's), so that its own first cell
           (the bootstrap) must pip-install preln, from PRELN_INSTALL = "preln[notebooks] @
           file://<wheel>", into it; the base is checked unchanged at the end.
4. binder  A venv made as repo2docker makes one from binder/: binder/runtime.txt's Python,
           `pip install -r binder/requirements.txt` run in the checkout, plus ipykernel (repo2docker's
           base environment has it). Every module any chapter imports must import there (read from
           the chapters' code cells), and BINDER_CHAPTERS are executed from book/, with nothing on
           PYTHONPATH: preln must come from that install (the checkout, editable), the bootstrap must
           stay silent. Every chapter was executed from book/ already by nbval (same pins, the
           checkout's preln) and alone by the colab step; `--binder-all` executes them all here too.

Every execution must finish without an error (nbclient stops at the first one). The venvs live in a
temporary folder outside the checkout, removed at the end (--keep keeps it); the executed copies and
the logs go to _build/learner/<step>/. The notebooks in book/ and assignments/ are only read: their
hashes are compared before and after. Installs use requirements.txt's pins (PIP_CONSTRAINT), so pip
resolves quickly and the same way everywhere; pip's cache is used as usual, packages come from the
index. Notebooks execute two at a time, each kernel on one BLAS thread (the Makefile's ONE_THREAD).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "_build" / "learner"
REQUIREMENTS = ROOT / "requirements.txt"
# The assignment the colab step runs alone: its source, i.e. the student notebook with the solutions
# filled in (the student edition stops at its first `raise NotImplementedError()` stub). Its setup
# cell is the student edition's (tests/test_bootstrap.py checks both start with the bootstrap).
ASSIGNMENT = ROOT / "assignments" / "source" / "derivation_ops" / "derivation_ops.ipynb"
COLAB_PACKAGES = ["numpy", "scipy", "matplotlib", "ipywidgets", "ipykernel", "notebook"]
PROBE_TAG = "LEARNER-PROBE"
# appended to the executed copy: where preln was imported from, and what the kernel saw
PROBE = f"""\
import json as _j, os as _o, sys as _s, preln as _p
from preln.resources import data_path as _d
print("{PROBE_TAG}", _j.dumps({{"file": _p.__file__, "version": _p.__version__, "prefix": _s.prefix,
      "pythonpath": _o.environ.get("PYTHONPATH"), "data": str(_d("corpus.txt")), "cwd": _o.getcwd()}}))
"""
CELL_TIMEOUT = 600
# Binder runs the checkout's own preln (editable) with requirements.txt's pins, as nbval does: what
# only Binder can lack is a package binder/requirements.txt forgot (the import check finds that for
# every chapter) or the editable install from book/ (one chapter that reads package data shows it).
BINDER_CHAPTERS = ("precision.ipynb",)
# The venvs' own installs skip byte-compiling every module of numpy, scipy, matplotlib ... (half of
# pip's CPU time): Python compiles what is imported when it is imported; nothing else differs. The
# notebooks' own installs (the bootstrap's) run exactly as a learner's do.
NO_COMPILE = ["--no-compile"]


class Failure(Exception):
    pass


def log(msg):
    print(f"[learner] {msg}", flush=True)


def run(cmd, *, cwd=None, env=None, logfile=None, timeout=1800):
    """Run a command; its output goes to ``logfile`` (appended). Raises Failure with the log's tail."""
    t0 = time.monotonic()
    with open(logfile, "a") as fh:
        fh.write(f"$ {' '.join(map(str, cmd))}  (in {cwd or os.getcwd()})\n")
        fh.flush()
        p = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, stdout=fh, stderr=subprocess.STDOUT,
                           timeout=timeout)
    if p.returncode != 0:
        tail = "".join(Path(logfile).read_text().splitlines(keepends=True)[-40:])
        raise Failure(f"{' '.join(map(str, cmd))} exited {p.returncode} (log: {logfile}):\n{tail}")
    return time.monotonic() - t0


def clean_env(**extra):
    """The environment a learner's process has: none of this checkout's (no PYTHONPATH, no venv)."""
    drop = {"PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "PRELN_INSTALL", "JUPYTER_PATH",
            "JUPYTER_CONFIG_DIR", "PIP_REQUIRE_VIRTUALENV"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    venv_bin = str(ROOT / ".venv" / "bin")
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin)
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PIP_CONSTRAINT"] = str(REQUIREMENTS)       # the pinned set: fast, reproducible resolution
    env.update(extra)
    return {k: v for k, v in env.items() if v is not None}      # extra=None removes a variable


def base_python(version=None):
    """The interpreter a fresh venv is made from: this venv's base Python, or python<version> on
    PATH when a given version (binder/runtime.txt's) is asked for."""
    base = getattr(sys, "_base_executable", sys.executable)
    if version is None:
        return base
    probe = subprocess.run([base, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                           capture_output=True, text=True)
    if probe.stdout.strip() == version:
        return base
    found = shutil.which(f"python{version}")
    if found is None:
        raise Failure(f"binder/runtime.txt asks for Python {version}: no python{version} on PATH "
                      f"(and {base} is Python {probe.stdout.strip()})")
    return found


def make_venv(path, logfile, python=None):
    run([python or base_python(), "-m", "venv", path], logfile=logfile, env=clean_env())
    return Path(path) / "bin" / "python"


def tree_hashes(*folders):
    out = {}
    for folder in folders:
        for p in sorted(folder.rglob("*.ipynb")):
            if ".ipynb_checkpoints" not in p.parts:
                out[str(p.relative_to(ROOT))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def book_files():
    return {str(p.relative_to(ROOT)) for p in (ROOT / "book").rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and ".ipynb_checkpoints" not in p.parts}


def chapters():
    return sorted((ROOT / "book").glob("*.ipynb"))


# --- 1. the wheel ---------------------------------------------------------------------------------

def checkout_files():
    """The files a clean clone would have, with their working-tree contents (tracked, plus untracked
    ones git would add)."""
    if (ROOT / ".git").exists():
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             cwd=ROOT, capture_output=True, check=True).stdout.decode()
        # (a link too: preln/grade/edition is one, to assignments/, which the wheel carries)
        return [f for f in out.split("\0") if f and ((ROOT / f).is_file() or (ROOT / f).is_symlink())]
    skip = {".venv", "_build", ".git", "__pycache__", ".pytest_cache", ".hypothesis"}
    return [str(p.relative_to(ROOT)) for p in ROOT.rglob("*")
            if (p.is_file() or p.is_symlink()) and not skip & set(p.relative_to(ROOT).parts)]


def wheel_problems(wheel, files):
    """What the wheel lacks: every preln/**.py and preln/data/** file of the checkout must be in it,
    and the instructor edition the grader needs (assignments/nbgrader_config.py and source/, as
    preln/grade/edition/)."""
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    wanted = [f for f in files if f.startswith("preln/") and (f.endswith(".py") or f.startswith("preln/data/"))
              and not (ROOT / f).is_symlink()]
    wanted += ["preln/grade/edition/" + f[len("assignments/"):] for f in files
               if f == "assignments/nbgrader_config.py"
               or (f.startswith("assignments/source/") and f.endswith(".ipynb"))]
    return [f for f in wanted if f not in names]


def build_wheel(work):
    logfile = OUT / "wheel.log"
    src, dist = work / "src", work / "dist"
    files = checkout_files()
    for f in files:
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, src / f, follow_symlinks=False)
    # setuptools from this venv (requirements.txt pins setuptools>=77): no build environment to fetch
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", dist, src],
        logfile=logfile, env=clean_env())
    wheels = sorted(dist.glob("preln-*.whl"))
    if len(wheels) != 1:
        raise Failure(f"expected one preln wheel in {dist}; found {[w.name for w in wheels]}")
    missing = wheel_problems(wheels[0], files)
    if missing:
        raise Failure(f"{wheels[0].name} lacks {len(missing)} file(s) of the package: {missing[:10]}")
    shutil.rmtree(src)
    return wheels[0]


# --- 2. plain: pip install <wheel>, python -m preln ------------------------------------------------

def check_plain(work, wheel, version):
    logfile = OUT / "plain.log"
    py = make_venv(work / "plain", logfile)
    run([py, "-m", "pip", "install", "-q", *NO_COMPILE, wheel], logfile=logfile, env=clean_env())
    outside = work / "empty-plain"
    outside.mkdir()
    p = subprocess.run([py, "-m", "preln"], cwd=outside, env=clean_env(), capture_output=True, text=True,
                       timeout=300)
    (OUT / "plain-python-m-preln.txt").write_text(p.stdout + p.stderr)
    if p.returncode != 0:
        raise Failure(f"python -m preln exited {p.returncode} after pip install {wheel.name}:\n{p.stderr[-3000:]}")
    import yaml
    url = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"].rstrip("/")
    expected = [f"preln {version}:", "Which module serves which chapter", f"The repository: {url}",
                f"preln[notebooks] @ git+{url}@v{version}", str(work / "plain")]
    absent = [e for e in expected if e not in p.stdout]
    if absent:
        raise Failure(f"python -m preln from {outside} does not print {absent}; it printed:\n{p.stdout[:3000]}")
    # the package alone (no extras) imports without the notebooks' stack
    q = subprocess.run([py, "-c", "import sys, preln, preln.resources, preln.blas; "
                        "print(sorted({'matplotlib', 'ipywidgets', 'IPython'} & set(sys.modules)))"],
                       cwd=outside, env=clean_env(), capture_output=True, text=True, timeout=300)
    if q.returncode != 0 or q.stdout.strip() != "[]":
        raise Failure(f"import preln in the plain install: {q.stdout}{q.stderr[-2000:]}")
    check_grader(py, wheel, outside, logfile)


def check_grader(py, wheel, outside, logfile):
    """An instructor outside a clone: `pip install <wheel>[course]`, then `python -m preln.grade
    --help` exits 0 and the grader finds the instructor edition the wheel carries."""
    t0 = time.monotonic()
    run([py, "-m", "pip", "install", "-q", *NO_COMPILE, f"{wheel}[course]"], logfile=logfile, env=clean_env())
    seconds = time.monotonic() - t0
    p = subprocess.run([py, "-m", "preln.grade", "--help"], cwd=outside, env=clean_env(), capture_output=True,
                       text=True, timeout=300)
    (OUT / "plain-python-m-preln-grade-help.txt").write_text(p.stdout + p.stderr)
    if p.returncode != 0 or "SUBMISSIONS" not in p.stdout:
        raise Failure(f"python -m preln.grade --help exited {p.returncode} after pip install {wheel.name}[course]:"
                      f"\n{p.stdout[-1000:]}{p.stderr[-3000:]}")
    q = subprocess.run([py, "-c", "from preln.grade import nbtools; print(nbtools.ROOT, nbtools.COURSE, "
                        "(nbtools.COURSE / 'nbgrader_config.py').is_file(), len(nbtools.assignments()))"],
                       cwd=outside, env=clean_env(), capture_output=True, text=True, timeout=300)
    n = len([d for d in (ROOT / "assignments" / "source").iterdir() if (d / f"{d.name}.ipynb").is_file()])
    if q.returncode != 0 or not q.stdout.startswith("None ") or not q.stdout.rstrip().endswith(f"True {n}"):
        raise Failure(f"the installed grader does not find the wheel's instructor edition ({n} assignments): "
                      f"{q.stdout}{q.stderr[-2000:]}")
    print(f"plain: pip install {wheel.name}[course] took {seconds:.0f} s; python -m preln.grade --help exits 0 "
          "outside the clone")


# --- executing one notebook (in a subprocess of this script) --------------------------------------

def execute_one(args):
    """--execute: run one notebook in a kernel of ``--python``; write the executed copy and a JSON
    summary (errors, the bootstrap's output, the probe)."""
    import nbformat
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    nb = nbformat.read(args.execute, as_version=4)
    probe = nbformat.v4.new_code_cell(PROBE)
    probe.metadata["tags"] = ["learner-probe"]
    nb.cells.append(probe)
    kdir = Path(args.kernels)
    spec_dir = kdir / args.kernel_name
    spec_dir.mkdir(parents=True, exist_ok=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [args.python, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": args.kernel_name, "language": "python"}))
    km = KernelManager(kernel_name=args.kernel_name, kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(kdir)]))
    client = NotebookClient(nb, km=km, timeout=CELL_TIMEOUT, startup_timeout=180, allow_errors=False,
                            resources={"metadata": {"path": args.cwd}})
    summary = {"notebook": args.execute, "error": None}
    t0 = time.monotonic()
    try:
        client.execute()
    except (CellExecutionError, CellTimeoutError, DeadKernelError) as e:
        summary["error"] = f"{type(e).__name__}: {str(e)[-4000:]}"
    finally:
        if km.has_kernel:          # nbclient leaves a kernel it was handed running: stop it
            km.shutdown_kernel(now=False)
    summary["seconds"] = round(time.monotonic() - t0, 1)
    # CPU time of the kernel and what it ran (pip, the numba compiler): the cost on an idle machine
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    summary["cpu_seconds"] = round(usage.ru_utime + usage.ru_stime, 1)
    code = [c for c in nb.cells if c.cell_type == "code"]
    summary["bootstrap_output"] = "".join(o.get("text", "") for o in code[0].get("outputs", [])
                                          if o.get("output_type") == "stream")
    summary["errors"] = [o.get("ename", "") + ": " + o.get("evalue", "") for c in code
                         for o in c.get("outputs", []) if o.get("output_type") == "error"]
    texts = [o.get("text", "") for o in probe.get("outputs", []) if o.get("output_type") == "stream"]
    probe_line = next((ln for t in texts for ln in t.splitlines() if ln.startswith(PROBE_TAG)), None)
    summary["probe"] = json.loads(probe_line[len(PROBE_TAG):]) if probe_line else None
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, args.out)
    Path(args.out).with_suffix(".json").write_text(json.dumps(summary, indent=1))
    return 0


def execute(notebook, python, cwd, out, name, work, env):
    """Execute ``notebook`` in a kernel of ``python`` (cwd ``cwd``) from a subprocess; its summary."""
    cmd = [sys.executable, __file__, "--execute", notebook, "--python", python, "--cwd", cwd,
           "--out", out, "--kernel-name", name, "--kernels", work / "kernels"]
    p = subprocess.run([str(c) for c in cmd], env=env, capture_output=True, text=True,
                       timeout=CELL_TIMEOUT * 20)
    summary_path = Path(out).with_suffix(".json")
    if p.returncode != 0 or not summary_path.exists():
        return {"notebook": str(notebook), "error": f"the executor exited {p.returncode}: {p.stderr[-3000:]}",
                "seconds": None, "probe": None, "bootstrap_output": "", "errors": []}
    return json.loads(summary_path.read_text())


def judge(summary, *, expect_install, venv, version, expect_file=None):
    """The problems with one execution (empty: it did what a learner needs)."""
    problems = []
    if summary["error"]:
        problems.append(summary["error"])
    problems += [f"an error output: {e}" for e in summary["errors"]]
    probe = summary["probe"]
    if not summary["error"]:
        boot = summary["bootstrap_output"]
        if expect_install is not None:
            wanted = f"preln: not installed here; pip install {expect_install}"
            if wanted not in boot:
                problems.append(f"the first cell did not install preln from PRELN_INSTALL; it printed {boot!r}")
        elif boot.strip():
            problems.append(f"the bootstrap printed {boot!r} where preln is installed (binder/requirements.txt)")
        if probe is None:
            problems.append("the probe cell printed nothing")
        else:
            if Path(probe["prefix"]).resolve() != Path(venv).resolve():
                problems.append(f"the kernel ran in {probe['prefix']}, not in {venv}")
            if probe["version"] != version:
                problems.append(f"imported preln {probe['version']}, the checkout is {version}")
            if probe["pythonpath"]:
                problems.append(f"PYTHONPATH was set in the kernel: {probe['pythonpath']}")
            inside = Path(probe["file"]).resolve().is_relative_to(ROOT)
            if expect_install is not None and (inside or not Path(probe["file"]).resolve().is_relative_to(Path(venv).resolve())):
                problems.append(f"preln was imported from {probe['file']}, not from the venv it installed into")
            if expect_file is not None and Path(probe["file"]).resolve() != Path(expect_file).resolve():
                problems.append(f"preln was imported from {probe['file']}, not from {expect_file}")
            if not Path(probe["data"]).is_file():
                problems.append(f"data_path('corpus.txt') = {probe['data']} does not exist")
    return problems


# --- 3. colab: each notebook alone in an empty folder ---------------------------------------------

def setup_colab(work):
    logfile = OUT / "colab-venv.log"
    py = make_venv(work / "colab-base", logfile)
    run([py, "-m", "pip", "install", "-q", *NO_COMPILE, *COLAB_PACKAGES], logfile=logfile, env=clean_env())
    return work / "colab-base"


def installed(python):
    """{name: version} of what a venv's interpreter sees as installed (run outside the checkout,
    whose preln.egg-info would otherwise count)."""
    out = subprocess.run([str(python), "-I", "-c", "import importlib.metadata as m, json; "
                          "print(json.dumps({d.metadata['Name'].lower(): d.version for d in m.distributions()}))"],
                         capture_output=True, text=True, check=True, env=clean_env(), cwd=Path(python).parent)
    return json.loads(out.stdout)


def site_packages(python):
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                         capture_output=True, text=True, check=True, env=clean_env())
    return Path(out.stdout.strip())


def layered_venv(base, path, logfile):
    """A fresh venv whose only packages are the base venv's: it has no site-packages of its own but a
    .pth file that adds the base's (as a venv with system site-packages sees the system's). pip runs
    from there and installs into this venv, never into the base (pip does not uninstall outside the
    environment it installs into), so every notebook gets its own install, at no copying cost."""
    run([base_python(), "-m", "venv", "--without-pip", path], logfile=logfile, env=clean_env())
    python = Path(path) / "bin" / "python"
    base_site = site_packages(Path(base) / "bin" / "python")
    (site_packages(python) / "_learner_base.pth").write_text(f"import site; site.addsitedir({str(base_site)!r})\n")
    return python


def colab_jobs(work, base, wheel):
    """(label, run) for each notebook: its own venv layered on the base (see layered_venv) and its
    own empty folder."""
    requirement = f"preln[notebooks] @ {wheel.resolve().as_uri()}"
    jobs = []
    for nb in chapters() + [ASSIGNMENT]:
        label = f"{nb.parent.name}/{nb.name}" if nb == ASSIGNMENT else nb.name
        name = "colab-" + (f"assignment-{nb.stem}" if nb == ASSIGNMENT else nb.stem)
        venv = work / "venvs" / name
        folder = work / "alone" / name

        def job(nb=nb, name=name, venv=venv, folder=folder):
            venv.parent.mkdir(parents=True, exist_ok=True)
            python = layered_venv(base, venv, OUT / f"{name}.log")
            folder.mkdir(parents=True)
            shutil.copy2(nb, folder / nb.name)            # the notebook, alone
            env = clean_env(PRELN_INSTALL=requirement)
            summary = execute(folder / nb.name, python, folder, OUT / "colab" / f"{name}.ipynb", name, work, env)
            return summary, dict(expect_install=requirement, venv=venv)
        jobs.append((f"colab  {label}", job))
    return jobs


# --- 4. binder: every chapter from book/ in binder/'s environment ---------------------------------

def setup_binder(work):
    logfile = OUT / "binder-venv.log"
    runtime = (ROOT / "binder" / "runtime.txt").read_text().strip()
    if not runtime.startswith("python-"):
        raise Failure(f"binder/runtime.txt: expected python-X.Y; got {runtime!r}")
    py = make_venv(work / "binder", logfile, python=base_python(runtime.split("-", 1)[1]))
    # as repo2docker does: pip install -r binder/requirements.txt, run in the checkout (-e . is it)
    run([py, "-m", "pip", "install", "-q", *NO_COMPILE, "-r", ROOT / "binder" / "requirements.txt"], cwd=ROOT,
        logfile=logfile, env=clean_env(PIP_CONSTRAINT=None))
    # repo2docker's base environment has the kernel; the pins of requirements.txt choose its version
    run([py, "-m", "pip", "install", "-q", *NO_COMPILE, "ipykernel"], logfile=logfile, env=clean_env())
    return work / "binder"


def chapter_imports():
    """The top-level modules the chapters' code cells import (absolute imports only)."""
    import ast
    names = set()
    for nb in chapters():
        for cell in json.loads(nb.read_text())["cells"]:
            if cell["cell_type"] != "code":
                continue
            src = "".join(cell["source"])
            src = "\n".join(l for l in src.splitlines() if not l.lstrip().startswith(("%", "!")))
            for node in ast.walk(ast.parse(src)):
                if isinstance(node, ast.Import):
                    names |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names.add(node.module.split(".")[0])
    return sorted(names)


def check_binder_imports(venv):
    """Import, in the binder venv from book/, every module the chapters import; the failures."""
    mods = chapter_imports()
    code = ("import importlib, json\nbad = {}\nfor m in %r:\n    try: importlib.import_module(m)\n"
            "    except Exception as e: bad[m] = f'{type(e).__name__}: {e}'\nprint(json.dumps(bad))" % (mods,))
    p = subprocess.run([str(venv / "bin" / "python"), "-c", code], cwd=ROOT / "book", env=clean_env(),
                       capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        return [f"the import check exited {p.returncode}: {p.stderr[-2000:]}"], mods
    bad = json.loads(p.stdout.strip().splitlines()[-1])
    return [f"{m} does not import in binder/'s environment: {e}" for m, e in bad.items()], mods


def binder_jobs(work, venv, run_all=False):
    jobs = []
    def imports_job():
        t0 = time.monotonic()
        problems, mods = check_binder_imports(venv)
        return {"seconds": time.monotonic() - t0, "cpu_seconds": 0, "problems": problems,
                "modules": mods}, None
    jobs.append(("binder imports of every chapter", imports_job))
    for nb in chapters():
        if not run_all and nb.name not in BINDER_CHAPTERS:
            continue
        def job(nb=nb):
            summary = execute(nb, venv / "bin" / "python", ROOT / "book", OUT / "binder" / nb.name,
                              "binder-" + nb.stem, work, clean_env())
            # binder/requirements.txt installs this checkout editable: preln/ is the one imported
            return summary, dict(expect_install=None, venv=venv, expect_file=ROOT / "preln" / "__init__.py")
        jobs.append((f"binder {nb.name}", job))
    return jobs


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="plain,colab,binder",
                    help="comma-separated steps among plain, colab, binder (the wheel is always built)")
    ap.add_argument("--jobs", type=int, default=2, help="notebooks executed at a time (default 2)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder with the venvs")
    ap.add_argument("--binder-all", action="store_true",
                    help="binder: execute every chapter, not only " + ", ".join(BINDER_CHAPTERS))
    ap.add_argument("--execute", help=argparse.SUPPRESS)
    ap.add_argument("--python", help=argparse.SUPPRESS)
    ap.add_argument("--cwd", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--kernel-name", help=argparse.SUPPRESS)
    ap.add_argument("--kernels", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.execute:
        return execute_one(args)
    steps = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(steps) - {"plain", "colab", "binder"}
    if unknown:
        ap.error(f"--only: expected steps among plain, colab, binder; got {sorted(unknown)}")
    if args.jobs < 1:
        ap.error(f"--jobs: expected at least 1; got {args.jobs}")

    from preln import __version__ as version        # this venv's (editable) install of the checkout

    t_start = time.monotonic()
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    work = Path(tempfile.mkdtemp(prefix="preln-learner-"))
    if work.resolve().is_relative_to(ROOT):
        raise SystemExit(f"the temporary folder {work} is inside the checkout: set TMPDIR elsewhere")
    before, files_before = tree_hashes(ROOT / "book", ROOT / "assignments"), book_files()
    failures, timings = [], {}
    try:
        t0 = time.monotonic()
        wheel = build_wheel(work)
        timings["wheel"] = time.monotonic() - t0
        log(f"wheel: {wheel.name} carries every module and data file ({timings['wheel']:.0f} s)")

        # One pool of ``--jobs`` workers for everything: the venvs first (binder's, the longest, at
        # once), and each environment's notebooks as soon as it is ready, so the cores never idle.
        setups = {"binder": lambda: setup_binder(work), "colab": lambda: setup_colab(work),
                  "plain": lambda: check_plain(work, wheel, version)}

        def timed(step):
            t0 = time.monotonic()
            result = setups[step]()
            timings[f"{step} setup"] = time.monotonic() - t0
            return result

        t0 = time.monotonic()
        base_packages = None
        with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
            pending = {pool.submit(timed, s): ("setup", s) for s in setups if s in steps}
            while pending:
                done, _ = concurrent.futures.wait(pending, return_when=concurrent.futures.FIRST_COMPLETED)
                for future in done:
                    kind, label = pending.pop(future)
                    if kind == "setup":
                        try:
                            env = future.result()
                        except Failure as e:
                            failures.append(f"{label}: {e}")
                            log(f"{label}: FAILED: {e}")
                            continue
                        secs = timings[f"{label} setup"]
                        if label == "plain":
                            log(f"plain: pip install <wheel>, then python -m preln in an empty folder: ok ({secs:.0f} s)")
                            continue
                        log(f"{label}: venv ready ({secs:.0f} s)")
                        if label == "colab":
                            base_packages = (env, installed(env / "bin" / "python"))
                            if "preln" in base_packages[1]:
                                failures.append("colab: the base venv has preln before any notebook ran")
                        jobs = colab_jobs(work, env, wheel) if label == "colab" else binder_jobs(work, env, args.binder_all)
                        pending |= {pool.submit(job): ("notebook", name) for name, job in jobs}
                        continue
                    try:
                        summary, expectations = future.result()
                        problems = (summary["problems"] if expectations is None
                                    else judge(summary, version=version, **expectations))
                    except Exception as e:        # a job that could not even start its notebook
                        summary, problems = {"seconds": None}, [f"{type(e).__name__}: {e}"]
                    secs = (f"{summary['seconds']:.0f} s, CPU {summary.get('cpu_seconds', 0):.0f} s"
                            if summary.get("seconds") is not None else "-")
                    if problems:
                        failures.append(f"{label}: " + "\n    ".join(problems))
                        log(f"{label}: FAILED ({secs})\n    " + "\n    ".join(p[-2500:] for p in problems))
                    elif expectations is None:
                        log(f"{label}: all {len(summary['modules'])} modules import "
                            f"({', '.join(summary['modules'])}; {summary['seconds']:.0f} s)")
                    else:
                        log(f"{label}: executed without an error ({secs})")
        timings["environments and notebooks"] = time.monotonic() - t0
        if base_packages is not None and installed(base_packages[0] / "bin" / "python") != base_packages[1]:
            failures.append("colab: the notebooks' installs changed the base venv they are layered on")
    finally:
        if args.keep:
            log(f"kept {work}")
        else:   # rm is much faster than shutil.rmtree over the venvs' tens of thousands of files
            subprocess.run(["rm", "-rf", str(work)], check=False)

    after, files_after = tree_hashes(ROOT / "book", ROOT / "assignments"), book_files()
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    if changed:
        failures.append(f"notebooks in the checkout changed while executing copies: {changed}")
    litter = sorted(files_after - files_before)
    if litter:
        failures.append(f"executing the chapters from book/ left new files there: {litter}")
    total = time.monotonic() - t_start
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    timings["CPU time of all it ran"] = children.ru_utime + children.ru_stime
    (OUT / "timings.json").write_text(json.dumps({k: round(v, 1) for k, v in timings.items()} | {"total": round(total, 1)}, indent=1))
    steps_run = ", ".join(steps)
    if failures:
        log(f"FAILED ({len(failures)}) after {total:.0f} s; executed copies and logs in {OUT}:")
        for f in failures:
            print("  - " + f.replace("\n", "\n    "), flush=True)
        return 1
    log(f"every step passed ({steps_run}; {total:.0f} s in all: "
        + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items()) + f"); logs in {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
