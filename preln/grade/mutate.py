"""make mutation: how many plausible wrong answers do an assignment's hidden checks catch?

    python -m preln.grade.mutate [name ...] [--verbose] [--per-question] [--limit N] [--timeout S]

For every autograded question of assignments/source/<name>/<name>.ipynb, each line inside the
answer's `### BEGIN SOLUTION` region is mutated, one mutant at a time:
  const    a numeric constant c -> c + 1, and -> 0 (or 1 where c == 0)
  op       an operator swapped: + -, * /, ** *, @ *, < <=, > >=, == !=, and or, True False
  delete   the line replaced by `pass` (same indentation)
  return   a `return ...` line replaced by `return 0`
A mutant that does not compile is not counted. Each mutant runs in this process (no sandbox: it is
the instructor's own code): the notebook's setup and answer cells are executed with the mutated
answer, then the question's hidden checks are evaluated exactly as the grader evaluates them
(preln/grade/checks.py: the plan's recorded calls, results through wire.py, the same
expectations), the checks' inputs and references computed once per assignment. The mutant is CAUGHT
if the question fails (a check fails, the answer raises, or a call takes longer than --timeout).
Prints one table row per assignment: mutants, caught, the fraction caught (target >= 90 %).
"""
import argparse
import contextlib
import io
import signal
import sys
import time
import tokenize

from . import nbtools

SWAPS = {"+": "-", "-": "+", "*": "/", "/": "*", "**": "*", "@": "*", "<": "<=", "<=": "<",
         ">": ">=", ">=": ">", "==": "!=", "!=": "==", "//": "/", "and": "or", "or": "and",
         "True": "False", "False": "True"}


def line_mutants(line):
    """(kind, mutated line) for one source line."""
    stripped = line.strip()
    if not stripped or stripped.startswith("#"):
        return []
    indent = line[: len(line) - len(line.lstrip())]
    out = [("delete", indent + "pass")]
    if stripped.startswith("return ") and stripped != "return 0":
        out.append(("return", indent + "return 0"))
    try:
        toks = list(tokenize.generate_tokens(io.StringIO(line.lstrip() + "\n").readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return out
    off = len(indent)
    for tok in toks:
        if tok.start[0] != 1:
            continue
        a, b = off + tok.start[1], off + tok.end[1]
        if tok.type == tokenize.NUMBER and not tok.string.endswith(("j", "J")):
            value = float(eval(tok.string))                      # noqa: S307: a numeric literal
            for new in (f"({tok.string} + 1)", "0" if value != 0 else "1"):
                out.append(("const", line[:a] + new + line[b:]))
        elif (tok.type == tokenize.OP or tok.string in ("and", "or", "True", "False")) and tok.string in SWAPS:
            out.append(("op", line[:a] + SWAPS[tok.string] + line[b:]))
    return out


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout()


def run_question(plan, key, answer_sources, timeout):
    """None if question ``key`` passes with the notebook's answers (``answer_sources`` overriding
    cells by index), else why it fails."""
    from . import checks
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, max(timeout * 3, 30))
    try:
        ns = checks.exec_cells(plan.nb, answer_sources)
    except _Timeout:
        return "timeout"
    except Exception as e:                                   # noqa: BLE001: a mutant that breaks its cell
        return type(e).__name__
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    results, status = checks.run_in_process(plan, ns, [key], call_timeout=timeout)
    tests = {q.tests for q in nbtools.questions(plan.nb)}
    sources = [answer_sources.get(i, c.source) for i, c in enumerate(plan.nb.cells)
               if c.cell_type == "code" and i not in tests]
    verdict = checks.evaluate(plan, results, status, sources)[key]
    return None if verdict.passed else (verdict.failures[0] if verdict.failures else "failed")


def mutate_assignment(name, timeout=10.0, limit=None, verbose=False):
    """Return (rows per question, survivors); a row is (key, mutants, caught)."""
    from . import checks
    plan = checks.plan_for(nbtools.source_path(name))
    nb = plan.nb
    rows, survivors = [], []
    for q in nbtools.questions(nb):
        base = run_question(plan, q.key, {}, timeout * 3)
        if base is not None:
            raise SystemExit(f"{name} {q.key}: the solution fails its own hidden checks ({base})")
        n = caught = 0
        for idx in q.answers:
            lines = nb.cells[idx].source.split("\n")
            for li, text in nbtools.regions(nb.cells[idx].source, nbtools.BEGIN_SOLUTION, nbtools.END_SOLUTION):
                for kind, new in line_mutants(text):
                    src = "\n".join(lines[:li] + [new] + lines[li + 1:])
                    try:
                        compile(src, "<mutant>", "exec")
                    except SyntaxError:
                        continue
                    n += 1
                    reason = run_question(plan, q.key, {idx: src}, timeout)
                    if reason is None:
                        survivors.append((q.key, kind, text.strip(), new.strip()))
                        if verbose:
                            print(f"  survived {q.key} [{kind}]: {text.strip()}  ->  {new.strip()}")
                    else:
                        caught += 1
                    if limit and n >= limit:
                        break
                if limit and n >= limit:
                    break
        rows.append((q.key, n, caught))
    return rows, survivors


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*")
    ap.add_argument("--verbose", action="store_true", help="print every surviving mutant")
    ap.add_argument("--per-question", action="store_true", help="a row per question too")
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds per call of a mutant (default 10)")
    ap.add_argument("--limit", type=int, default=None, help="at most N mutants per question")
    ap.add_argument("--min", type=float, default=None, help="exit 1 if an assignment scores below this fraction")
    args = ap.parse_args(argv)
    names = args.names or nbtools.assignments()
    print("| assignment | questions | mutants | caught | score | seconds |")
    print("|---|---:|---:|---:|---:|---:|")
    low = []
    for name in names:
        t0 = time.perf_counter()
        with contextlib.redirect_stderr(io.StringIO()):
            rows, _ = mutate_assignment(name, args.timeout, args.limit, args.verbose)
        n, c = sum(r[1] for r in rows), sum(r[2] for r in rows)
        score = c / n if n else 0.0
        print(f"| {name} | {len(rows)} | {n} | {c} | {100 * score:.1f} % | {time.perf_counter() - t0:.0f} |")
        if args.per_question:
            for key, qn, qc in rows:
                print(f"|   {key} | | {qn} | {qc} | {100 * qc / max(qn, 1):.1f} % | |")
        sys.stdout.flush()
        if args.min is not None and score < args.min:
            low.append(f"{name}: {100 * score:.1f} % < {100 * args.min:.0f} %")
    if low:
        raise SystemExit("mutation score below target: " + "; ".join(low))


if __name__ == "__main__":
    main()
