"""Correct versions of earlier answers, put in place while a later question is graded.

A question may call an earlier answer (attention calls the student's softmax). Graded with the
student's own earlier function, one bug would cost two questions (a cascade). The hidden checks
of the later question say ``in_place_of("softmax", SOFTMAX)``: while its calls run in the
sandbox, the notebook's ``softmax`` is this one, and the student's own again afterwards
(preln.course.in_place_of). They are written with ``preln.course.code`` because they are sent
to the sandbox as text; they run only during the later question's calls, after the earlier
question's calls are made.
"""
from preln.course import code

#: softmax along ``axis``; a slice that is all -inf gives zeros; keeps x's dtype
SOFTMAX = code(
    "lambda x, axis=-1: (lambda e: e / np.maximum(e.sum(axis, keepdims=True), "
    "np.finfo(e.dtype).tiny))(np.exp(x - np.where(np.isfinite(x.max(axis, keepdims=True)), "
    "x.max(axis, keepdims=True), 0)))")

#: ds = dL/ds from dp = dL/dp and p = softmax(s) along ``axis``
SOFTMAX_BACKWARD = code("lambda dp, p, axis=-1: p * (dp - (p * dp).sum(axis, keepdims=True))")

#: int8 question 1: symmetric absmax quantisation -> (q int8, scale in float32 or float64)
QUANTIZE_ABSMAX = code(
    "lambda x, per_row=False, scale=None: (lambda ft: (lambda xs: (lambda s: (np.clip(np.rint("
    "xs / s), -127, 127).astype(np.int8), s))(np.asarray((lambda a: np.where(a > 0, a / ft.type("
    "127), ft.type(1)))(np.max(np.abs(xs), axis=-1, keepdims=True) if per_row else np.max("
    "np.abs(xs))) if scale is None else scale, dtype=ft)))(x.astype(ft)))(np.result_type("
    "x.dtype, np.float32))")

#: int8 question 2: the exact int32 product of int8 a (N, K) and b (M, K)
INT8_MATMUL = code("lambda a, b: (a.astype(np.float64) @ b.astype(np.float64).T).astype(np.int32)")

#: int8 question 3: W8A8, activations per token, weights per output channel
INT8_LINEAR = code(
    "lambda x, w, b: (lambda qx, qw: quantize_absmax_matmul(qx[0], qw[0]).astype(np.float32) * ("
    "qx[1] * qw[1].T) + b.astype(np.float32))(quantize(x.astype(np.float32), per_row=True), "
    "quantize(w.astype(np.float32), per_row=True))",
    quantize=QUANTIZE_ABSMAX, quantize_absmax_matmul=INT8_MATMUL)

#: int8 question 6: round to nearest on an asymmetric grid per group of columns -> (q, scale, zero)
RTN_GROUPS = code(
    "lambda w, bits=4, group_size=None: (lambda g: (lambda wg: (lambda lo, hi: (lambda s: (lambda "
    "z: (np.clip(np.rint(wg / s[..., None]) + z[..., None], 0, 2 ** bits - 1).reshape(w.shape)"
    ".astype(np.int64), s, z))(np.rint(-lo / s)))(np.where(hi > lo, (hi - lo) / (2 ** bits - 1), "
    "1.0)))(np.minimum(wg.min(axis=-1), 0.0), np.maximum(wg.max(axis=-1), 0.0)))(w.reshape("
    "w.shape[0], w.shape[1] // g, g)))(w.shape[1] if group_size is None else group_size)")

#: modern_block question 3: rotary embeddings, rotate-half layout, x (B, H, S, d_h) at positions (S,)
ROPE = code(
    "lambda x, positions, theta=10000.0: (lambda half: (lambda angle: x * np.cos(angle).astype("
    "x.dtype) + np.concatenate([-x[..., half:], x[..., :half]], axis=-1) * np.sin(angle).astype("
    "x.dtype))(np.tile(np.asarray(positions)[:, None] * theta ** (-2.0 * np.arange(half) / "
    "x.shape[-1]), 2)))(x.shape[-1] // 2)")

#: modern_block question 6: grouped-query attention, q (B, H, S, d_h), k, v (B, H_kv, S, d_h)
GQA_ATTENTION = code(
    "lambda q, k, v, causal=False: (lambda B, H, S, dh, Hkv: (lambda s: (lambda p: ((p / p.sum("
    "-1, keepdims=True)) @ v[:, :, None]).reshape(B, H, S, dh))(np.exp(s - s.max(-1, keepdims="
    "True))))(np.where(np.triu(np.ones((S, S), bool), 1) & bool(causal), -np.inf, q.reshape(B, "
    "Hkv, H // Hkv, S, dh) @ k[:, :, None].swapaxes(-1, -2) / np.sqrt(dh))))(*q.shape, k.shape[1])")

