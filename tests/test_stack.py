"""TransformerStack: gradients against central differences (float64), names, state, PyTorch."""
import numpy as np
import pytest

from preln import BlockConfig
from preln.gradcheck import numerical_gradient, rel_error
from preln.nn.stack import TransformerStack, xavier_normal_params

GRAD_TOL = 1e-7   # float64 central differences with eps = 1e-6


def tiny(norm_first, n_layers=2, causal=False, **kw):
    cfg = BlockConfig(d_model=8, n_heads=2, d_ff=12, norm_first=norm_first, causal=causal,
                      activation="gelu")
    return TransformerStack(cfg, n_layers, dtype=np.float64, seed=3, **kw)


def param_check(stack, x, w, name, mask=None):
    p = stack.params[name]
    def f(v):
        old = p.copy()
        p[...] = v
        out = float(np.sum(stack(x, mask) * w))
        p[...] = old
        return out
    return rel_error(stack.grads[name], numerical_gradient(f, p))


@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("init", ["torch", "xavier"])
def test_gradients(norm_first, init):
    stack = tiny(norm_first, init=init)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 8))            # (B, S, D)
    w = rng.standard_normal((2, 3, 8))            # L = sum(y * w)
    mask = np.array([[False, False, True], [False, False, False]])
    stack.zero_grad()
    stack(x, mask)
    dx = stack.backward(w)
    assert rel_error(dx, numerical_gradient(lambda v: np.sum(stack(v, mask) * w), x)) < GRAD_TOL
    names = ["layers.0.linear1.weight", "layers.0.self_attn.in_proj_weight", "layers.1.norm2.bias",
             "layers.1.self_attn.out_proj.weight", "layers.0.norm1.weight"]
    if norm_first:
        names += ["norm.weight", "norm.bias"]
    for name in names:
        assert param_check(stack, x, w, name, mask) < GRAD_TOL, name


def test_final_norm_default_and_names():
    pre, post = tiny(True, 3), tiny(False, 3)
    assert pre.final_norm and not post.final_norm
    assert "norm.weight" in pre.state_dict() and "norm.weight" not in post.state_dict()
    assert "layers.2.linear2.bias" in pre.params
    assert len(pre.params) == 3 * 12 + 2 and pre.num_params() == sum(v.size for v in pre.params.values())
    assert tiny(False, 1, final_norm=True).final_norm


def test_gradients_accumulate_and_zero():
    stack = tiny(True)
    x = np.random.default_rng(1).standard_normal((1, 4, 8))
    stack(x); stack.backward(np.ones_like(x))
    g1 = {k: v.copy() for k, v in stack.grads.items()}
    stack(x); stack.backward(np.ones_like(x))
    for k, v in stack.grads.items():
        np.testing.assert_allclose(v, 2 * g1[k], rtol=1e-12, atol=1e-15)
    stack.zero_grad()
    assert all(not v.any() for v in stack.grads.values())


def test_state_dict_roundtrip_and_errors():
    a, b = tiny(True), TransformerStack(BlockConfig(d_model=8, n_heads=2, d_ff=12), 2, dtype=np.float64,
                                       seed=99)
    b.load_state_dict(a.state_dict())
    x = np.random.default_rng(2).standard_normal((2, 3, 8))
    np.testing.assert_array_equal(a(x), b(x))
    sd = a.state_dict(); sd.pop("norm.bias")
    with pytest.raises(KeyError, match="norm.bias"):
        b.load_state_dict(sd)
    with pytest.raises(RuntimeError, match="backward"):
        tiny(True).backward(x)
    with pytest.raises(ValueError, match="n_layers"):
        TransformerStack(BlockConfig(d_model=8, n_heads=2, d_ff=12), 0)


def test_xavier_variance():
    cfg = BlockConfig(d_model=64, n_heads=1, d_ff=256)
    p = xavier_normal_params(cfg, np.random.default_rng(0))
    assert abs(p["linear1.weight"].var() / (2 / (64 + 256)) - 1) < 0.05
    assert abs(p["self_attn.in_proj_weight"][:64].var() * 64 - 1) < 0.05   # each E x E part: 1/E
    assert not p["linear1.bias"].any() and (p["norm1.weight"] == 1).all()


