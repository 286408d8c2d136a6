"""The whole block: gradient checks of dx and every parameter, train/eval, state, structure.

Gradient checks run on tiny float64 blocks (B=2, S=4, D=8, H=2, F=16) so that perturbing every one
of the ~600 parameters stays fast. The loss is L = sum(y * w) with a random w, so dL/dy = w.
"""
import numpy as np
import pytest

from preln import BlockConfig, PreLNTransformerBlock, TransformerBlock, default_heads, param_shapes
from preln.gradcheck import numerical_gradient, rel_error

#: analytic vs central-difference gradients (eps = 1e-6) in float64
GRAD_RTOL_F64 = 1e-7
#: the same float64 computation done two ways (tiled vs plain attention, eval vs train backward)
SAME_F64 = 1e-12
#: the same float32 computation done two ways, relative to the output's scale
SAME_F32 = 1e-6
#: the same for a parameter gradient, a sum over every position (B * S terms): float32's
#: round-off in a sum of n terms grows like sqrt(n) * 6e-8 (2e-6 for 1200 terms), and the order
#: of the sum is the BLAS kernel's choice (1.2e-6 measured under OpenBLAS's SkylakeX kernels)
SAME_F32_SUM = 1e-5
#: seed of the dropout generator, re-set before every forward so every forward draws the same masks
DROPOUT_SEED = 5

PADDING = np.array([[False, False, False, True],     # the last key of sequence 0 is padding
                    [False, True, False, False]])    # key 1 of sequence 1


def scaled_error(a, b):
    """max|a - b| / max(1, max|b|): absolute for O(1) outputs, relative for large ones."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(1.0, np.abs(b).max()))


def block_gradient_errors(block, x, kpm, rng):
    """rel_error of dx and of every parameter gradient against central differences."""
    w = rng.standard_normal(x.shape)

    def loss(xv):
        block.rng = np.random.default_rng(DROPOUT_SEED)          # the same dropout masks every time
        return float(np.sum(block(xv, kpm) * w))

    block.zero_grad()
    block.rng = np.random.default_rng(DROPOUT_SEED)
    block(x, kpm)
    dx = block.backward(w)
    errors = {"x": rel_error(dx, numerical_gradient(loss, x))}
    for name in list(block.params):
        original = block.params[name]

        def loss_p(value, name=name):
            block.params[name] = value
            return loss(x)
        numeric = numerical_gradient(loss_p, original)
        block.params[name] = original
        errors[name] = rel_error(block.grads[name], numeric)
    return errors


VARIANTS = {
    "plain": dict(),
    "padding": dict(kpm=True),
    "causal": dict(causal=True),
    "dropout": dict(dropout=0.2),
    "all": dict(kpm=True, causal=True, dropout=0.2),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("norm_first", [True, False], ids=["preln", "postln"])
def test_block_gradients(norm_first, variant, rng, block_factory):
    opts = dict(VARIANTS[variant])
    kpm = PADDING if opts.pop("kpm", False) else None
    block = block_factory(norm_first=norm_first, **opts)
    x = rng.standard_normal((2, 4, 8))
    errors = block_gradient_errors(block, x, kpm, rng)
    assert set(errors) == {"x"} | set(param_shapes(block.config))
    bad = {k: v for k, v in errors.items() if not v < GRAD_RTOL_F64}
    assert not bad, bad
    if block.config.dropout:
        assert not block.cache.mlp.hidden_mask.all()            # dropout was really applied


@pytest.mark.parametrize("activation", ["gelu_tanh", "relu"])
@pytest.mark.parametrize("norm_first", [True, False], ids=["preln", "postln"])
def test_block_gradients_other_activations(norm_first, activation, rng, block_factory):
    block = block_factory(norm_first=norm_first, activation=activation)
    errors = block_gradient_errors(block, rng.standard_normal((2, 4, 8)), PADDING, rng)
    bad = {k: v for k, v in errors.items() if not v < GRAD_RTOL_F64}
    assert not bad, bad


# ---- structure --------------------------------------------------------------------------------
def _silence_branches(block):
    sd = block.state_dict()
    for k in ("self_attn.out_proj.weight", "self_attn.out_proj.bias", "linear2.weight", "linear2.bias"):
        sd[k][...] = 0
    block.load_state_dict(sd)


def _ln(x, eps=1e-5):
    return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps)


def test_preln_is_identity_when_the_branches_output_zero(rng, block_factory):
    """Pre-LN: y = x + Attn(LN(x)) + MLP(...): the residual stream passes x through untouched."""
    block = block_factory(norm_first=True)
    _silence_branches(block)
    x = rng.standard_normal((2, 4, 8)) * 5
    np.testing.assert_array_equal(block(x), x)


def test_postln_normalises_the_residual_stream(rng, block_factory):
    """Post-LN: y = LN2(x1 + MLP(x1)), x1 = LN1(x + Attn(x)): with silent branches y = LN(LN(x))."""
    block = block_factory(norm_first=False)
    _silence_branches(block)
    x = rng.standard_normal((2, 4, 8)) * 5
    np.testing.assert_allclose(block(x), _ln(_ln(x)), rtol=0, atol=SAME_F64)


def test_padded_query_rows_are_computed_like_any_other_row(rng, block_factory):
    """Only keys are masked: a padded position whose input equals a visible one's gets its output."""
    block = block_factory()
    x = rng.standard_normal((2, 4, 8))
    x[0, 3] = x[0, 1]                 # position 3 is padding, position 1 is not, same input
    y = block(x, PADDING)
    assert np.isfinite(y).all()
    np.testing.assert_allclose(y[0, 3], y[0, 1], rtol=0, atol=SAME_F64)


