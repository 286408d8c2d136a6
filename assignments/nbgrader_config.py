# nbgrader configuration of the course edition (issue 9). The course directory is assignments/:
#   source/<name>/<name>.ipynb    instructors' notebooks: solutions, hidden tests, mark schemes
#   release/<name>/<name>.ipynb   student notebooks, made by `make assignments` (committed)
# `make grade` does not grade here: scripts/course/grade.py copies source/ into a temporary course
# directory with its own gradebook, so grading never writes into the repository.
c = get_config()  # noqa: F821 (nbgrader provides it)

c.CourseDirectory.course_id = "preln"
c.CourseDirectory.source_directory = "source"
c.CourseDirectory.release_directory = "release"
# Only the notebook is handed out: nothing else from source/<name>/ (no data files are needed).
c.CourseDirectory.include = ["*.ipynb"]

# What replaces a solution region in the student notebook.
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"

# Per-cell time limit when grading: an answer that loops forever loses its question only.
c.Execute.timeout = 60
