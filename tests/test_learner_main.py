"""`python -m preln` and help(preln): the version, a module -> chapter map that covers every module
of the package and every chapter of the book, and how to open the book and run the notebooks."""
from __future__ import annotations

import pydoc
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import preln
from preln import __main__ as cli
from tests.book_toc import toc_files

ROOT = Path(__file__).resolve().parents[1]
REPO_URL = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"].rstrip("/")
TOC_CHAPTERS = [f.split("/", 1)[1] for f in toc_files() if (ROOT / (f + ".ipynb")).is_file()]
# chapter-column words that are not notebooks
OTHER_USERS = {"every chapter", "assignments", "make bench", "python -m preln.parallel"}


def modules_of_the_package():
    out = set()
    for p in (ROOT / "preln").rglob("*.py"):
        parts = p.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts[-1] != "__main__" and parts != ("preln",):
            out.add(".".join(parts))
    return out


def test_map_parses_into_rows():
    rows = cli.chapter_map()
    assert len(rows) >= 12          # one row per layer package and foundation module
    for module, chapters, what in rows:
        assert module.startswith("preln.") and chapters and what, (module, chapters, what)


def test_map_names_real_modules_and_chapters():
    known = set(TOC_CHAPTERS) | OTHER_USERS
    for module, chapters, _ in cli.chapter_map():
        assert module in modules_of_the_package(), f"the map names {module}, which does not exist"
        assert set(chapters) <= known, f"{module}: unknown chapter(s) {set(chapters) - known}"


def test_map_covers_every_module():
    listed = [m for m, _, _ in cli.chapter_map()]
    assert len(listed) == len(set(listed)), "a module is listed twice"
    # a listed package covers its submodules unless they have a line of their own
    uncovered = sorted(m for m in modules_of_the_package()
                       if not any(m == ln or m.startswith(ln + ".") for ln in listed))
    assert not uncovered, (f"modules missing from the map in preln/__init__.py's docstring: {uncovered} "
                           "(add a line: module, the chapters it serves, what it is)")


def test_map_covers_every_chapter():
    served = {c for _, chapters, _ in cli.chapter_map() for c in chapters}
    assert TOC_CHAPTERS and not set(TOC_CHAPTERS) - served, (
        f"chapters no module claims in the map: {sorted(set(TOC_CHAPTERS) - served)}")


def test_help_starts_with_the_map():
    text = pydoc.render_doc(preln, renderer=pydoc.plaintext)
    description = text[text.index("DESCRIPTION"):]
    assert description.index(cli.MAP_HEADING) < description.index("PACKAGE CONTENTS")
    assert description.index(cli.MAP_HEADING) < 1500, "the map is not near the start of help(preln)"
    for module, _, _ in cli.chapter_map():
        assert module in description[:description.index("PACKAGE CONTENTS")]


def test_report_gives_version_map_and_how_to_run(capsys):
    assert cli.main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"preln {preln.__version__}: ")
    assert str(Path(preln.__file__).resolve().parent) in out
    assert cli.map_text() in out
    assert f"The repository: {REPO_URL}" in out
    assert f'pip install "preln[notebooks] @ git+{REPO_URL}@v{preln.__version__}"' in out
    assert "make lab" in out and "make book" in out and "Binder" in out and "Colab" in out


def test_map_option_prints_the_map_alone(capsys):
    assert cli.main(["--map"]) == 0
    out = capsys.readouterr().out
    assert out.strip() == cli.map_text().strip()
    assert "``" not in out


def test_help_says_the_whole_purpose(capsys):
    """--help gives the docstring's first paragraph whole (it was cut at the first line's end)."""
    with pytest.raises(SystemExit) as stop:
        cli.main(["--help"])
    assert stop.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert cli.help_description().endswith("run its notebooks.")
    assert cli.help_description() in out and "--map" in out and "--version" in out


def test_version_option(capsys):
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out == preln.__version__ + "\n"


def test_python_m_preln_from_outside_the_checkout(tmp_path):
    p = subprocess.run([sys.executable, "-m", "preln"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[0].startswith(f"preln {preln.__version__}")
    assert "BLAS:" in p.stdout


def test_repository_url_is_the_installed_metadata():
    assert cli.repository_url() == REPO_URL