def test_product_card_self_test(rng):
    """The one-liner ``PreLNTransformerBlock(d_model=16).forward(x)`` is the block its docstring
    promises: Pre-LN, default_heads(D) heads, d_ff = 4 D, float32, seed 0 -- bit for bit the block
    configured by hand -- and its output is not the input passed through."""
    x = rng.standard_normal((2, 4, 16))
    card = PreLNTransformerBlock(d_model=16)
    y = card.forward(x)
    cfg = card.config
    assert (cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.norm_first) == (16, default_heads(16), 64, True)
    assert y.dtype == np.float32 and y.shape == x.shape
    by_hand = TransformerBlock(BlockConfig(d_model=16, n_heads=default_heads(16), d_ff=64, norm_first=True),
                               dtype=np.float32, seed=0)
    np.testing.assert_array_equal(y, by_hand(x))
    assert np.abs(y - x).max() > 0.1       # both branches add something at PyTorch's initialisation


# ---- state and gradients ------------------------------------------------------------------------
def test_state_dict_keys_shapes_and_round_trip(block_factory):
    a, b = block_factory(seed=1), block_factory(seed=2)
    sd = a.state_dict()
    assert {k: v.shape for k, v in sd.items()} == param_shapes(a.config)
    assert len(sd) == 12
    sd["linear1.weight"][...] = 0                 # a copy: the block is not changed
    assert np.abs(a.params["linear1.weight"]).max() > 0
    b.load_state_dict(a.state_dict())
    x = np.random.default_rng(0).standard_normal((1, 3, 8))
    np.testing.assert_array_equal(a(x), b(x))


def test_gradients_accumulate_until_zero_grad(rng, block_factory):
    block = block_factory()
    x, w = rng.standard_normal((2, 4, 8)), rng.standard_normal((2, 4, 8))
    block(x)
    block.backward(w)
    once = {k: g.copy() for k, g in block.grads.items()}
    block(x)
    block.backward(w)
    for k in once:
        np.testing.assert_allclose(block.grads[k], 2 * once[k], rtol=SAME_F64, atol=0)
    block.zero_grad()
    assert all(not g.any() for g in block.grads.values())


def test_cache_nbytes_reports_the_training_cache(block_factory, rng):
    block = block_factory(dropout=0.1)
    assert block.cache_nbytes() == 0                 # nothing kept before a forward
    B, S = 2, 4
    block(rng.standard_normal((B, S, 8)))
    probs = B * block.config.n_heads * S * S * 8     # the float64 (B, H, S, S) probabilities
    assert block.cache_nbytes() >= probs + B * block.config.n_heads * S * S   # + the bool dropout mask


# ---- train / eval -------------------------------------------------------------------------------
def test_dropout_only_in_training_mode(rng, block_factory):
    block = block_factory(dropout=0.5)
    reference = block_factory(dropout=0.0, state_dict=block.state_dict())
    x = rng.standard_normal((2, 4, 8))
    assert block.training
    y1, y2 = block(x), block(x)
    assert np.abs(y1 - y2).max() > 1e-3                       # two draws of the masks
    block.eval()
    e1, e2 = block(x), block(x)
    np.testing.assert_array_equal(e1, e2)                     # eval is deterministic
    state = block.rng.bit_generator.state
    block(x)
    assert block.rng.bit_generator.state == state             # and draws nothing
    assert scaled_error(e1, reference(x)) < SAME_F64          # eval = no dropout
    assert block.train() is block and block.training


