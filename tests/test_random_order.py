"""tests/random_order.py, the plugin `make test-unit` runs the unit tests in another order with."""
import random

import numpy as np
import pytest

from random_order import _order, reorder


class Item:                    # what reorder reads of a pytest item
    def __init__(self, nodeid):
        self.nodeid = nodeid


def ids(items):
    return [i.nodeid for i in items]


COLLECTED = [f"tests/test_{m}.py::test_{t}" for m in "abc" for t in range(4)]


def test_reverse_keeps_each_module_together():
    items = [Item(n) for n in COLLECTED]
    reorder(items, "reverse")
    assert ids(items) == COLLECTED[::-1]


def test_a_seed_is_a_reproducible_permutation_with_modules_together():
    orders = []
    for seed in (7, 7, 8):
        items = [Item(n) for n in COLLECTED]
        reorder(items, seed)
        orders.append(ids(items))
    assert orders[0] == orders[1] != orders[2] and sorted(orders[0]) == sorted(COLLECTED)
    assert orders[0] != COLLECTED and orders[2] != COLLECTED
    modules = [n.split("::")[0] for n in orders[0]]
    assert all(len(set(modules[i:i + 4])) == 1 for i in range(0, 12, 4))   # contiguous modules


def test_the_global_generators_are_untouched():
    """The tests' own seeds: a shuffle must not draw from (or reseed) random or numpy's legacy
    generator."""
    random.seed(1)
    np.random.seed(1)
    before = (random.getstate(), np.random.get_state()[1].copy())
    reorder([Item(n) for n in COLLECTED], 3)
    assert random.getstate() == before[0] and (np.random.get_state()[1] == before[1]).all()


def test_a_bad_order_is_a_usage_error():
    assert _order("12") == 12 and _order("reverse") == "reverse" and _order(None) is None
    with pytest.raises(pytest.UsageError, match=r"--test-order: expected an int seed or 'reverse'; got 'backwards'"):
        _order("backwards")
