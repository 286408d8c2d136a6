"""preln.LlamaBlock against transformers' LlamaDecoderLayer with the same weights: forward, dL/dx and
every parameter gradient, for MHA, GQA and MQA, causal and padded; and decoding with the KV cache
against the layer on every prefix and against the layer's own cache.

torch and transformers are optional references, never dependencies: without them this module is
skipped with a reason.

What the float64 comparison changes in the oracle, and why. transformers computes three things in
float32 whatever the input dtype: ``LlamaRMSNorm`` (``hidden_states.to(torch.float32)``), RoPE's
cos/sin (``LlamaRotaryEmbedding`` builds ``inv_freq`` and the angles with ``.float()``), and the
eager attention's softmax (``softmax(..., dtype=torch.float32)``). Left alone, a float64 layer is
float32-accurate (~1e-7) and cannot check anything to 1e-12. So here, and only inside this test:

- the two RMSNorms are :class:`InputDtypeRMSNorm`, transformers' forward with the float32 cast
  removed (the instances' class is swapped; the weights stay);
- cos/sin come from :class:`Float64Rotary`, ``LlamaRotaryEmbedding``'s formula in float64, and are
  passed to the layer as its ``position_embeddings`` argument;
- attention is ``sdpa`` (``torch.nn.functional.scaled_dot_product_attention`` computes in the
  input dtype), not ``eager``.

``test_unpatched_layer_is_only_float32_accurate`` shows that the patches are needed, and
``test_float32_block_matches_the_layer_as_shipped`` compares the float32 block with the layer as it
ships (eager attention, no patch) at float32 accuracy.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed: it is an optional reference, never a dependency")
transformers = pytest.importorskip(
    "transformers", reason="transformers not installed: it is an optional test-only reference "
    "(.ci/run installs transformers==5.23.0 next to the local torch wheel)")
from transformers.models.llama import modeling_llama  # noqa: E402

from preln import LlamaBlock, LlamaConfig  # noqa: E402

#: max|numpy - torch| / max|torch| for float64: the same sums in a different order
REF_TOL_F64 = 1e-12
#: the unpatched float64 layer: float32 internals give errors of this order (and above 1e-10)
F32_INTERNALS = 1e-5
#: float32 block vs the shipped float32 layer (eager attention), relative to the array's scale
REF_TOL_F32 = 1e-5

B, S, D, H, FF, THETA, EPS = 2, 7, 32, 4, 48, 500.0, 1e-6
HEADS = {"MHA": 4, "GQA": 2, "MQA": 1}


class InputDtypeRMSNorm(modeling_llama.LlamaRMSNorm):
    """transformers' LlamaRMSNorm without its cast to float32 (see the module docstring)."""

    def forward(self, hidden_states):
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


class Float64Rotary(modeling_llama.LlamaRotaryEmbedding):
    """LlamaRotaryEmbedding's default ("rope_type": "default") tables, computed in float64."""

    def forward(self, x, position_ids):
        base = self.config.rope_parameters["rope_theta"]
        dim = self.config.head_dim
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
        freqs = position_ids[..., None].to(torch.float64) * inv_freq          # (B, S, d_h / 2)
        emb = torch.cat((freqs, freqs), dim=-1)                              # (B, S, d_h)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def hf_config(cfg, attn="sdpa"):
    return transformers.LlamaConfig(
        hidden_size=cfg.d_model, intermediate_size=cfg.d_ff, num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_kv_heads, num_hidden_layers=1, vocab_size=16,
        max_position_embeddings=64, rms_norm_eps=cfg.eps, hidden_act="silu",
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        attention_bias=False, mlp_bias=False, attn_implementation=attn)


def make_pair(n_kv_heads, dtype=np.float64, patched=True, attn="sdpa", fused=True):
    """A LlamaBlock with non-trivial weights and a LlamaDecoderLayer with the same ones."""
    cfg = LlamaConfig(d_model=D, n_heads=H, n_kv_heads=n_kv_heads, d_ff=FF, rope_theta=THETA, eps=EPS)
    block = LlamaBlock(cfg, dtype=dtype, seed=3, fused=fused)
    rng = np.random.default_rng(4)
    sd = {k: (1 + 0.3 * rng.standard_normal(v.shape) if "layernorm" in k
              else rng.normal(0, 0.2, v.shape)) for k, v in block.state_dict().items()}
    block.load_state_dict(sd)
    hcfg = hf_config(cfg, attn)
    tdtype = torch.float64 if dtype == np.float64 else torch.float32
    layer = modeling_llama.LlamaDecoderLayer(hcfg, layer_idx=0).to(tdtype)
    assert {k: tuple(v.shape) for k, v in layer.state_dict().items()} == \
        {k: v.shape for k, v in block.state_dict().items()}      # the same names and layouts
    layer.load_state_dict({k: torch.tensor(v) for k, v in block.state_dict().items()})
    rot = (Float64Rotary if patched else modeling_llama.LlamaRotaryEmbedding)(hcfg)
    if patched:
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            norm.__class__ = InputDtypeRMSNorm
    return block, layer, rot


