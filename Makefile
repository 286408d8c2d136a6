# preln — one entry point for readers, learners, instructors and CI.
#   make book            create .venv, install, build the site into _build/html (strict: warnings fail)
#   make test            everything CI checks: unit tests, notebooks (nbval), strict build, browser tests
#   make test-unit       the package's pytest suite, plus the book-structure and viz tests
#   make test-notebooks  re-execute every notebook in book/ and compare with its stored outputs,
#                        under four OpenBLAS kernels (NB_KERNELS=default for a single quick run)
#   make test-notebooks-busy  the same while two CPU-bound processes keep both cores busy
#   make test-site       build the site and its PDF, then drive every page with headless Chromium
#                        (axe-core in light and dark mode, 320 px reflow, explorables, the PDF)
#   make pdf             the whole book as one PDF (headless Chromium): _build/pdf/preln-book.pdf,
#                        also published in the site (the Course page links it)
#   make page-weight     the table of each page's HTML and first-load bytes
#   make test-course     the course edition: assignments run, release up to date, fixtures grade right
#   make assignments     student notebooks assignments/release/ from assignments/source/ (nbgrader)
#   make grade SUBMISSIONS=<dir> [ROSTER=<csv>]   autograde into _build/grades/<assignment>.csv
#                        (GRADE_ARGS="--timeout 60 --mem-mb 2048 --cpu-s 600": per-cell and kernel caps)
#   make mutation        the fraction of mutated solutions each assignment's tests catch
#   make lab             JupyterLab on book/ with preln importable
#   make notebooks       re-execute every notebook in book/ in place (stores fresh outputs)
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

.PHONY: install book test test-unit test-notebooks test-notebooks-busy test-site lab notebooks bench vendor clean \
        install-course assignments grade mutation test-course pdf page-weight

$(STAMP): requirements.txt pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), "Python >= 3.10 is needed, found " + sys.version'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements.txt
	$(BIN)/python -m pip install -q --no-deps --no-build-isolation -e .
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

install: $(STAMP)

book: install
	$(BIN)/python scripts/vendor_assets.py --check
	$(BUILD)
	@echo "The site is in $(CURDIR)/_build/html — open file://$(CURDIR)/_build/html/index.html"
	@echo "or serve it: $(BIN)/python -m http.server -d _build/html"

test: test-unit test-notebooks test-course test-site

test-unit: install
	$(ONE_THREAD) $(BIN)/python -m pytest -q tests --ignore=tests/browser --ignore-glob='tests/test_course_*.py'

# The stored outputs must be what any reader's machine computes, and OpenBLAS picks its kernels by
# CPU (other kernels, other round-off). So nbval runs every notebook under several kernels:
# "default" leaves OPENBLAS_CORETYPE unset (OpenBLAS picks by CPU), the others force a family —
# Haswell (AVX2), SkylakeX (AVX-512) and Prescott (the generic SSE3 one). Two run at a time, each on
# one BLAS thread; `make test-notebooks NB_KERNELS=default` runs one. Logs: _build/nbval/<kernel>.log.
NB_KERNELS ?= default Haswell SkylakeX Prescott
CORETYPE = $(if $(filter default,$(1)),env -u OPENBLAS_CORETYPE,env OPENBLAS_CORETYPE=$(1))

test-notebooks: install
ifeq ($(strip $(NOTEBOOKS)),)
	@echo "test-notebooks: no notebooks in book/"
else
	@$(MAKE) --no-print-directory -j2 --output-sync=target $(addprefix nbval-kernel-,$(NB_KERNELS))
	@echo "test-notebooks: every notebook reproduced its stored outputs under:" \
	  "$(filter-out $(if $(HAVE_AVX512),,$(AVX512_KERNELS)),$(NB_KERNELS))"
endif