@pytest.mark.parametrize("dtype, tol, sum_tol", [(np.float32, SAME_F32, SAME_F32_SUM),
                                                 (np.float64, SAME_F64, SAME_F64)])
@pytest.mark.parametrize("norm_first", [True, False], ids=["preln", "postln"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_eval_tiled_equals_train_plain(dtype, tol, sum_tol, norm_first, causal, rng):
    """S = 600 spans 3 query tiles and 2 key tiles of the default tiling (256 x 512)."""
    B, S, D = 2, 600, 16
    cfg = BlockConfig(d_model=D, n_heads=2, d_ff=32, norm_first=norm_first, causal=causal)
    block = TransformerBlock(cfg, dtype=dtype, seed=3)
    kpm = np.zeros((B, S), bool)
    kpm[0, 550:] = True
    kpm[1, :300] = True              # with causal, queries 0..299 of sequence 1 see no key at all
    x = rng.standard_normal((B, S, D)).astype(dtype)
    w = rng.standard_normal((B, S, D)).astype(dtype)

    y_train = block(x, kpm)
    assert block.cache.attn.sdpa.p is not None               # training keeps P
    dx_train = block.backward(w)
    g_train = {k: g.copy() for k, g in block.grads.items()}

    block.eval().zero_grad()
    y_eval = block(x, kpm)
    assert block.cache.attn.sdpa.p is None                   # eval ran tiled and kept no P
    assert y_eval.dtype == dtype and np.isfinite(y_eval).all()
    assert scaled_error(y_eval, y_train) < tol
    dx_eval = block.backward(w)                               # backward after eval: P recomputed
    assert scaled_error(dx_eval, dx_train) < tol
    for k in g_train:
        assert scaled_error(block.grads[k] / max(1.0, np.abs(g_train[k]).max()),
                            g_train[k] / max(1.0, np.abs(g_train[k]).max())) < sum_tol, k


def test_eval_with_dropout_config_equals_train_backward_without_dropout(rng, block_factory):
    block = block_factory(dropout=0.3)
    reference = block_factory(dropout=0.0, state_dict=block.state_dict())
    x, w = rng.standard_normal((2, 4, 8)), rng.standard_normal((2, 4, 8))
    block.eval()
    y = block(x, PADDING)
    dx = block.backward(w)
    assert scaled_error(y, reference(x, PADDING)) < SAME_F64
    assert scaled_error(dx, reference.backward(w)) < SAME_F64
    for k in block.grads:
        assert scaled_error(block.grads[k], reference.grads[k]) < SAME_F64, k


# ---- one forward, swapped components ------------------------------------------------------------
@pytest.mark.parametrize("norm_first", [True, False])
def test_block_forward_with_a_swapped_linear_is_the_blocks_own_forward(norm_first, rng):
    """int8.block_forward (the quantised variants' float reference) is TransformerBlock.forward
    with its linears swapped: given the block's own linear it is the op-by-op block bit for bit,
    it calls the four linears in the forward's order, and it records every named intermediate."""
    from preln.ops import linear_forward
    from preln.quant.int8 import block_forward
    from preln.nn.block import LINEAR_PARAMS
    cfg = BlockConfig(d_model=16, n_heads=2, d_ff=32, norm_first=norm_first, causal=True)
    b = TransformerBlock(cfg, dtype=np.float64, seed=1, attention="plain", fused=False).eval()
    x = rng.standard_normal((2, 5, 16))
    calls, rec = [], {}

    def linear(name, h):
        calls.append(name)
        w, bias = LINEAR_PARAMS[name]
        return linear_forward(h, b.params[w], b.params[bias])[0]

    y = block_forward(b.params, cfg, x, linear=linear, record=rec)
    assert calls == ["in_proj", "out_proj", "linear1", "linear2"]
    assert np.array_equal(y, b(x))
    order = ["ln1", "in_proj", "attn", "out_proj", "residual1", "ln2", "linear1", "act", "linear2", "y"]
    if not norm_first:          # Post-LN: the attention reads x, the norm follows the residual
        order = ["in_proj", "attn", "out_proj", "residual1", "ln1", "linear1", "act", "linear2", "ln2", "y"]
    assert list(rec) == order
    assert np.array_equal(rec["residual1"], x + rec["out_proj"])


def test_mode_must_be_a_bool(block_factory):
    b = block_factory()
    with pytest.raises(TypeError, match=r"mode: expected True or False; got 'eval'"):
        b.train("eval")
    assert b.eval().training is False and b.train().training is True
