"""pytest plugin for `make test-unit` (loaded with `-p tests.random_order`): the collected tests in
another order, so a test that passes only after (or without) a neighbour is found.

    --test-order=SEED     modules in a seeded random order, and the tests within each module
    --test-order=reverse  modules and tests last to first

Each module's tests stay together (a module-scoped fixture, such as a loaded model, is built
once), as pytest-randomly does. Unlike pytest-randomly, which is an installed plugin and so
active in every pytest run of the venv (it shuffled nbval's notebook cells, which must run in
order), this one is active only where it is asked for. It draws from its own
``random.Random(seed)``: the global ``random`` and numpy's legacy generator, and so the tests' own
fixed seeds, are untouched. Every xdist worker orders the same collection the same way.
"""
import random

import pytest


def pytest_addoption(parser):
    parser.addoption("--test-order", default=None, metavar="SEED|reverse",
                     help="run the tests in a seeded random order (an int) or in reverse")


def _order(value):  # -> None, "reverse" or an int seed
    if value is None or value == "reverse":
        return value
    try:
        return int(value)
    except ValueError:
        raise pytest.UsageError(f"--test-order: expected an int seed or 'reverse'; got {value!r}") from None


def pytest_configure(config):
    _order(config.getoption("test_order"))              # a bad value fails before collection


def pytest_report_header(config):
    order = config.getoption("test_order")
    return None if order is None else f"test order: {order}"


def reorder(items, order):
    """``items`` grouped by module (in collection order), then reordered in place."""
    modules = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)
    groups = list(modules.values())
    if order == "reverse":
        groups = [g[::-1] for g in groups[::-1]]
    else:
        rng = random.Random(order)
        rng.shuffle(groups)
        for g in groups:
            rng.shuffle(g)
    items[:] = [item for g in groups for item in g]


@pytest.hookimpl(trylast=True)       # after the other plugins have selected and deselected
def pytest_collection_modifyitems(config, items):
    order = _order(config.getoption("test_order"))
    if order is not None:
        reorder(items, order)
