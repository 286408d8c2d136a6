"""make assignments: the student edition of every assignment, with nbgrader generate_assignment.

    python -m preln.grade.release [name ...]      (default: every assignments/source/<name>)
    python -m preln.grade.release --check         (fail if a release is out of date or leaks)

For each assignment, nbgrader (config: assignments/nbgrader_config.py) writes
assignments/release/<name>/<name>.ipynb: solution regions replaced by `raise NotImplementedError()`,
written model answers by "YOUR ANSWER HERE", hidden tests removed, outputs cleared, cells locked.
--no-db: nothing is written to a gradebook (grading uses its own temporary one, see cli.py).
Then every line of a solution, hidden test or model answer is looked for in the release text, and
the generated parts of book/course.md (the assignment list, with download and launch links) and
book/running.md (time and points per assignment) are rewritten from the notebooks' headers.
"""
import argparse
import json
import re
import tempfile

from . import nbtools


def generate(names, course_root, release_root):
    """nbgrader generate_assignment for ``names``, from course_root/source into release_root.

    In-process through nbgrader's API (one Python start-up for all of them), with the settings of
    assignments/nbgrader_config.py and the effect of `nbgrader generate_assignment --no-db`.
    """
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config import Config
    from traitlets.config.loader import PyFileConfigLoader

    cfg = PyFileConfigLoader("nbgrader_config.py", path=str(nbtools.COURSE)).load_config()
    cfg.merge(Config({"CourseDirectory": {"root": str(course_root), "release_directory": str(release_root)},
                      "GenerateAssignment": {"no_database": True},     # = --no-db: no gradebook
                      "SaveCells": {"enabled": False}}))
    api = NbGraderAPI(coursedir=CourseDirectory(config=cfg), config=cfg)
    for name in names:
        res = api.generate_assignment(name, force=True, create=False)
        if not res["success"]:
            raise SystemExit(f"nbgrader generate_assignment {name} failed:\n{res.get('log')}\n{res.get('error')}")


def leaks(name, release_root=None):
    """Secret lines of the source that appear in the release notebook's text (should be none)."""
    secrets = nbtools.secret_lines(nbtools.read(nbtools.source_path(name)))
    rel = nbtools.read(nbtools.release_path(name, release_root))
    text = "\n".join(c.source for c in rel.cells)
    public = {ln.strip() for c in rel.cells for ln in c.source.split("\n")}
    return sorted(s for s in secrets if s in public or (len(s) > 20 and s in text))


def release_text(path):
    """What a student gets, without the cell ids (random when a source cell has none)."""
    nb = nbtools.read(path)
    cells = [{k: v for k, v in cell.items() if k != "id"} for cell in nb.cells]
    return json.dumps({"cells": cells, "metadata": nb.metadata}, sort_keys=True, indent=1)


COURSE_PAGE = nbtools.ROOT / "book" / "course.md" if nbtools.ROOT else None
BEGIN_TABLE, END_TABLE = "<!-- BEGIN ASSIGNMENTS (make assignments writes this part) -->", "<!-- END ASSIGNMENTS -->"


def repository():
    """(owner/name, branch) from _config.yml's repository url, for the launch links."""
    import yaml
    repo = yaml.safe_load((nbtools.ROOT / "_config.yml").read_text())["repository"]
    m = re.match(r"https://github\.com/([^/]+/[^/]+?)/?$", repo["url"])
    if not m:
        raise SystemExit(f"_config.yml repository.url: expected https://github.com/<owner>/<name>; got {repo['url']}")
    return m.group(1), repo.get("branch", "main")


def header(nb):
    """(title, summary paragraph, time) from an assignment's first cell; points from its metadata."""
    lines = nb.cells[0].source.split("\n")
    title = re.sub(r"^#\s*(Assignment\s*\d*\s*[—:-]\s*)?", "", lines[0]).strip()
    paragraphs = "\n".join(lines[1:]).strip().split("\n\n")
    summary = " ".join(paragraphs[0].split())
    time = re.search(r"\*\*Time:\*\*\s*(.+?)\.?(?:\s*\n|$)", nb.cells[0].source)
    return title, summary, time.group(1).strip() if time else "?"


def chapters_of(name, toc):
    """The chapters an assignment covers, in reading order: book/<name> and, when a chapter was
    split in two, its second part book/<name>_<part> (_toc.yml says so)."""
    files = re.findall(r"^\s*- file: book/(\S+)\s*$", toc, re.M)
    return [f for f in files if f == name or f.startswith(name + "_")] if name in files else []


def chapter_line(chapters):
    """"**Chapter:** {doc}`a`. " or "**Chapters:** {doc}`a` and {doc}`b`. " ("" for none)."""
    if not chapters:
        return ""
    links = [f"{{doc}}`{c}`" for c in chapters]
    listed = links[0] if len(links) == 1 else ", ".join(links[:-1]) + " and " + links[-1]
    return f"**Chapter{'s' if len(links) > 1 else ''}:** {listed}. "