def padding_mask():
    kpm = np.zeros((B, S), bool)
    kpm[0, -3:] = True                # right padding: key 0 stays visible to every query
    kpm[1, 2] = True                  # and a hole in the middle
    return kpm


def hf_mask(layer, kpm, S):
    """The layer's 4-D mask, causal and not padding, as transformers' create_causal_mask makes it:
    for sdpa a boolean one, True = may attend (and None without padding: sdpa's own is_causal);
    for eager attention an additive one, 0 or the dtype's lowest number."""
    sdpa = layer.self_attn.config._attn_implementation == "sdpa"
    if kpm is None and sdpa:
        return None
    causal = torch.arange(S)[None, :] <= torch.arange(S)[:, None]              # (S, S)
    pad = torch.zeros(B, S, dtype=torch.bool) if kpm is None else torch.tensor(kpm)
    allowed = (causal[None, None] & ~pad[:, None, None, :]).contiguous()      # (B, 1, S, S)
    if sdpa:
        return allowed
    dtype = layer.input_layernorm.weight.dtype
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)


def run_layer(layer, rot, x, w, kpm=None, positions=None):
    xt = torch.tensor(x, requires_grad=True)
    pos = torch.arange(x.shape[1])[None].expand(x.shape[0], -1) if positions is None else positions
    layer.zero_grad()
    y = layer(xt, attention_mask=hf_mask(layer, kpm, x.shape[1]),
              position_embeddings=rot(xt, pos), position_ids=pos)
    (y * torch.tensor(w)).sum().backward()
    return y.detach().numpy(), xt.grad.numpy(), {k: p.grad.numpy() for k, p in layer.named_parameters()}


def scaled(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300))


def compare(block, layer, rot, x, kpm=None):
    w = np.random.default_rng(5).standard_normal(x.shape).astype(x.dtype)
    y_t, dx_t, grads_t = run_layer(layer, rot, x, w, kpm)
    block.zero_grad()
    y = block(x, kpm)
    dx = block.backward(w)
    assert set(grads_t) == set(block.grads)
    errors = {"y": scaled(y, y_t), "dx": scaled(dx, dx_t)}
    errors.update({k: scaled(block.grads[k], g) for k, g in grads_t.items()})
    return errors


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "op-by-op"])
@pytest.mark.parametrize("masking", ["causal", "padded"])
@pytest.mark.parametrize("heads", list(HEADS))
def test_matches_llama_decoder_layer(heads, masking, fused):
    block, layer, rot = make_pair(HEADS[heads], fused=fused)
    x = np.random.default_rng(6).standard_normal((B, S, D))
    kpm = padding_mask() if masking == "padded" else None
    errors = compare(block, layer, rot, x, kpm)
    assert len(errors) == 2 + 9                                    # y, dx and all nine parameters
    bad = {k: v for k, v in errors.items() if not v < REF_TOL_F64}
    assert not bad, bad


@pytest.mark.parametrize("heads", list(HEADS))
def test_matches_with_tiled_attention_and_per_sequence_positions(heads):
    """Eval mode (tiled attention, P recomputed in the backward) and (B, S) positions that do not
    start at 0, as a left-padded batch passes them."""
    block, layer, rot = make_pair(HEADS[heads])
    block.eval()
    layer.eval()
    x = np.random.default_rng(7).standard_normal((B, S, D))
    pos = np.stack([np.arange(S) + 3, np.arange(S) + 11])             # (B, S)
    w = np.random.default_rng(8).standard_normal(x.shape)
    y_t, dx_t, grads_t = run_layer(layer, rot, x, w, positions=torch.tensor(pos))
    y = block(x, positions=pos)
    dx = block.backward(w)
    errors = {"y": scaled(y, y_t), "dx": scaled(dx, dx_t)}
    errors.update({k: scaled(block.grads[k], g) for k, g in grads_t.items()})
    bad = {k: v for k, v in errors.items() if not v < REF_TOL_F64}
    assert not bad, bad


