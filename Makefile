# preln — one entry point for readers, learners, instructors and CI.
#   make book        create .venv, install, build the site into _build/html
#   make test        everything CI checks: unit tests, notebooks (nbval), strict build, browser tests
#   make lab         JupyterLab on book/ with preln importable
#   make notebooks   re-execute every notebook in book/ in place (stores fresh outputs)
#   make bench       the benchmark table

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
NOTEBOOKS := $(sort $(wildcard book/*.ipynb))
# nbval: memory addresses and timings differ between runs; the sanitizer file says how to mask them.
NBVAL  := --nbval --nbval-sanitize-with tests/nbval_sanitize.cfg --nbval-current-env

.PHONY: install book test test-unit test-notebooks test-site lab notebooks bench clean

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
	$(BIN)/jupyter-book build --all -W -n --keep-going .
	@echo "The site is in $(CURDIR)/_build/html — open file://$(CURDIR)/_build/html/index.html"

test: test-unit test-notebooks test-site

test-unit: install
	$(BIN)/python -m pytest -q tests --ignore=tests/browser

test-notebooks: install
	$(BIN)/python -m pytest -q $(NBVAL) $(NOTEBOOKS)

test-site: book
	$(BIN)/python -m pytest -q tests/browser

lab: install
	$(BIN)/jupyter lab book/

notebooks: install
	$(BIN)/jupyter nbconvert --to notebook --execute --inplace --ExecutePreprocessor.timeout=600 $(NOTEBOOKS)

bench: install
	$(BIN)/python -m preln.bench

clean:
	rm -rf _build .pytest_cache