def course_section(names):
    """The markdown of the Course page's assignment list (one subsection per assignment)."""
    repo, branch = repository()
    toc = (nbtools.ROOT / "_toc.yml").read_text()
    out = [BEGIN_TABLE, ""]
    for name in names:
        nb = nbtools.read(nbtools.source_path(name))
        title, summary, time = header(nb)
        auto, manual = nbtools.points(nb)
        n_q = len(nbtools.questions(nb))
        path = f"assignments/release/{name}/{name}.ipynb"
        out += [f"### {title}", "",
                summary, "",
                chapter_line(chapters_of(name, toc))
                + f"**Time:** {time}. **Points:** {auto + manual:g} ({n_q} coding questions, {auto:g} points "
                f"graded automatically; {manual:g} for written answers graded by hand).", "",
                # the notebook alone: no Binder link, which would open it in a copy of the whole
                # repository, next to assignments/source (the solutions and hidden checks; issue 32)
                f"**Student notebook:** {{download}}`{name}_assignment.ipynb <../{path}>` · "
                f"[open in Colab](https://colab.research.google.com/github/{repo}/blob/{branch}/{path}) "
                "(the notebook alone; its first cell installs `preln`)", ""]
    out.append(END_TABLE)
    return "\n".join(out)


def course_order(names):
    """Assignments in the order of their chapters in _toc.yml (an assignment is named after its chapter)."""
    toc = (nbtools.ROOT / "_toc.yml").read_text()
    pos = {n: toc.find(f"book/{n}\n") for n in names}
    return sorted(names, key=lambda n: (pos[n] < 0, pos[n], n))


GUIDE_PAGE = nbtools.ROOT / "book" / "running.md" if nbtools.ROOT else None
BEGIN_GUIDE, END_GUIDE = ("<!-- BEGIN ASSIGNMENT TABLE (make assignments writes this part) -->",
                          "<!-- END ASSIGNMENT TABLE -->")


def guide_table(names):
    """The instructor guide's table: time, questions and points of every assignment."""
    # a list-table, so that the table has a caption and row headers (a {table} directive cannot
    # wrap the generated-part markers)
    out = [BEGIN_GUIDE, "", "```{list-table} Time, questions and points of each assignment",
           ":header-rows: 1", ":stub-columns: 1", "", "* - assignment", "  - coding questions",
           "  - points: autograded + written", "  - time"]
    for name in names:
        nb = nbtools.read(nbtools.source_path(name))
        _, _, time = header(nb)
        auto, manual = nbtools.points(nb)
        out += [f"* - `{name}`", f"  - {len(nbtools.questions(nb))}", f"  - {auto:g} + {manual:g}", f"  - {time}"]
    return "\n".join(out + ["```", "", END_GUIDE])


def update_pages(names, check=False):
    """Rewrite the generated parts of book/course.md and book/running.md (only released assignments
    are listed: the Course page links their notebooks); with check, report a page that differs."""
    released = [n for n in course_order(names) if nbtools.release_path(n).exists()]
    problems = []
    for page, begin, end, make in ((COURSE_PAGE, BEGIN_TABLE, END_TABLE, course_section),
                                   (GUIDE_PAGE, BEGIN_GUIDE, END_GUIDE, guide_table)):
        text = page.read_text()
        a, b = text.find(begin), text.find(end)
        if a < 0 or b < 0:
            raise SystemExit(f"{page}: the markers {begin!r} ... {end!r} are missing")
        new = text[:a] + make(released) + text[b + len(end):]
        if check and new != text:
            problems.append(f"{page} is out of date with the assignments: run `make assignments`")
        elif not check:
            page.write_text(new)
    return problems


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help="assignments (default: all in assignments/source)")
    ap.add_argument("--check", action="store_true",
                    help="regenerate into a temporary folder and fail if assignments/release differs")
    args = ap.parse_args(argv)
    if nbtools.ROOT is None:
        raise SystemExit("python -m preln.grade.release writes the clone's assignments/release/ and book pages: "
                         "run it in a clone of the repository (grading needs only python -m preln.grade)")
    names = args.names or nbtools.assignments()
    problems = []
    if args.check:
        with tempfile.TemporaryDirectory() as tmp:
            generate(names, nbtools.COURSE, tmp)
            for name in names:
                fresh, ours = nbtools.release_path(name, tmp), nbtools.release_path(name)
                if not ours.exists():
                    problems.append(f"{ours} is missing: run `make assignments`")
                elif release_text(fresh) != release_text(ours):
                    problems.append(f"{ours} is out of date with its source: run `make assignments`")
    else:
        generate(names, nbtools.COURSE, nbtools.RELEASE)
    problems += update_pages(nbtools.assignments(), check=args.check)
    for name in names:
        if nbtools.release_path(name).exists():
            problems += [f"{name}: release contains a secret line: {s!r}" for s in leaks(name)]
    stale = sorted(set(p.name for p in nbtools.RELEASE.iterdir() if p.is_dir()) - set(nbtools.assignments()))
    problems += [f"assignments/release/{s} has no source: delete it" for s in stale] if not args.names else []
    for name in names:
        print(f"{name}: {'checked' if args.check else 'released'} -> {nbtools.release_path(name).relative_to(nbtools.ROOT)}")
    if problems:
        raise SystemExit("\n".join(problems))


if __name__ == "__main__":
    main()