@pytest.mark.parametrize("heads", list(HEADS))
def test_decode_equals_the_layer_on_every_prefix(heads):
    """Token by token: the block's decode equals the layer's forward on each prefix (its last
    position) and the layer decoding with its own DynamicCache."""
    block, layer, rot = make_pair(HEADS[heads])
    block.eval()
    layer.eval()
    x = np.random.default_rng(9).standard_normal((B, S, D))
    kv = block.kv_cache(B, S)
    cache = transformers.DynamicCache(config=layer.self_attn.config)
    with torch.no_grad():
        for t in range(S):
            y_new = block.decode(x[:, t:t + 1], kv)                               # (B, 1, D)
            prefix = torch.tensor(x[:, :t + 1])
            pos = torch.arange(t + 1)[None].expand(B, -1)
            y_prefix = layer(prefix, position_embeddings=rot(prefix, pos), position_ids=pos)
            xt = torch.tensor(x[:, t:t + 1])
            pos_t = torch.full((B, 1), t)
            y_cached = layer(xt, past_key_values=cache, use_cache=True,
                             position_embeddings=rot(xt, pos_t), position_ids=pos_t)
            assert scaled(y_new, y_prefix[:, -1:].numpy()) < REF_TOL_F64, t
            assert scaled(y_new, y_cached.numpy()) < REF_TOL_F64, t
    k_t, v_t = cache.layers[0].keys, cache.layers[0].values                       # (B, H_kv, S, d_h)
    assert k_t.shape == kv.k.shape                                                # H_kv heads, not H
    assert scaled(kv.k, k_t.numpy()) < REF_TOL_F64 and scaled(kv.v, v_t.numpy()) < REF_TOL_F64


def test_unpatched_layer_is_only_float32_accurate():
    """Why the patches above: the layer as shipped, in float64, computes RMSNorm, cos/sin (and an
    eager softmax) in float32, and differs from the float64 block far above round-off."""
    block, layer, rot = make_pair(2, patched=False, attn="eager")
    x = np.random.default_rng(6).standard_normal((B, S, D))
    errors = compare(block, layer, rot, x)
    assert 1e-10 < errors["y"] < F32_INTERNALS
    assert max(errors.values()) < F32_INTERNALS


@pytest.mark.parametrize("heads", list(HEADS))
def test_float32_block_matches_the_layer_as_shipped(heads):
    block, layer, rot = make_pair(HEADS[heads], dtype=np.float32, patched=False, attn="eager")
    x = np.random.default_rng(10).standard_normal((B, S, D)).astype(np.float32)
    errors = compare(block, layer, rot, x, padding_mask())
    bad = {k: v for k, v in errors.items() if not v < REF_TOL_F32}
    assert not bad, bad


def test_llama_lm_matches_llama_for_causal_lm():
    """The tiny LM of the chapter's experiment against transformers' LlamaForCausalLM, float64, the
    same patches: logits and every parameter gradient, names and layouts of its state_dict."""
    from preln.models.llama_lm import LlamaLM, LlamaLMConfig
    cfg = LlamaLMConfig(vocab_size=11, d_model=16, n_heads=4, n_kv_heads=2, d_ff=24, n_layers=2,
                        rope_theta=THETA, eps=EPS)
    lm = LlamaLM(cfg, dtype=np.float64, seed=0)
    hcfg = hf_config(cfg.block_config())
    hcfg.vocab_size, hcfg.num_hidden_layers = cfg.vocab_size, cfg.n_layers
    model = modeling_llama.LlamaForCausalLM(hcfg).to(torch.float64)
    for module in model.modules():
        if isinstance(module, modeling_llama.LlamaRMSNorm):
            module.__class__ = InputDtypeRMSNorm
    model.model.rotary_emb.__class__ = Float64Rotary
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == \
        {k: v.shape for k, v in lm.state_dict().items()}
    model.load_state_dict({k: torch.tensor(v) for k, v in lm.state_dict().items()})
    g = np.random.default_rng(11)
    tokens = g.integers(0, cfg.vocab_size, (B, S))
    w = g.standard_normal((B, S, cfg.vocab_size))
    model.zero_grad()
    logits_t = model(input_ids=torch.tensor(tokens)).logits
    (logits_t * torch.tensor(w)).sum().backward()
    lm.zero_grad()
    logits = lm(tokens)
    lm.backward(w)
    assert scaled(logits, logits_t.detach().numpy()) < REF_TOL_F64
    for k, p in model.named_parameters():
        assert scaled(lm.grads[k], p.grad.numpy()) < REF_TOL_F64, k
