"""The course edition, slow part 0 (`make test-course`): every assignment's plan — its hidden
regions executed in the grader with the full package — builds; the source's solutions pass it and
the release's stubs fail it, through the grader's own code (results through wire.py); and in each
question's view of preln every recorded input decodes while every declared reference is withheld."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
from preln.grade import checks  # noqa: E402
from preln.grade import nbtools  # noqa: E402
from preln.grade import views  # noqa: E402
from preln.grade import wire  # noqa: E402

NAMES = nbtools.assignments()


@pytest.fixture(params=NAMES)
def source(request):
    return request.param, nbtools.read(nbtools.source_path(request.param))


def test_plan_builds_and_the_solutions_pass_it(source):
    """The hidden regions run in the grader (here), every question records checks and withholds
    its references from its view, and the source's solutions pass every check, through the same
    code the grader uses (results through wire.py)."""
    name, nb = source
    plan = checks.build_plan(nbtools.source_path(name))
    assert set(plan.questions) == {q.key for q in nbtools.questions(nb)}
    for key, q in plan.questions.items():
        assert q.checks and q.references, (name, key)
        assert not views.leaks(views.resolve(q.modules, q.without), q.references), (name, key)
    ns = checks.exec_cells(nb, {})
    results, status = checks.run_in_process(plan, ns)
    verdicts = checks.evaluate(plan, results, status, [c.source for c in nb.cells if c.cell_type == "code"])
    failed = {k: v.lines() for k, v in verdicts.items() if not v.passed}
    assert not failed, f"{name}: the solutions fail their hidden checks: {failed}"


def test_stubs_fail_every_question(source):
    name, nb = source
    plan = checks.plan_for(nbtools.source_path(name))
    release = nbtools.read(nbtools.release_path(name))
    ns = checks.exec_cells(release, {})
    results, status = checks.run_in_process(plan, ns)
    verdicts = checks.evaluate(plan, results, status, None)
    assert not any(v.passed for v in verdicts.values()), name
    v = next(iter(verdicts.values()))
    assert any("NotImplementedError" in line for line in v.lines())


def test_each_question_sees_its_inputs_but_not_its_references(source, tmp_path):
    """In each question's view of preln (a subprocess with only the view on its path): every
    recorded input decodes (the classes it needs are there), and every reference the question
    declares is a stand-in that raises, however it is reached."""
    name, _ = source
    plan = checks.plan_for(nbtools.source_path(name))
    for gi, (key, qkeys) in enumerate(plan.groups()):
        docs = {q: plan.questions[q].inputs_document(10, 60) for q in qkeys}
        refs = sorted({r for q in qkeys for r in plan.questions[q].references})
        (tmp_path / f"calls{gi}.json").write_text(json.dumps(docs))
        view = tmp_path / f"view{gi}"
        views.build_view(view, *key)
        script = f"""
import importlib, json, sys
import wire                     # the sandbox's copy (its lib folder), as grader_capture imports it
docs = json.load(open({str(tmp_path / f'calls{gi}.json')!r}))
for q, doc in docs.items():
    trees, blobs = wire.bundle_parts(doc["inputs"])
    for t in trees:
        wire.decode(t, blobs, trusted=False)
for ref in {refs!r}:
    parts = ref.split(".")
    try:
        obj = importlib.import_module(".".join(parts[:2]))
        for p in parts[2:]:
            obj = getattr(obj, p)
        obj()
        print("REACHED", ref)
    except RuntimeError as e:
        assert "not available while your notebook is graded" in str(e), e
    except (ImportError, AttributeError):
        pass
print("ok")
"""
        lib = tmp_path / "lib"
        lib.mkdir(exist_ok=True)
        shutil.copy(wire.__file__, lib / "wire.py")
        res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                             env={"PYTHONPATH": f"{view}:{lib}", "PATH": "/usr/bin:/bin", "OPENBLAS_NUM_THREADS": "1"},
                             cwd=tmp_path)
        assert res.returncode == 0 and res.stdout.strip().endswith("ok"), (name, qkeys, res.stderr[-2000:])
        assert "REACHED" not in res.stdout, (name, qkeys, res.stdout)
