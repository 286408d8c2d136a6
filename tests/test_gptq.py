"""Weight-only group quantisation (preln.quant.groups), GPTQ (preln.quant.gptq) and AWQ (preln.quant.awq): grids
and their error bounds, GPTQ equal to the exact sequential least-squares (OBQ) updates solved by
brute force, lazy batches equal to eager updates, GPTQ below round-to-nearest on calibration data,
AWQ's search, and the quantised LM."""
import numpy as np
import pytest

from preln.quant import groups as gq
from preln.quant import weight_only
from preln.quant.awq import awq, awq_scales
from preln.quant.gptq import gptq, hessian, inverse_hessian_factor
from preln.models.lm import LMConfig, TinyLM
from preln.nn.block import LINEAR_PARAMS, TransformerBlock

#: float64 linear algebra computed two ways (Cholesky updates vs least squares from scratch)
LSTSQ_TOL = 1e-9
#: the same sums in another order (lazy batches vs eager updates)
REORDER_TOL = 1e-12
#: a grid's rounding error bound, up to float64 round-off of the division
HALF_STEP = 0.5 * (1 + 1e-12)
#: float32 products of the same weights in another order (BLAS, the tiled kernels)
FLOAT32_TOL = 2e-5


def correlated_inputs(rng, N, K, salient=()):
    """Activations with correlated channels, as real layer inputs have; ``salient`` channels 8x."""
    x = rng.standard_normal((N, K)) @ (np.eye(K) + 0.5 * rng.standard_normal((K, K)) / np.sqrt(K))
    x[:, list(salient)] *= 8.0
    return x


# ---- the grid --------------------------------------------------------------------------------------
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("bits, group_size", [(2, 4), (3, 8), (4, None), (8, 16)])
def test_rtn_grid_and_error_bound(bits, group_size, symmetric):
    rng = np.random.default_rng(bits)
    w = rng.standard_normal((6, 32))
    g = gq.rtn(w, bits, group_size, symmetric)
    G = 32 if group_size is None else group_size
    assert g.scale.shape == g.zero.shape == (6, 32 // G) and g.group_size == G
    lo, hi = (-(2 ** (bits - 1) - 1), 2 ** (bits - 1) - 1) if symmetric else (0, 2 ** bits - 1)
    assert g.q.min() >= lo and g.q.max() <= hi
    step = np.repeat(g.scale, G, axis=1)                              # (6, 32)
    assert np.all(np.abs(g.dequantize() - w) <= HALF_STEP * step)    # |w - w^| <= S / 2
    if not symmetric:                                 # a group's negative minimum gets code 0
        has_negative = w.reshape(6, -1, G).min(-1) < 0
        assert np.all(g.q.reshape(6, -1, G).min(-1)[has_negative] == 0)
        assert np.array_equal(g.zero, np.rint(g.zero))
    zero = np.zeros((2, 8))
    assert np.array_equal(gq.rtn(zero, bits, group_size if group_size and group_size <= 8 else None,
                                 symmetric).dequantize(), zero)      # 0 is exactly representable


def test_storage_and_packing():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 16))
    g = gq.rtn(w, 4, 8)
    # 64 codes of 4 bits + 8 groups x (a 4-bit zero point + a float16 scale)
    assert g.nbytes() == (64 * 4 + 8 * 4) // 8 + 8 * 2
    assert gq.rtn(w, 4, 8, symmetric=True).nbytes() == 64 * 4 // 8 + 8 * 2
    q = g.q.astype(np.uint8)
    packed = gq.pack_int4(q, 8)
    assert packed.shape == (4, 8) and packed.dtype == np.uint8
    assert packed[1, 0] == q[1, 0] | (q[1, 4] << 4)                  # byte k: col k and col k + g/2
    assert packed[1, 5] == q[1, 9] | (q[1, 13] << 4)                 # group 1 (cols 8..15), byte 1
    assert np.array_equal(gq.unpack_int4(packed, 8), q)
    with pytest.raises(ValueError, match="4-bit codes"):
        gq.pack_int4(q + 10, 8)


def test_grid_bad_input():
    w = np.zeros((4, 12))
    with pytest.raises(ValueError, match="group_size: expected a divisor of the K = 12"):
        gq.rtn(w, 4, 5)
    with pytest.raises(ValueError, match="bits"):
        gq.rtn(w, 1)
    with pytest.raises(ValueError, match="w: expected a 2-D"):
        gq.rtn(np.zeros(12))


