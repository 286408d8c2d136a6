"""The gradient-check helpers themselves (preln.gradcheck): a checker that cannot fail checks nothing."""
import numpy as np
import pytest

from preln.gradcheck import (check_op_gradient, elementwise_rel_error, numerical_gradient,
                             random_functional, rel_error)
from preln.ops import linear_backward, linear_forward

#: central differences with eps = 1e-6 on smooth O(1) float64 functions
GRAD_RTOL_F64 = 1e-7


def test_numerical_gradient_of_a_known_function(rng):
    x = rng.standard_normal((3, 4))
    g = numerical_gradient(lambda a: np.sum(a ** 3), x)       # d/dx sum x^3 = 3 x^2
    assert g.shape == x.shape and g.dtype == np.float64
    assert rel_error(g, 3 * x ** 2) < GRAD_RTOL_F64


def test_numerical_gradient_does_not_modify_its_input(rng):
    x = rng.standard_normal(5)
    before = x.copy()
    numerical_gradient(lambda a: np.sum(np.sin(a)), x)
    np.testing.assert_array_equal(x, before)


def test_numerical_gradient_works_in_float64_for_float32_input(rng):
    x = rng.standard_normal(4).astype(np.float32)
    seen = []
    numerical_gradient(lambda a: (seen.append(a.dtype), float(np.sum(a * a)))[1], x)
    assert set(seen) == {np.dtype(np.float64)}


def test_rel_error_divides_by_the_global_scale():
    a, b = np.array([1.0, 2.0]), np.array([1.0, 2.5])
    assert rel_error(a, b) == pytest.approx(0.5 / 4.5)   # max|a-b| / max(|a|+|b|)
    a, b = np.array([4.0, 1.0]), np.array([4.0, 1.5])
    assert rel_error(a, b) == pytest.approx(0.5 / 8.0)   # not 0.5 / 2.5: the largest entry
    assert rel_error(a, a) == 0.0
    assert rel_error(np.zeros(3), np.full(3, 1e-12)) == pytest.approx(1e-4)   # floor 1e-8
    with pytest.raises(ValueError, match=r"b: expected the shape of a"):
        rel_error(np.zeros(2), np.zeros(3))


def test_elementwise_rel_error_is_cs231n():
    """CS231n's rel_error: np.max(np.abs(x - y) / np.maximum(1e-8, np.abs(x) + np.abs(y)))."""
    a, b = np.array([4.0, 1.0]), np.array([4.0, 1.5])
    assert elementwise_rel_error(a, b) == pytest.approx(0.5 / 2.5)
    assert elementwise_rel_error(np.zeros(3), np.full(3, 1e-12)) == pytest.approx(1e-4)
    with pytest.raises(ValueError, match=r"b: expected the shape of a"):
        elementwise_rel_error(np.zeros(2), np.zeros(3))


def test_what_each_error_measure_misses():
    # an error confined to the small entries: 100 % wrong where the gradient is 1e-6 of the largest
    a, b = np.array([1.0, 1e-6, -1e-6]), np.array([1.0, -1e-6, 1e-6])
    assert rel_error(a, b) == pytest.approx(1e-6)        # passes a loose 1e-5 tolerance
    assert elementwise_rel_error(a, b) == pytest.approx(1.0)    # caught
    # finite-difference noise on an exact zero: elementwise raises a false alarm
    a, b = np.array([1.0, 0.0]), np.array([1.0, 1e-10])
    assert elementwise_rel_error(a, b) == pytest.approx(1e-2)
    assert rel_error(a, b) == pytest.approx(5e-11)


def test_rel_error_is_not_cs231n():
    import preln.gradcheck as gc
    a, b = np.array([4.0, 1.0]), np.array([4.0, 1.5])
    assert rel_error(a, b) != pytest.approx(elementwise_rel_error(a, b))
    assert not hasattr(gc, "scaled_max_error"), "one name for one measure: rel_error"
    assert "elementwise_rel_error" in gc.__all__ and "scaled_max_error" not in gc.__all__


def test_check_op_gradient_passes_a_correct_backward_and_fails_a_wrong_one(rng):
    inputs = dict(x=rng.standard_normal((2, 3)), w=rng.standard_normal((4, 3)), b=rng.standard_normal(4))
    fwd = lambda x, w, b: linear_forward(x, w, b)
    errors = check_op_gradient(fwd, linear_backward, inputs, ("x", "w", "b"))
    assert set(errors) == {"x", "w", "b"}
    assert max(errors.values()) < GRAD_RTOL_F64

    def wrong_backward(dout, cache):        # forgets the transpose's sign convention: dW = -dout^T x
        dx, dw, db = linear_backward(dout, cache)
        return dx, -dw, db
    errors = check_op_gradient(fwd, wrong_backward, inputs, ("x", "w", "b"))
    assert errors["w"] > 0.5 and errors["x"] < GRAD_RTOL_F64


def test_check_op_gradient_names_a_wrong_wrt(rng):
    inputs = dict(x=rng.standard_normal((2, 3)), w=rng.standard_normal((4, 3)), b=rng.standard_normal(4))
    with pytest.raises(ValueError, match=r"wrt: expected 3 names.*got 1"):
        check_op_gradient(lambda x, w, b: linear_forward(x, w, b), linear_backward, inputs, ("x",))


def test_random_functional_shape(rng):
    assert random_functional((2, 3), rng).shape == (2, 3)
