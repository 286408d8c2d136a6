# preln — one entry point for readers, learners, instructors and CI.
#   make book            create .venv, install, build the site into _build/html (strict: warnings fail)
#   make test            everything CI checks: unit tests, notebooks (nbval), strict build, browser tests
#   make test-unit       the package's pytest suite, plus the book-structure and viz tests
#   make test-notebooks  re-execute every notebook in book/ and compare with its stored outputs
#   make test-site       build the site, then drive every page with headless Chromium
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

.PHONY: install book test test-unit test-notebooks test-site lab notebooks bench vendor clean

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

test: test-unit test-notebooks test-site

test-unit: install
	$(ONE_THREAD) $(BIN)/python -m pytest -q tests --ignore=tests/browser

test-notebooks: install
ifeq ($(strip $(NOTEBOOKS)),)
	@echo "test-notebooks: no notebooks in book/"
else
	$(ONE_THREAD) $(BIN)/python -m pytest -q -p no:cacheprovider $(NBVAL) $(NOTEBOOKS)
endif

test-site: book
	$(BIN)/python -m pytest -q -p no:cacheprovider -m browser tests/browser
	@echo "Screenshots of every page: $(CURDIR)/_build/screenshots/"

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
