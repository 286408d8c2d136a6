"""BatchNorm (preln/ops/batchnorm.py): gradient checks, running statistics, eval mode, bad input,
and torch.nn.BatchNorm1d as the reference (optional: skipped when torch is not installed)."""
import numpy as np
import pytest

from preln.gradcheck import check_op_gradient, rel_error
from preln.ops import BatchNorm1d, batchnorm_backward, batchnorm_forward, layer_norm_forward

FD_TOL = 1e-7        # hand-written backward vs central differences (float64)
EXACT_TOL = 1e-12    # the same float64 computation done two ways
TORCH_TOL = 1e-12    # float64 numpy vs float64 torch (different summation order only)
SHAPES = [(6, 4), (2, 5, 3)]   # (N, C) and (B, S, C), channels last


def _stats(C):
    return np.zeros(C), np.ones(C)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("training", [True, False])
def test_gradients_match_finite_differences(shape, training):
    rng = np.random.default_rng(0)
    C = shape[-1]
    x = 2.0 * rng.standard_normal(shape) + 0.5
    gamma, beta = 1 + 0.3 * rng.standard_normal(C), 0.3 * rng.standard_normal(C)
    rm, rv = 0.1 * rng.standard_normal(C), 1 + rng.random(C)

    def forward(x, gamma, beta):   # fresh copies: the running statistics must not drift between calls
        return batchnorm_forward(x, gamma, beta, rm.copy(), rv.copy(), training=training)

    errors = check_op_gradient(forward, batchnorm_backward, {"x": x, "gamma": gamma, "beta": beta},
                               ("x", "gamma", "beta"), rng=np.random.default_rng(1))
    for name, err in errors.items():
        assert err < FD_TOL, (name, err)


@pytest.mark.parametrize("shape", SHAPES)
def test_training_normalises_each_channel_and_updates_running_stats(shape):
    rng = np.random.default_rng(2)
    C = shape[-1]
    x = 3.0 * rng.standard_normal(shape) - 1.0
    rm, rv = _stats(C)
    y, cache = batchnorm_forward(x, np.ones(C), np.zeros(C), rm, rv, momentum=0.25)
    flat = x.reshape(-1, C)
    n = flat.shape[0]
    assert np.abs(y.reshape(-1, C).mean(0)).max() < EXACT_TOL                  # mean 0 per channel
    var = flat.var(0)
    assert np.abs(y.reshape(-1, C).var(0) - var / (var + 1e-5)).max() < EXACT_TOL   # biased var
    np.testing.assert_allclose(rm, 0.25 * flat.mean(0), rtol=0, atol=EXACT_TOL)
    np.testing.assert_allclose(rv, 0.75 + 0.25 * flat.var(0, ddof=1), rtol=0, atol=EXACT_TOL)
    assert n > 1 and not np.allclose(flat.var(0, ddof=1), var)                  # the two differ


def test_eval_uses_running_stats_and_leaves_them_alone():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 3))
    rm, rv = np.array([0.5, -1.0, 2.0]), np.array([4.0, 0.25, 1.0])
    rm0, rv0 = rm.copy(), rv.copy()
    y, _ = batchnorm_forward(x, np.ones(3), np.zeros(3), rm, rv, training=False)
    assert np.abs(y - (x - rm0) / np.sqrt(rv0 + 1e-5)).max() < EXACT_TOL
    np.testing.assert_array_equal(rm, rm0)
    np.testing.assert_array_equal(rv, rv0)
    y1, _ = batchnorm_forward(x[:1], np.ones(3), np.zeros(3), rm, rv, training=False)
    assert np.abs(y1 - y[:1]).max() < EXACT_TOL      # eval: a row does not depend on its batch


def test_training_output_depends_on_the_batch_layernorm_does_not():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((8, 4))
    rm, rv = _stats(4)
    y_all, _ = batchnorm_forward(x, np.ones(4), np.zeros(4), rm, rv)
    y_half, _ = batchnorm_forward(x[:4], np.ones(4), np.zeros(4), rm, rv)
    assert np.abs(y_all[:4] - y_half).max() > 0.01                             # BN: it does
    ln_all = layer_norm_forward(x, np.ones(4), np.zeros(4))[0]
    ln_half = layer_norm_forward(x[:4], np.ones(4), np.zeros(4))[0]
    np.testing.assert_array_equal(ln_all[:4], ln_half)                         # LN: it does not


def test_batchnorm1d_class_accumulates_and_counts():
    rng = np.random.default_rng(5)
    bn = BatchNorm1d(3, momentum=0.5)
    assert bn.training and bn.num_batches_tracked == 0
    x, dy = rng.standard_normal((5, 3)), rng.standard_normal((5, 3))
    bn(x)
    dx1 = bn.backward(dy)
    bn(x)
    dx2 = bn.backward(dy)
    np.testing.assert_array_equal(dx1, dx2)
    assert bn.num_batches_tracked == 2
    _, dgamma, dbeta = batchnorm_backward(dy, batchnorm_forward(x, np.ones(3), np.zeros(3),
                                                                *_stats(3))[1])
    assert rel_error(bn.grads["weight"], 2 * dgamma) < EXACT_TOL               # gradients add up
    assert rel_error(bn.grads["bias"], 2 * dbeta) < EXACT_TOL
    # two updates with momentum 0.5 from (0, 1): running = 0.75 * batch + 0.25 * initial
    np.testing.assert_allclose(bn.running_mean, 0.75 * x.mean(0), atol=EXACT_TOL)
    np.testing.assert_allclose(bn.running_var, 0.25 + 0.75 * x.var(0, ddof=1), atol=EXACT_TOL)
    assert bn.eval() is bn and not bn.training
    bn(x)
    assert bn.num_batches_tracked == 2                                          # eval does not count
    bn.zero_grad()
    assert not bn.grads["weight"].any()