def test_train_eval_mode_propagates():
    stack = tiny(True)
    stack.eval()
    assert not any(layer.training for layer in stack.layers)
    stack.train()
    assert all(layer.training for layer in stack.layers)


@pytest.mark.parametrize("norm_first", [True, False])
def test_matches_torch_encoder(norm_first):
    torch = pytest.importorskip("torch", reason="PyTorch is optional; it is only a reference")
    stack = tiny(norm_first, 3)
    layer = torch.nn.TransformerEncoderLayer(8, 2, 12, dropout=0.0, activation="gelu",
                                             batch_first=True, norm_first=norm_first)
    enc = torch.nn.TransformerEncoder(layer, 3, norm=torch.nn.LayerNorm(8) if norm_first else None,
                                      enable_nested_tensor=False).double()
    enc.load_state_dict({k: torch.from_numpy(v) for k, v in stack.state_dict().items()})
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal((2, 5, 8)), rng.standard_normal((2, 5, 8))
    xt = torch.from_numpy(x).requires_grad_(True)
    yt = enc(xt)
    (yt * torch.from_numpy(w)).sum().backward()
    stack.zero_grad()
    y = stack(x)
    dx = stack.backward(w)
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-9, atol=1e-12)
    for name, param in enc.named_parameters():
        np.testing.assert_allclose(stack.grads[name], param.grad.numpy(), rtol=1e-9, atol=1e-12,
                                   err_msg=name)


@pytest.mark.parametrize("dropout", [0.0, 0.2])
@pytest.mark.parametrize("attention", ["plain", "tiled"])
def test_checkpoint_gradients_are_bit_identical(attention, dropout):
    """checkpoint=True recomputes each block with the same inputs, the same numpy calls and the
    same dropout draws (the RNG state is restored): the gradients are equal bit for bit."""
    cfg = BlockConfig(d_model=8, n_heads=2, d_ff=12, dropout=dropout, causal=True)
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((2, 5, 8)), rng.standard_normal((2, 5, 8))
    mask = np.array([[False] * 4 + [True], [False] * 5])
    out = []
    for ckpt in (False, True):
        stack = TransformerStack(cfg, 3, dtype=np.float64, seed=4, attention=attention, checkpoint=ckpt)
        y = stack(x, mask)
        assert ckpt == all(layer.cache is None for layer in stack.layers)   # only inputs kept
        out.append((y, stack.backward(w), stack.grads))
    (y0, dx0, g0), (y1, dx1, g1) = out
    np.testing.assert_array_equal(y1, y0)
    np.testing.assert_array_equal(dx1, dx0)
    for name in g0:
        np.testing.assert_array_equal(g1[name], g0[name], err_msg=name)


def test_checkpoint_rejects_non_bool():
    with pytest.raises(TypeError, match="checkpoint"):
        tiny(True, checkpoint="yes")



@pytest.mark.parametrize("checkpoint", [False, True])
def test_drop_cache_frees_every_layer_and_the_stack(checkpoint):
    """drop_cache, the public way to forget the activations (benchmarks drop them between steps):
    every block's cache, the checkpointed inputs and the final norm's cache go; a backward then
    needs a new forward, whose gradients equal those of a stack that never dropped."""
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((2, 5, 8)), rng.standard_normal((2, 5, 8))
    kept, dropped = tiny(True, checkpoint=checkpoint), tiny(True, checkpoint=checkpoint)
    dropped(x)
    assert dropped.norm_cache is not None and (checkpoint or dropped.layers[0].cache is not None)
    assert dropped.drop_cache() is dropped
    assert dropped.norm_cache is None and all(layer.cache is None for layer in dropped.layers)
    with pytest.raises(RuntimeError, match="forward"):
        dropped.backward(w)
    dropped.zero_grad()
    dropped(x)
    kept(x)
    np.testing.assert_array_equal(dropped.backward(w), kept.backward(w))
    for name in kept.grads:
        np.testing.assert_array_equal(dropped.grads[name], kept.grads[name], err_msg=name)