# ---- GPTQ ------------------------------------------------------------------------------------------
def sequential_least_squares(w0, x, bits, group_size, damp):
    """The exact optimal-brain-quantiser (OBQ) procedure in GPTQ's fixed column order, every step
    solved from scratch.

    Objective: E(W^) = || X_a W0^T - X_a W^^T ||_F^2 with X_a = [X; sqrt(lam) I] (N + K rows),
    lam = damp * mean(diag(X^T X)) -- i.e. (W0 - W^)(X^T X + lam I)(W0 - W^)^T summed over rows,
    the damped objective GPTQ minimises. For i = 0, 1, ..., K - 1: with columns < i fixed at their
    quantised values Q_{<i}, the columns >= i take the real values W*_{>=i} that minimise E (a
    linear least-squares problem, solved here by np.linalg.lstsq on X_a: no inverse Hessian, no
    Cholesky factor, no update formula); then column i is rounded to its group's grid, the grid of
    a group chosen from W* of its columns when its first column is reached. OBQ's closed-form
    update (Frantar & Alistarh 2022, arXiv 2208.11580, Eq. 3; Optimal Brain Surgeon, Hassibi &
    Stork 1993) is exactly the change of this minimiser when one more weight is fixed, so GPTQ --
    the same update in a fixed order, for all rows at once, from the Cholesky factor of H^-1 --
    must reproduce W*_i before every rounding, and hence the same integers.

    Returns (Q codes (M, K), [W*_i before rounding column i, for every i]).
    """
    M, K = w0.shape
    lam = damp * np.mean(np.diag(x.T @ x))
    xa = np.vstack([x, np.sqrt(lam) * np.eye(K)])                    # (N + K, K)
    target = xa @ w0.T                                                # (N + K, M)
    g = K if group_size is None else group_size
    q_val = np.zeros((M, K))                                          # quantised values so far
    codes = np.zeros((M, K))
    before = []
    scale = zero = None
    for i in range(K):
        rhs = target - xa[:, :i] @ q_val[:, :i].T
        w_free = np.linalg.lstsq(xa[:, i:], rhs, rcond=None)[0].T    # (M, K - i): W*_{>=i}
        before.append(w_free[:, 0].copy())
        if i % g == 0:
            scale, zero = gq.group_grid(w_free[:, :g], bits)
        codes[:, i], q_val[:, i] = gq.round_to_grid(w_free[:, 0], scale[:, 0], zero[:, 0], bits)
    return codes, before


@pytest.mark.parametrize("bits, group_size, damp", [(2, None, 0.0), (3, 2, 0.01), (2, 3, 0.1),
                                                    (4, None, 0.01)])
def test_gptq_equals_the_exact_obq_updates(bits, group_size, damp):
    rng = np.random.default_rng(bits * 7 + (group_size or 0))
    M, K, N = 3, 6, 40                                                # a tiny layer
    w = rng.standard_normal((M, K))
    x = correlated_inputs(rng, N, K)
    codes, before = sequential_least_squares(w, x, bits, group_size, damp)
    for block_size in ([K, 3] if group_size in (None, 3) else [K, 2, 4]):
        trace = []
        g = gptq(w, x, bits, group_size, block_size=block_size, damp=damp, trace=trace)
        assert [i for i, _ in trace] == list(range(K))
        for (i, col), ref in zip(trace, before):
            assert np.abs(col - ref).max() < LSTSQ_TOL, (i, col, ref)
        assert np.array_equal(g.q, codes)


@pytest.mark.parametrize("group_size, block_size", [(None, 8), (8, 16), (16, 8), (4, 32)])
def test_lazy_batches_equal_eager_updates(group_size, block_size):
    rng = np.random.default_rng(1)
    w = rng.standard_normal((16, 64))
    x = correlated_inputs(rng, 256, 64)
    eager = gptq(w, x, 3, group_size, block_size=64)                  # one block: every update at once
    lazy = gptq(w, x, 3, group_size, block_size=block_size)
    assert np.array_equal(eager.q, lazy.q)
    assert np.abs(eager.dequantize() - lazy.dequantize()).max() < REORDER_TOL


def test_inverse_hessian_factor():
    rng = np.random.default_rng(2)
    x = correlated_inputs(rng, 50, 7)
    u = inverse_hessian_factor(hessian(x), damp=0.0)
    assert np.allclose(np.triu(u), u) and np.allclose(u.T @ u, np.linalg.inv(x.T @ x))
    # row i of U is the first row of the inverse of H restricted to columns i.. over its root
    h = hessian(x)
    for i in range(7):
        hf = np.linalg.inv(h[i:, i:])
        assert np.allclose(u[i, i:], hf[0] / np.sqrt(hf[0, 0]))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("bits, group_size", [(3, None), (4, 16), (2, 8)])
def test_gptq_beats_round_to_nearest_on_calibration_data(bits, group_size, seed):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((32, 64))
    x = correlated_inputs(rng, 512, 64)
    e_rtn = np.linalg.norm(x @ (w - gq.rtn(w, bits, group_size).dequantize()).T)
    e_gptq = np.linalg.norm(x @ (w - gptq(w, x, bits, group_size).dequantize()).T)
    assert e_gptq < 0.95 * e_rtn                   # 0.86 to 0.91 on these inputs