# ---- bad input --------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, error, words", [
    ({"x": np.zeros(4)}, ValueError, "x: expected (N, C) or (B, S, C)"),
    ({"x": np.zeros((1, 4))}, ValueError, "more than 1 value per channel"),
    ({"x": np.zeros((0, 4))}, ValueError, "non-empty"),
    ({"x": np.array([["a"] * 4] * 2)}, TypeError, "x: expected an array of real numbers"),
    ({"x": np.ones((3, 4), dtype=int)}, TypeError, "x: expected a floating-point array"),
    ({"gamma": np.ones(3)}, ValueError, "gamma: expected shape (C,) = (4,)"),
    ({"beta": np.ones((4, 1))}, ValueError, "beta: expected shape (C,)"),
    ({"running_mean": [0.0] * 4}, TypeError, "running_mean: expected a numpy array"),
    ({"running_var": np.ones(5)}, ValueError, "running_var: expected shape (C,) = (4,)"),
    ({"running_var": np.ones(4, dtype=int)}, TypeError, "running_var: expected a float array"),
    ({"momentum": 1.5}, ValueError, "momentum: expected a number in [0, 1]"),
    ({"momentum": None}, ValueError, "momentum"),
    ({"eps": 0.0}, ValueError, "eps: expected a positive number"),
    ({"training": "yes"}, TypeError, "training: expected True or False"),
])
def test_bad_input_names_the_argument(kwargs, error, words):
    args = {"x": np.ones((3, 4)), "gamma": np.ones(4), "beta": np.zeros(4),
            "running_mean": np.zeros(4), "running_var": np.ones(4)}
    args.update(kwargs)
    with pytest.raises(error) as info:
        batchnorm_forward(**args)
    assert words in str(info.value)


def test_float32_stays_float32_with_float64_statistics_buffers():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((6, 4)).astype(np.float32)
    y, cache = batchnorm_forward(x, np.ones(4), np.zeros(4), np.zeros(4), np.ones(4))
    dx, dgamma, dbeta = batchnorm_backward(np.ones_like(x), cache)
    assert y.dtype == dx.dtype == dgamma.dtype == dbeta.dtype == np.float32
    y64, _ = batchnorm_forward(x.astype(np.float64), np.ones(4), np.zeros(4), np.zeros(4), np.ones(4))
    assert np.abs(y - y64).max() < 1e-5                        # float32 round-off only


def test_bad_backward_and_class_input():
    x = np.ones((3, 4))
    _, cache = batchnorm_forward(x + np.arange(3)[:, None], np.ones(4), np.zeros(4), *_stats(4))
    with pytest.raises(ValueError, match="dy: expected the shape"):
        batchnorm_backward(np.ones((3, 5)), cache)
    with pytest.raises(TypeError, match="cache: expected the BatchNormCache"):
        batchnorm_backward(x, (x, None))
    with pytest.raises(RuntimeError, match="no forward"):
        BatchNorm1d(4).backward(x)
    with pytest.raises(ValueError, match="num_features: expected a positive int"):
        BatchNorm1d(0)


# ---- PyTorch as the reference ----------------------------------------------------------------

@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("momentum", [0.1, 0.3])
def test_matches_torch_batchnorm1d_training_and_eval(shape, momentum):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(6)
    C = shape[-1]
    ref = torch.nn.BatchNorm1d(C, momentum=momentum).double()
    gamma, beta = 1 + 0.3 * rng.standard_normal(C), 0.3 * rng.standard_normal(C)
    with torch.no_grad():
        ref.weight.copy_(torch.from_numpy(gamma))
        ref.bias.copy_(torch.from_numpy(beta))
    bn = BatchNorm1d(C, momentum=momentum)
    bn.params = {"weight": gamma.copy(), "bias": beta.copy()}
    bn.grads = {k: np.zeros_like(v) for k, v in bn.params.items()}
    # torch wants the channel second: (N, C) as is, (B, S, C) as (B, C, S)
    to_torch = (lambda a: torch.from_numpy(a)) if len(shape) == 2 else \
        (lambda a: torch.from_numpy(a).permute(0, 2, 1))
    from_torch = (lambda t: t.detach().numpy()) if len(shape) == 2 else \
        (lambda t: t.detach().permute(0, 2, 1).numpy())
    for step in range(3):                                     # three training steps
        x = 2.0 * rng.standard_normal(shape) + step
        dy = rng.standard_normal(shape)
        xt = to_torch(x.copy()).requires_grad_(True)
        yt = ref(xt)
        (yt * to_torch(dy)).sum().backward()
        y = bn(x)
        dx = bn.backward(dy)
        assert rel_error(y, from_torch(yt)) < TORCH_TOL
        assert rel_error(dx, from_torch(xt.grad)) < TORCH_TOL
        assert rel_error(bn.running_mean, ref.running_mean.numpy()) < TORCH_TOL
        assert rel_error(bn.running_var, ref.running_var.numpy()) < TORCH_TOL
    assert rel_error(bn.grads["weight"], ref.weight.grad.numpy()) < TORCH_TOL
    assert rel_error(bn.grads["bias"], ref.bias.grad.numpy()) < TORCH_TOL
    assert bn.num_batches_tracked == int(ref.num_batches_tracked)
    ref.eval()
    bn.eval()
    x = rng.standard_normal(shape)
    xt = to_torch(x.copy()).requires_grad_(True)
    yt = ref(xt)
    dy = rng.standard_normal(shape)
    (yt * to_torch(dy)).sum().backward()
    assert rel_error(bn(x), from_torch(yt)) < TORCH_TOL
    assert rel_error(bn.backward(dy), from_torch(xt.grad)) < TORCH_TOL
