"""The course edition's grader (``pip install preln[course]``; book/running.md, "Grading").

    python -m preln.grade SUBMISSIONS [--jobs N] [--out DIR]   autograde, sandboxed (cli.py)
    python -m preln.grade.release [--check]                    student notebooks from the sources
    python -m preln.grade.mutate [--per-question]              how many mutants the hidden checks catch
    python -m preln.grade.bench_grading                        seconds per notebook for a class
    python -m preln.grade.make_fixtures                        the fixture class of tests/

The parts: nbtools (reading nbgrader notebooks), checks (the hidden checks' plans and verdicts),
wire (results as data), namecheck, views (the student's view of preln), sandbox (bubblewrap),
autograde (nbgrader's Execute replaced), feedback (the feedback page, students' HTML made inert),
sandbox_lib/ (what runs inside the sandbox, standalone
modules copied there), edition/ (the instructor edition: the clone's assignments/, or its copy in a
wheel). A top layer: it imports the rest of preln; nothing in preln imports it.
"""