def test_gptq_on_the_reference_lm_layers():
    """On the trained model's own activations, every linear layer's ||W X - W^ X|| is lower with
    GPTQ than with round to nearest, at 3 and 4 bits."""
    from preln.models import pretrained
    from preln.quant.int8 import LINEAR_WEIGHTS, block_forward
    from preln.models.corpus import load_corpus
    lm, _, _ = pretrained.reference_lm()
    _, _, ids = load_corpus()
    calib = pretrained.split_ids(ids)[0][:1024].reshape(16, 64)
    h = lm.own["tok_emb.weight"][calib] + lm.own["pos_emb.weight"][:64]
    for layer in lm.stack.layers:
        seen = {}

        def record(name, x, p=layer.params):
            seen[name] = x
            w, b = LINEAR_WEIGHTS[name]
            return x @ p[w].T + p[b]

        h = block_forward(layer.params, layer.config, h, linear=record)
        for name, x in seen.items():
            w = layer.params[LINEAR_WEIGHTS[name][0]]
            for bits, group in ((3, None), (4, 16)):
                e_rtn = np.linalg.norm(x @ (w - gq.rtn(w, bits, group).dequantize()).T)
                e_gptq = np.linalg.norm(x @ (w - gptq(w, x, bits, group).dequantize()).T)
                assert e_gptq < e_rtn, (name, bits, group)


def test_gptq_bad_input_and_dead_inputs():
    w = np.ones((2, 8))
    with pytest.raises(ValueError, match="x: expected \\(N, K\\) calibration inputs with K = 8"):
        gptq(w, np.ones((10, 7)))
    with pytest.raises(ValueError, match="block_size"):
        gptq(w, np.ones((10, 8)), group_size=4, block_size=3)
    with pytest.raises(ValueError, match="damp"):
        gptq(w, np.ones((10, 8)), damp=-1)
    x = np.random.default_rng(0).standard_normal((20, 8))
    x[:, 2] = 0.0                                                     # an input that never varies
    g = gptq(np.random.default_rng(1).standard_normal((2, 8)), x, 4)
    assert np.all(g.dequantize()[:, 2] == 0) and np.all(np.isfinite(g.dequantize()))


# ---- AWQ -------------------------------------------------------------------------------------------
def test_awq_alpha_zero_is_round_to_nearest_and_search_never_loses():
    rng = np.random.default_rng(3)
    w = rng.standard_normal((16, 32))
    x = correlated_inputs(rng, 256, 32, salient=(1, 7))
    assert np.array_equal(awq_scales(x, 0.0), np.ones(32))
    res = awq(w, x, 3, 8)
    assert res.losses[0] == pytest.approx(np.mean((x @ (gq.rtn(w, 3, 8).dequantize() - w).T) ** 2))
    assert res.losses.min() == res.losses[list(res.alphas).index(res.alpha)] <= res.losses[0]
    s = awq_scales(x, res.alpha)
    assert np.allclose(res.scale, s) and np.sqrt(s.max() * s.min()) == pytest.approx(1.0)


def test_awq_protects_salient_channels():
    """Channels whose activations are large and whose weights are small -- the injected outliers
    of the INT8 chapter -- lose their weights to rounding under RTN; AWQ scales them up first."""
    rng = np.random.default_rng(4)
    w = rng.standard_normal((16, 32))
    x = correlated_inputs(rng, 256, 32)
    c, salient = 32.0, [3, 17]
    x_out, w_out = x.copy(), w.copy()
    x_out[:, salient] *= c                                            # the same function: x W^T
    w_out[:, salient] /= c
    assert np.allclose(x_out @ w_out.T, x @ w.T)
    y = x @ w.T
    err = lambda w_hat, xs=x_out: np.linalg.norm(xs @ w_hat.T - y) / np.linalg.norm(y)
    e_rtn = err(gq.rtn(w_out, 4, 8).dequantize())
    res = awq(w_out, x_out, 4, 8)
    e_awq = err(res.quant.dequantize(), x_out / res.scale)
    assert res.alpha > 0.3 and e_awq < 0.5 * e_rtn


# ---- the quantised LM ------------------------------------------------------------------------------
def small_lm():
    cfg = LMConfig(vocab_size=11, max_len=16, d_model=16, n_heads=2, d_ff=32, n_layers=2)
    return TinyLM(cfg, dtype=np.float64, seed=0).eval()


