"""The block against torch.nn.TransformerEncoderLayer with the same weights, in float64: forward,
dL/dx and every parameter gradient agree to round-off. PyTorch is an optional reference, never a
dependency: without it this module is skipped with a reason."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed: it is an optional reference, never a dependency")
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from preln import BlockConfig, TransformerBlock, param_shapes  # noqa: E402

#: max|numpy - torch| / max(1, max|torch|) in float64: the same sums in a different order
TORCH_TOL_F64 = 1e-12
#: default-init statistics: the sample std of U(-a, a) is a / sqrt 3 within this relative error
INIT_STD_RTOL = 0.1

B, S, D, H, FF, EPS = 2, 6, 16, 4, 32, 1e-5
TORCH_ACTIVATION = {"gelu": "gelu", "relu": "relu",
                    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}
MASKS = ["none", "padding", "causal", "padding+causal"]


def scaled_error(a, b):
    a = np.asarray(a, np.float64)
    b = b.detach().numpy() if hasattr(b, "detach") else np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(1.0, np.abs(b).max()))


def torch_layer(cfg, dtype=torch.float64):
    return nn.TransformerEncoderLayer(cfg.d_model, cfg.n_heads, cfg.d_ff, dropout=0.0,
                                      activation=TORCH_ACTIVATION[cfg.activation],
                                      layer_norm_eps=cfg.eps, batch_first=True,
                                      norm_first=cfg.norm_first, dtype=dtype)


def padding_mask(S):
    kpm = np.zeros((B, S), bool)
    kpm[0, -2:] = True            # padding at the end: no query is left without a visible key
    kpm[1, -1] = True
    return kpm


def run_torch(layer, x, w, kpm, causal):
    """Forward and backward of L = sum(y * w); the masks are passed as the same (float) type."""
    S = x.shape[1]
    xt = torch.tensor(x, requires_grad=True)
    src_mask = nn.Transformer.generate_square_subsequent_mask(S, dtype=torch.float64) if causal else None
    kpm_t = None
    if kpm is not None:
        kpm_t = torch.tensor(kpm)
        if causal:                 # float like src_mask: torch warns about mismatched mask types
            kpm_t = torch.zeros(kpm.shape, dtype=torch.float64).masked_fill(kpm_t, float("-inf"))
    layer.zero_grad()
    y = layer(xt, src_mask=src_mask, src_key_padding_mask=kpm_t, is_causal=causal)
    (y * torch.tensor(w)).sum().backward()
    return y, xt.grad, {k: p.grad for k, p in layer.named_parameters()}


def compare(block, layer, x, kpm, w):
    y_t, dx_t, grads_t = run_torch(layer, x, w, kpm, block.config.causal)
    block.zero_grad()
    y = block(x, kpm)
    dx = block.backward(w)
    errors = {"y": scaled_error(y, y_t), "dx": scaled_error(dx, dx_t)}
    assert set(grads_t) == set(block.grads)
    errors.update({k: scaled_error(block.grads[k], grads_t[k]) for k in grads_t})
    return errors


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "relu"])
@pytest.mark.parametrize("norm_first", [True, False], ids=["preln", "postln"])
def test_matches_torch_forward_and_every_gradient(norm_first, activation, mask):
    cfg = BlockConfig(d_model=D, n_heads=H, d_ff=FF, norm_first=norm_first, activation=activation,
                      eps=EPS, causal="causal" in mask)
    block = TransformerBlock(cfg, dtype=np.float64, seed=11)
    sd = block.state_dict()
    sd["linear1.bias"] += 0.1                                     # nonzero everywhere, not just init
    sd["norm1.weight"] = 1 + 0.2 * np.random.default_rng(1).standard_normal(D)
    sd["norm2.bias"] = 0.1 * np.random.default_rng(2).standard_normal(D)
    sd["self_attn.in_proj_bias"] = 0.1 * np.random.default_rng(3).standard_normal(3 * D)
    block.load_state_dict(sd)
    layer = torch_layer(cfg)
    layer.load_state_dict({k: torch.from_numpy(v) for k, v in sd.items()})
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((B, S, D)), rng.standard_normal((B, S, D))
    kpm = padding_mask(S) if "padding" in mask else None
    errors = compare(block, layer, x, kpm, w)
    bad = {k: v for k, v in errors.items() if not v < TORCH_TOL_F64}
    assert not bad, bad


@pytest.mark.parametrize("norm_first", [True, False], ids=["preln", "postln"])
def test_loads_torch_default_initialised_weights(norm_first):
    cfg = BlockConfig(d_model=D, n_heads=H, d_ff=FF, norm_first=norm_first)
    torch.manual_seed(0)
    layer = torch_layer(cfg)
    block = TransformerBlock(cfg, dtype=np.float64, seed=0)
    block.load_state_dict(layer.state_dict())                     # torch tensors are accepted
    for k, v in layer.state_dict().items():
        np.testing.assert_array_equal(block.params[k], v.numpy())
    rng = np.random.default_rng(4)
    x, w = rng.standard_normal((B, S, D)), rng.standard_normal((B, S, D))
    errors = compare(block, layer, x, padding_mask(S), w)
    assert max(errors.values()) < TORCH_TOL_F64, errors


def test_default_init_has_torch_bounds_and_spread():
    """Both inits are uniform with the same bounds (see preln.nn.block's docstring): every |W| is
    within the bound, the largest is close to it, and the std is close to bound / sqrt 3."""
    E, Fw = 64, 256
    cfg = BlockConfig(d_model=E, n_heads=4, d_ff=Fw)
    bounds = {"self_attn.in_proj_weight": np.sqrt(6 / (E + 3 * E)),
              "self_attn.out_proj.weight": 1 / np.sqrt(E),
              "linear1.weight": 1 / np.sqrt(E), "linear1.bias": 1 / np.sqrt(E),
              "linear2.weight": 1 / np.sqrt(Fw), "linear2.bias": 1 / np.sqrt(Fw)}
    constants = {"self_attn.in_proj_bias": 0.0, "self_attn.out_proj.bias": 0.0,
                 "norm1.weight": 1.0, "norm1.bias": 0.0, "norm2.weight": 1.0, "norm2.bias": 0.0}
    assert set(bounds) | set(constants) == set(param_shapes(cfg))
    torch.manual_seed(0)
    theirs = {k: v.numpy() for k, v in torch_layer(cfg).state_dict().items()}
    ours = TransformerBlock(cfg, dtype=np.float64, seed=0).state_dict()
    for k, bound in bounds.items():
        for name, p in (("preln", ours[k]), ("torch", theirs[k])):
            big_enough = p.size >= 1000
            assert np.abs(p).max() <= bound, (name, k)
            assert np.abs(p).max() > (0.95 if big_enough else 0.8) * bound, (name, k)
            if big_enough:
                assert p.std() == pytest.approx(bound / np.sqrt(3), rel=INIT_STD_RTOL), (name, k)
                assert abs(p.mean()) < 0.05 * bound, (name, k)
    for k, c in constants.items():
        np.testing.assert_array_equal(ours[k], c)
        np.testing.assert_array_equal(theirs[k], c)


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("norm_first", [True, False], ids=["preln", "postln"])
def test_eval_mode_tiled_matches_torch_eval(norm_first, mask):
    """Eval mode runs the tiled attention (S = 600: 3 query tiles, 2 key tiles); torch eval with
    gradients enabled takes its ordinary (not the fused fast) path."""
    S_long = 600
    cfg = BlockConfig(d_model=D, n_heads=H, d_ff=FF, norm_first=norm_first, dropout=0.1,
                      causal="causal" in mask)
    block = TransformerBlock(cfg, dtype=np.float64, seed=5).eval()
    layer = torch_layer(cfg)
    layer.load_state_dict({k: torch.from_numpy(v) for k, v in block.state_dict().items()})
    layer.eval()
    rng = np.random.default_rng(6)
    x, w = rng.standard_normal((B, S_long, D)), rng.standard_normal((B, S_long, D))
    kpm = padding_mask(S_long) if "padding" in mask else None
    errors = compare(block, layer, x, kpm, w)
    assert block.cache.attn.sdpa.p is None                       # the tiled path ran
    assert max(errors.values()) < TORCH_TOL_F64, errors


@pytest.mark.parametrize("norm_first", [True, False], ids=["preln", "postln"])
def test_decode_matches_torch_on_every_prefix(norm_first):
    """Decoding token by token with a KV cache: the output at position t equals torch's causal
    layer (eval) run on the prefix x[:, :t + 1], at its last position -- what a decoder without a
    cache would compute for the newest token."""
    S_dec = 9
    cfg = BlockConfig(d_model=D, n_heads=H, d_ff=FF, norm_first=norm_first, causal=True)
    block = TransformerBlock(cfg, dtype=np.float64, seed=8).eval()
    sd = block.state_dict()
    sd["self_attn.in_proj_bias"] = 0.1 * np.random.default_rng(9).standard_normal(3 * D)
    block.load_state_dict(sd)
    layer = torch_layer(cfg)
    layer.load_state_dict({k: torch.from_numpy(v) for k, v in sd.items()})
    layer.eval()
    x = np.random.default_rng(10).standard_normal((B, S_dec, D))
    kv = block.kv_cache(B, S_dec)
    prefill = block.decode(x[:, :3], kv)                          # the prompt in one call
    steps = [block.decode(x[:, t:t + 1], kv) for t in range(3, S_dec)]
    ours = np.concatenate([prefill] + steps, axis=1)              # (B, S_dec, D)
    with torch.no_grad():
        for t in range(S_dec):
            mask = nn.Transformer.generate_square_subsequent_mask(t + 1, dtype=torch.float64)
            y_t = layer(torch.tensor(x[:, :t + 1]), src_mask=mask, is_causal=True)[:, -1]
            assert scaled_error(ours[:, t], y_t) < TORCH_TOL_F64, t
