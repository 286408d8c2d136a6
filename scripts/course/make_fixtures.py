"""Write the fixture class of tests/fixtures/course/: submissions that exercise make grade.

    python scripts/course/make_fixtures.py

Each student starts from the released derivation_ops notebook and fills answers from the source's
solutions, except where noted:
  alice  every answer correct                          -> full marks
  bob    eps outside the square root (q1), softmax without the max shift (q3): plausible mistakes
  carol  q2 raises an exception, q6 left as the stub
  dave   q5 loops forever                              -> cut by the per-cell timeout
  grace  q4 allocates without bound                    -> MemoryError under the kernel's cap
  ivan   q3 calls preln.ops.softmax                    -> no credit (assert_does_not_use)
  judy   the untouched student notebook                -> zero on every coding question
  erin   a truncated, corrupt file                     -> failed
  frank  a notebook whose cell metadata was stripped   -> failed
  heidi  on the roster, no submission                  -> missing
"""
import copy
import shutil

import nbformat

import nbtools

NAME = "derivation_ops"
OUT = nbtools.ROOT / "tests" / "fixtures" / "course"

WRONG = {
    "bob": {
        "q1_layer_norm_forward": '''def layer_norm_forward(x, gamma, beta, eps=1e-5):
    mean = x.mean(axis=-1, keepdims=True)
    std = x.std(axis=-1, keepdims=True)
    return (x - mean) / (std + eps) * gamma + beta     # eps outside the square root''',
        "q3_softmax": '''def softmax(x, axis=-1):
    e = np.exp(x)                                      # no max shift: overflows at large logits
    return e / e.sum(axis=axis, keepdims=True)''',
    },
    "carol": {
        "q2_layer_norm_backward": '''def layer_norm_backward(dy, x, gamma, eps=1e-5):
    raise ValueError("I ran out of time")''',
        "q6_softmax_backward": None,                     # None: keep the stub
    },
    "dave": {
        "q5_gelu": '''def gelu(x):
    while True:                                        # never returns
        pass


def gelu_grad(x):
    while True:
        pass''',
    },
    "grace": {
        "q4_attention": '''def attention(q, k, v, key_padding_mask=None, causal=False):
    hoard = []
    while True:                                        # allocates until the kernel's cap
        hoard.append(np.ones(2**24))''',
    },
    "ivan": {
        "q3_softmax": '''import preln.ops

def softmax(x, axis=-1):
    return preln.ops.softmax(x, axis=axis)''',
    },
}


def solution(cell):
    """The answer cell with its solution regions filled in (delimiter lines dropped)."""
    return "\n".join(ln for ln in cell.source.split("\n")
                     if nbtools.BEGIN_SOLUTION not in ln and nbtools.END_SOLUTION not in ln)


def filled(release, source, overrides):
    nb = copy.deepcopy(release)
    answers = {nbtools.grade_id(c): c for c in source.cells if nbtools.nbgrader_meta(c).get("solution")}
    for cell in nb.cells:
        gid = nbtools.grade_id(cell)
        if gid in answers and cell.cell_type == "code":
            if gid in overrides:
                if overrides[gid] is not None:
                    cell.source = overrides[gid]
            else:
                cell.source = solution(answers[gid])
    return nb


def main():
    release = nbtools.read(nbtools.release_path(NAME))
    source = nbtools.read(nbtools.source_path(NAME))
    subs = OUT / "submissions"
    shutil.rmtree(subs, ignore_errors=True)

    def write(student, nb):
        path = subs / student / NAME / f"{NAME}.ipynb"
        path.parent.mkdir(parents=True)
        nbformat.write(nb, str(path))
        return path

    write("alice", filled(release, source, {}))
    for student, overrides in WRONG.items():
        write(student, filled(release, source, overrides))
    write("judy", copy.deepcopy(release))
    text = (write("erin", filled(release, source, {}))).read_text()
    (subs / "erin" / NAME / f"{NAME}.ipynb").write_text(text[: len(text) // 2])   # cut mid-file
    stripped = filled(release, source, {})
    for cell in stripped.cells:
        cell.metadata = {}
    write("frank", stripped)
    students = sorted([p.name for p in subs.iterdir()] + ["heidi"])
    (OUT / "roster.csv").write_text("student\n" + "\n".join(students) + "\n")
    print(f"wrote {len(students) - 1} submissions and roster.csv into {OUT.relative_to(nbtools.ROOT)}")


if __name__ == "__main__":
    main()