#: inference question 2: (FLOPs, bytes) of one decoding step of n_layers blocks at this context
DECODE_STEP_COST = code(
    "lambda cfg, n_layers, batch, context, itemsize=2: (n_layers * batch * (2 * (4 * cfg.d_model ** 2 "
    "+ 2 * cfg.d_model * cfg.d_ff) + 4 * context * cfg.d_model), (n_layers * (4 * cfg.d_model ** 2 + "
    "2 * cfg.d_model * cfg.d_ff + 9 * cfg.d_model + cfg.d_ff) + 2 * n_layers * batch * context * "
    "cfg.d_model) * itemsize)")

#: inference question 5: the bytes of a KV cache
KV_CACHE_BYTES = code(
    "lambda n_layers, batch, max_len, n_heads, d_head, itemsize: 2 * n_layers * batch * max_len * "
    "n_heads * d_head * itemsize")

#: shape_flow question 1: the FLOPs of the forward's six matmuls (2 per multiply-add)
FORWARD_MATMUL_FLOPS = code(
    "lambda cfg, B, S: {'attn.in_proj': 6 * B * S * cfg.d_model ** 2, 'attn.scores': 2 * B * S * S * "
    "cfg.d_model, 'attn.weighted_sum': 2 * B * S * S * cfg.d_model, 'attn.out_proj': 2 * B * S * "
    "cfg.d_model ** 2, 'mlp.linear1': 2 * B * S * cfg.d_model * cfg.d_ff, 'mlp.linear2': 2 * B * S * "
    "cfg.d_model * cfg.d_ff}")

#: precision question 1: a binary format's limits from its exponent and mantissa bits
FORMAT_LIMITS = code(
    "lambda e, m: (lambda bias: {'max': math.ldexp(2 - math.ldexp(1, -m), 2 ** e - 2 - bias), "
    "'min_normal': math.ldexp(1, 1 - bias), 'min_subnormal': math.ldexp(1, 1 - bias - m), "
    "'eps': math.ldexp(1, -m)})(2 ** (e - 1) - 1)")

#: many_devices question 1: ring reduce-scatter; chunk c adds rank c + 1's, then c + 2's, ..., c's
#: (the package's ring order, bit for bit: a + b == b + a, so each step's sum is the running one)
RING_REDUCE_SCATTER = code(
    "lambda xs: (lambda P: (lambda parts: [sum([parts[(c + 2 + i) % P][c] for i in range(P - 1)], "
    "parts[(c + 1) % P][c]) for c in range(P)])([np.split(x, P) for x in xs]))(len(xs))")

#: many_devices question 2: ring all-reduce of the flattened arrays, zero-padded to P equal chunks
RING_ALL_REDUCE = code(
    "lambda xs: (lambda P, n, shape: (lambda y: [y[:n].reshape(shape).copy() for _ in range(P)])("
    "np.concatenate(rs([np.concatenate([x.reshape(-1), np.zeros(-n % P, x.dtype)]) for x in xs]))))("
    "len(xs), xs[0].size, xs[0].shape)", rs=RING_REDUCE_SCATTER)

#: derivation_block question 3: the attention branch's backward, da -> (dh, its 4 gradients), from cache.attn
ATTN_BRANCH_BACKWARD = code(
    "lambda da, c, cfg: (lambda ops: (lambda do: (lambda dh: (dh[0], {'self_attn.in_proj_weight': dh[1], "
    "'self_attn.in_proj_bias': dh[2], 'self_attn.out_proj.weight': do[1], 'self_attn.out_proj.bias': do[2]}))("
    "ops.linear_backward(np.concatenate([ops.merge_heads(t) for t in ops.attention_backward(ops.split_heads("
    "do[0], cfg.n_heads), c.sdpa)], axis=-1), c.in_proj)))(ops.linear_backward(ops.dropout_backward("
    "da, c.drop_mask, cfg.dropout), c.out_proj)))(__import__('importlib').import_module('preln.ops'))")

#: derivation_block question 3: the MLP branch's backward, dz -> (dh, its 4 gradients), from cache.mlp
MLP_BRANCH_BACKWARD = code(
    "lambda dz, c, cfg: (lambda ops: (lambda z2: (lambda z1: (z1[0], {'linear1.weight': z1[1], "
    "'linear1.bias': z1[2], 'linear2.weight': z2[1], 'linear2.bias': z2[2]}))(ops.linear_backward("
    "ops.activation_backward(ops.dropout_backward(z2[0], c.hidden_mask, cfg.dropout), c.act), c.linear1)))("
    "ops.linear_backward(ops.dropout_backward(dz, c.drop_mask, cfg.dropout), c.linear2)))("
    "__import__('importlib').import_module('preln.ops'))")
