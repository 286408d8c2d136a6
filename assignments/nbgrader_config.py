# nbgrader configuration of the course edition. The course directory is assignments/:
#   source/<name>/<name>.ipynb    instructors' notebooks: solutions, hidden checks, mark schemes
#   release/<name>/<name>.ipynb   student notebooks, made by `make assignments` (committed)
# `make grade` does not grade here: python -m preln.grade copies source/ into a temporary course
# directory with its own gradebook, so grading never writes into the repository. Stock
# `nbgrader autograde` / formgrader run in this directory get the same sandbox (book/running.md).
c = get_config()  # noqa: F821 (nbgrader provides it)

c.CourseDirectory.course_id = "preln"
c.CourseDirectory.source_directory = "source"
c.CourseDirectory.release_directory = "release"
# Only the notebook is handed out: nothing else from source/<name>/ (no data files are needed).
c.CourseDirectory.include = ["*.ipynb"]

# What replaces a solution region in the student notebook.
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"

# Autograding: nbgrader's Execute (student code in a kernel with the instructor's rights, hidden
# tests inside it) is replaced by SandboxedExecute (preln/grade/autograde.py): the submission runs
# in a bubblewrap sandbox that sees neither the solutions nor the gradebook, the hidden checks'
# references and comparisons run here, and each tests cell's outputs become its verdict before
# nbgrader's SaveAutoGrades scores them. Without a working bwrap grading stops with what to install;
# c.SandboxedExecute.sandbox = False grades unprotected (make grade --no-sandbox says so per row).
# The grader is part of the package (pip install preln[course]; in a clone, pip install -e .).
from nbconvert.preprocessors import ClearMetadataPreprocessor  # noqa: E402
from nbgrader.preprocessors import (AssignLatePenalties, CheckCellMetadata, IgnorePattern,  # noqa: E402
                                    LimitOutput, SaveAutoGrades)

from preln.grade.autograde import SandboxedExecute  # noqa: E402

c.Autograde.autograde_preprocessors = [SandboxedExecute, IgnorePattern, ClearMetadataPreprocessor, LimitOutput,
                                       SaveAutoGrades, AssignLatePenalties, CheckCellMetadata]
# Per-cell time limit when grading (also each question's hidden calls): an answer that loops
# forever loses its question only. Memory and CPU caps: see SandboxedExecute's options.
c.SandboxedExecute.timeout = 60
# Partial credit (issue 32): a question whose hidden checks name requirements (preln.course.requirement)
# scores the points of the requirements it meets; all-or-nothing per question instead:
# c.SandboxedExecute.all_or_nothing = True   (make grade GRADE_ARGS=--all-or-nothing)
# Feedback (generate_feedback, formgrader's button): every student-written markdown cell rendered
# through an allow-list sanitiser, no script, handler, frame, form or style (preln/grade/feedback.py).
c.GenerateFeedback.exporter_class = "preln.grade.feedback.FeedbackExporter"
# formgrader's pages (the instructor's Jupyter origin): its exporter is a plain HTMLExporter, but its
# template sends each markdown cell through this filter after rendering it, so the same sanitiser
# applies there (its cells' outputs are already reduced to text and PNG by SandboxedExecute)
c.HTMLExporter.filters = {"strip_files_prefix": "preln.grade.feedback.strip_files_prefix"}