@pytest.mark.parametrize("method", weight_only.METHODS)
def test_quantize_model_tiny_lm(method):
    lm = small_lm()
    tokens = np.random.default_rng(0).integers(0, 11, (4, 16))
    q8 = weight_only.quantize_model(lm, method, 8, None, tokens)
    ref = lm(tokens)
    rel = np.linalg.norm(q8(tokens) - ref) / np.linalg.norm(ref)
    assert rel < 0.05                                                 # 8 bits: close to float
    q2 = weight_only.quantize_model(lm, method, 2, 8, tokens)
    assert np.linalg.norm(q2(tokens) - ref) / np.linalg.norm(ref) > rel
    # the tiled layout: 2-bit codes packed two per byte, a float32 scale and a one-byte zero point
    # per group, the float32 bias (and AWQ's float32 input scales) -- under 40 % of float32's bytes at K = 16
    shapes = [b.params[w].shape for b in lm.stack.layers for w, _ in LINEAR_PARAMS.values()]
    awq_scales = 4 if method == "awq" else 0
    assert q2.weight_nbytes() == sum(M * K // 2 + 5 * M * K // 8 + 4 * M + awq_scales * K for M, K in shapes)
    assert q2.weight_nbytes() < 0.4 * sum(4 * M * (K + 1) for M, K in shapes)
    assert list(q2.blocks[0].linears) == list(LINEAR_PARAMS)


def test_a_quantised_tiny_lm_is_a_tiny_lm_of_transformer_blocks_with_swapped_linears():
    """The quantised TinyLM is the TinyLM class over TransformerBlocks whose linears are QuantLinears:
    its logits are a float32 TinyLM's with the dequantised weights (and the same biases) loaded,
    and decoding with its KV cache gives the forward's logits."""
    lm = small_lm()
    tokens = np.random.default_rng(1).integers(0, 11, (2, 12))
    q = weight_only.quantize_model(lm, "awq", 4, 8, tokens)
    assert isinstance(q, TinyLM) and all(type(b).__mro__[2] is TransformerBlock for b in q.blocks)
    ref = TinyLM(lm.config, dtype=np.float32, seed=1).eval()
    state = {k: v for k, v in lm.params.items()}
    for i, b in enumerate(q.blocks):
        for name, (w, bias) in LINEAR_PARAMS.items():
            state[f"stack.layers.{i}.{w}"] = b.linears[name].dequantize()    # AWQ's 1 / s included
            state[f"stack.layers.{i}.{bias}"] = b.linears[name].bias
    ref.own = {k: state[k].astype(np.float32) for k in ref.own}
    ref.stack.load_state_dict({k[len("stack."):]: v for k, v in state.items() if k.startswith("stack.")})
    np.testing.assert_allclose(q(tokens), ref(tokens), rtol=FLOAT32_TOL, atol=FLOAT32_TOL)
    kv = q.kv_cache(2, 12)
    steps = np.concatenate([q.decode(tokens[:, :5], kv)] + [q.decode(tokens[:, t:t + 1], kv) for t in range(5, 12)], 1)
    np.testing.assert_allclose(steps, q(tokens), rtol=FLOAT32_TOL, atol=FLOAT32_TOL)
    with pytest.raises(RuntimeError, match="inference-only"):
        q.blocks[0].backward(np.zeros((1, 1, 16), np.float32))


def test_quantize_model_bad_input():
    lm = small_lm()
    with pytest.raises(ValueError, match="method"):
        weight_only.quantize_model(lm, "gguf")
    with pytest.raises(ValueError, match="calib"):
        weight_only.quantize_model(lm, "gptq", 4)
    with pytest.raises(TypeError, match="lm"):
        weight_only.quantize_model(lm.stack, "rtn")
    with pytest.raises(TypeError, match="options"):
        weight_only.quantize_model(lm, "rtn", damp=0.1)
    with pytest.raises(ValueError, match="head: a TinyLM's head stays float32"):
        weight_only.quantize_model(lm, "rtn", head=True)


def test_the_hessian_is_factored_never_inverted(monkeypatch):
    """GPTQ reads U off a Cholesky factor of H and one triangular solve: a general inverse is
    neither needed nor called (np.linalg.inv raising here would fail the run)."""
    def no_inverse(*_):
        raise AssertionError("np.linalg.inv called")
    rng = np.random.default_rng(5)
    x = correlated_inputs(rng, 40, 6)
    expected = np.linalg.cholesky(np.linalg.inv(hessian(x) + 0.01 * np.mean(np.diag(hessian(x))) * np.eye(6))).T
    monkeypatch.setattr(np.linalg, "inv", no_inverse)
    u = inverse_hessian_factor(hessian(x))
    assert np.abs(u - expected).max() < REORDER_TOL * np.abs(expected).max()
    gptq(rng.standard_normal((4, 6)), x, bits=3)                  # the whole quantiser, no inverse