# A learner's laptop is busy with other work: the chapters' asserted measurements must still hold.
# scripts/with_load.py starts one CPU-bound loop per core, runs the notebook tests, stops the loops.
test-notebooks-busy: install
	$(BIN)/python scripts/with_load.py --procs 2 -- $(MAKE) --no-print-directory test-notebooks NB_KERNELS="$(NB_KERNELS)"

# A forced AVX-512 kernel executes illegal instructions on a CPU without AVX-512 (OpenBLAS trusts
# OPENBLAS_CORETYPE): there that run is reported as NOT RUN, and the other kernels still run.
AVX512_KERNELS := SkylakeX
HAVE_AVX512 := $(shell grep -qs avx512f /proc/cpuinfo && echo yes)

nbval-kernel-%: install
	@mkdir -p _build/nbval
	@if [ -n "$(filter $*,$(AVX512_KERNELS))" ] && [ "$(HAVE_AVX512)" != yes ]; then \
	  echo "== nbval, OpenBLAS kernel: $* NOT RUN: this CPU has no AVX-512, so $*'s kernels cannot execute here"; \
	  exit 0; fi; \
	echo "== nbval, OpenBLAS kernel: $* (runs: $$($(call CORETYPE,$*) $(BIN)/python -c \
	  'import numpy; from preln.blas import openblas_corenames as f; print(*sorted(set(f())))'))"; \
	$(call CORETYPE,$*) $(ONE_THREAD) $(BIN)/python -m pytest -q -p no:cacheprovider \
	  $(NBVAL) $(NOTEBOOKS) > _build/nbval/$*.log 2>&1 \
	  && tail -n 2 _build/nbval/$*.log \
	  || { cat _build/nbval/$*.log; echo "nbval FAILED under OpenBLAS kernel $*"; exit 1; }

# --- the course edition (issue 9): nbgrader lives in requirements-course.txt, not in the reader's install
COURSE_STAMP := $(VENV)/.course-stamp

$(COURSE_STAMP): $(STAMP) requirements-course.txt
	$(BIN)/python -m pip install -q -r requirements-course.txt
	touch $(COURSE_STAMP)

install-course: $(COURSE_STAMP)

assignments: $(COURSE_STAMP)
	$(ONE_THREAD) $(BIN)/python scripts/course/release.py

grade: $(COURSE_STAMP)
	@test -n "$(SUBMISSIONS)" || { echo "usage: make grade SUBMISSIONS=<dir> [ROSTER=<csv>]"; exit 2; }
	$(ONE_THREAD) $(BIN)/python scripts/course/grade.py "$(SUBMISSIONS)" $(if $(ROSTER),--roster "$(ROSTER)") $(GRADE_ARGS)

mutation: install
	$(ONE_THREAD) $(BIN)/python scripts/course/mutate.py --per-question

test-course: $(COURSE_STAMP)
	$(ONE_THREAD) $(BIN)/python -m pytest -q -p no:cacheprovider tests/test_course.py tests/test_course_*.py

test-site: pdf
	$(BIN)/python -m pytest -q -p no:cacheprovider -m browser tests/browser
	@echo "Screenshots of every page: $(CURDIR)/_build/screenshots/"

# One PDF of the book, printed by the Debian chromium through Playwright (never a downloaded browser)
pdf: book
	$(BIN)/python scripts/make_pdf.py

page-weight: book
	$(BIN)/python scripts/page_weight.py

lab: install
	PYTHONPATH=$(CURDIR) $(BIN)/jupyter lab --notebook-dir=book $(if $(filter 0,$(shell id -u)),--allow-root)

notebooks: install
ifneq ($(strip $(NOTEBOOKS)),)
	$(ONE_THREAD) $(BIN)/jupyter nbconvert --to notebook --execute --inplace --ExecutePreprocessor.timeout=600 \
	  --ExecutePreprocessor.kernel_name=python3 $(NOTEBOOKS)
endif

bench: install
	$(BIN)/python -m preln.bench

vendor:
	$(PYTHON) scripts/vendor_assets.py

clean:
	rm -rf _build .pytest_cache
