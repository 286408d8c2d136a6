"""A stack of L Transformer encoder blocks, Pre-LN or Post-LN, with an optional final LayerNorm.

    Pre-LN  (Xiong et al. 2020, arXiv 2002.04745):  x_l = Block_l(x_{l-1}),  y = LN_f(x_L)
    Post-LN (Vaswani et al. 2017):                  x_l = Block_l(x_{l-1}),  y = x_L

The final LayerNorm is what a Pre-LN model needs (its residual stream is never normalised
otherwise; Xiong et al. write x_Final = LN(x_{L+1})); a Post-LN block already ends with a
LayerNorm, so ``final_norm=None`` picks "yes" for Pre-LN and "no" for Post-LN, like
``torch.nn.TransformerEncoder(layer, L, norm=LayerNorm(D) or None)``.

Parameter names follow ``torch.nn.TransformerEncoder``: ``layers.3.linear1.weight``,
``norm.weight``. The backward is the forward read from the bottom up.

A causal stack decodes with one KV cache per layer (:class:`StackKVCache`): layer l's cache holds
the keys and values computed from x_{l-1}, so ``stack.decode`` runs every layer on the new positions
only, as :meth:`preln.TransformerBlock.decode` does for one block.

Activation checkpointing (``checkpoint=True``; Chen et al. 2016, arXiv 1604.06174): the forward
keeps each block's input x_{l-1} (and its dropout RNG state) and drops the block's cache; the
backward runs block l's forward again just before its backward. Peak memory ~ L (B S D) + one
block's activations instead of L blocks' activations; time ~ one more forward. The recomputation
runs the same numpy calls on the same arrays with the same random draws, so the gradients are
bit-identical to the stack without checkpointing.
"""
import numpy as np

from preln.nn.base import DEFAULT_ATTENTION, DEFAULT_DTYPE, Module
from preln.nn.block import TransformerBlock, param_shapes
from preln.validation import as_array, check_bool, check_choice, check_same_shape, check_state_keys, positive_int
from preln.nn.config import BlockConfig
from preln.ops import layer_norm_backward, layer_norm_forward
from preln.precision import resolve_dtype

__all__ = ["TransformerStack", "StackKVCache", "xavier_normal_params"]


class StackKVCache:
    """One :class:`preln.nn.block.KVCache` per layer, filled together by :meth:`TransformerStack.decode`.

    layers: the per-layer caches;  length: positions decoded so far;
    nbytes: L * 2 * B * max_len * D * itemsize.
    """

    def __init__(self, layers):
        self.layers = list(layers)

    # the layers' caches are filled together: the first one speaks for all
    length, batch, max_len, dtype = (property(lambda self, a=a: getattr(self.layers[0], a))
                                     for a in ("length", "batch", "max_len", "dtype"))

    @property
    def nbytes(self):
        return sum(kv.nbytes for kv in self.layers)

    def reset(self):
        for kv in self.layers:
            kv.reset()
        return self

    def __len__(self):
        return len(self.layers)

    def __repr__(self):
        return (f"StackKVCache({len(self.layers)} layers, batch={self.batch}, max_len={self.max_len}, "
                f"dtype={self.dtype}, length={self.length}, nbytes={self.nbytes})")


def xavier_normal_params(config, rng, dtype=DEFAULT_DTYPE):
    """The initialisation of Xiong et al. (2020, section 3.3) for one block's 12 parameters.

    Every weight matrix W (n_out, n_in) is drawn from N(0, 2 / (n_in + n_out)) -- the three E x E
    projections inside ``in_proj_weight`` each as its own matrix -- biases are 0, LayerNorm
    gamma = 1 and beta = 0. Drawn in float64, then cast to ``dtype``.
    """
    E, F = config.d_model, config.d_ff
    normal = lambda n_out, n_in: rng.normal(0.0, np.sqrt(2.0 / (n_in + n_out)), size=(n_out, n_in))
    params = {
        "self_attn.in_proj_weight": np.concatenate([normal(E, E) for _ in range(3)]),  # (3E, E)
        "self_attn.in_proj_bias": np.zeros(3 * E),
        "self_attn.out_proj.weight": normal(E, E),
        "self_attn.out_proj.bias": np.zeros(E),
        "linear1.weight": normal(F, E),
        "linear1.bias": np.zeros(F),
        "linear2.weight": normal(E, F),
        "linear2.bias": np.zeros(E),
        "norm1.weight": np.ones(E), "norm1.bias": np.zeros(E),
        "norm2.weight": np.ones(E), "norm2.bias": np.zeros(E),
    }
    return {k: v.astype(dtype) for k, v in params.items()}


class TransformerStack(Module):
    """L blocks with the same :class:`preln.BlockConfig`, then an optional final LayerNorm.

    config:     one BlockConfig for every layer (``norm_first`` picks Pre-LN or Post-LN).
    n_layers:   L >= 1.
    final_norm: True | False | None (None: True for Pre-LN, False for Post-LN).
    dtype:      storage dtype of parameters and activations, as for TransformerBlock (float32).
    seed:       int or SeedSequence; layer l is initialised from the l-th child of ``np.random.SeedSequence(seed)``,
                so adding layers does not change the earlier ones.
    init:       "torch" (nn.TransformerEncoderLayer's default) or "xavier" (Xiong et al.:
                N(0, 2/(n_in+n_out)), zero biases).
    attention:  passed to each block, as for TransformerBlock ("auto": tiled in eval mode, plain in
                training mode).
    """

    def __init__(self, config, n_layers, final_norm=None, dtype=DEFAULT_DTYPE, seed=0, init="torch",
                 attention=DEFAULT_ATTENTION, checkpoint=False):
        if not isinstance(config, BlockConfig):
            raise TypeError(f"config: expected a preln.BlockConfig; got {type(config).__name__}")
        n_layers = positive_int(n_layers, "n_layers")
        if final_norm not in (None, True, False):
            raise ValueError(f"final_norm: expected True, False or None; got {final_norm!r}")
        check_choice(init, ("torch", "xavier"), "init")
        self.config = config
        self.n_layers = n_layers
        self.checkpoint = check_bool(checkpoint, "checkpoint")
        self._inputs = None           # checkpoint: [(x_{l-1}, rng state before block l)] per layer
        self.final_norm = config.norm_first if final_norm is None else bool(final_norm)
        self.dtype = resolve_dtype(dtype)
        ss = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(seed)
        children = ss.spawn(self.n_layers + 1)
        self.layers = [TransformerBlock(config, dtype=self.dtype, seed=children[i], attention=attention)
                       for i in range(self.n_layers)]
        if init == "xavier":
            for i, layer in enumerate(self.layers):
                layer.load_state_dict(xavier_normal_params(config, np.random.default_rng(children[i]), self.dtype))
        self.rng = np.random.default_rng(children[-1])   # kept for symmetry with the block
        D = config.d_model
        self.norm = {"weight": np.ones(D, self.dtype), "bias": np.zeros(D, self.dtype)} if self.final_norm else {}
        self.norm_grads = {k: np.zeros_like(v) for k, v in self.norm.items()}
        self.training = True
        self._norm_cache = None
        self._shape = None

    @property
    def norm_cache(self):
        """The final LayerNorm's cache from the last forward (None without a final norm)."""
        return self._norm_cache

    # ---- parameters --------------------------------------------------------------------------
    @property
    def params(self):
        """{"layers.l.<block key>": array, "norm.weight": ...} -- views of the live arrays."""
        out = {f"layers.{i}.{k}": v for i, layer in enumerate(self.layers) for k, v in layer.params.items()}
        out.update({f"norm.{k}": v for k, v in self.norm.items()})
        return out

    @property
    def grads(self):
        """Gradients under the same names as :attr:`params` (the live accumulators)."""
        out = {f"layers.{i}.{k}": v for i, layer in enumerate(self.layers) for k, v in layer.grads.items()}
        out.update({f"norm.{k}": v for k, v in self.norm_grads.items()})
        return out

    def param_shapes(self):
        shapes = {f"layers.{i}.{k}": s for i in range(self.n_layers)
                  for k, s in param_shapes(self.config).items()}
        if self.final_norm:
            shapes.update({"norm.weight": (self.config.d_model,), "norm.bias": (self.config.d_model,)})
        return shapes

    def children(self):
        return self.layers

    def _drop_own_cache(self):  # the checkpointed inputs, the final norm's cache, the forward's shape
        self._inputs = self._norm_cache = self._shape = None

    def load_state_dict(self, state_dict):
        """Strict: every key of :meth:`param_shapes`, no extra key, exact shapes."""
        shapes = self.param_shapes()
        check_state_keys(state_dict, shapes)
        for i, layer in enumerate(self.layers):
            prefix = f"layers.{i}."
            layer.load_state_dict({k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)})
        for k in list(self.norm):
            a = as_array(state_dict[f"norm.{k}"], f"state_dict['norm.{k}']")
            if a.shape != shapes[f"norm.{k}"]:
                raise ValueError(f"state_dict['norm.{k}']: expected shape {shapes[f'norm.{k}']}; got {a.shape}")
            self.norm[k] = a.astype(self.dtype, copy=True)
            self.norm_grads[k] = np.zeros_like(self.norm[k])

    # ---- forward / backward ------------------------------------------------------------------
    def __call__(self, x, key_padding_mask=None, return_hidden=False):
        return self.forward(x, key_padding_mask, return_hidden)

    def forward(self, x, key_padding_mask=None, return_hidden=False):
        """x: (B, S, D) -> y: (B, S, D).

        With ``return_hidden=True`` returns ``(y, hidden)`` where hidden = [x_0, x_1, ..., x_L] are
        the input and each block's output (before the final LayerNorm), each (B, S, D).
        """
        hidden = [x]
        self._inputs = [] if self.checkpoint else None
        for layer in self.layers:
            if self.checkpoint:                                     # keep the block's input and its
                self._inputs.append((x, key_padding_mask, layer.rng.bit_generator.state))  # dropout state
            x = layer(x, key_padding_mask)                          # x_l = Block_l(x_{l-1})   (B, S, D)
            if self.checkpoint:
                layer.drop_cache()                                  # ... and drop its activations
            hidden.append(x)
        self._shape = x.shape
        if self.final_norm:
            x, self._norm_cache = layer_norm_forward(x, self.norm["weight"], self.norm["bias"],
                                                     self.config.eps)   # y = LN_f(x_L)
        return (x, hidden) if return_hidden else x

    # ---- decoding with a KV cache ------------------------------------------------------------
    def kv_cache(self, batch, max_len, dtype=None):
        """A :class:`StackKVCache`: one fresh KV cache per layer (causal stacks only)."""
        return StackKVCache(layer.kv_cache(batch, max_len, dtype) for layer in self.layers)

    def decode(self, x_new, kv):
        """x_new: (B, n, D), the next n positions -> y_new: (B, n, D), as the full causal forward
        gives them; every layer's cache grows by n. Eval mode only (see TransformerBlock.decode)."""
        if not isinstance(kv, StackKVCache):
            raise TypeError(f"kv: expected a preln.nn.stack.StackKVCache from stack.kv_cache(batch, "
                            f"max_len); got {type(kv).__name__}")
        if len(kv) != self.n_layers:
            raise ValueError(f"kv: expected one cache per layer, {self.n_layers}; got {len(kv)}")
        if len({c.length for c in kv.layers}) != 1:
            raise ValueError(f"kv: the layers' caches hold different lengths "
                             f"{[c.length for c in kv.layers]}; a failed step? call kv.reset()")
        for layer, layer_kv in zip(self.layers, kv.layers):      # fail before any cache moves
            layer.check_decode(x_new, layer_kv)
        x = x_new
        for layer, layer_kv in zip(self.layers, kv.layers):
            x = layer.decode(x, layer_kv)                         # x_l = Block_l(x_{l-1})   (B, n, D)
        if self.final_norm:
            x, _ = layer_norm_forward(x, self.norm["weight"], self.norm["bias"], self.config.eps)
        return x

    def backward(self, dy):
        """dy = dL/dy, (B, S, D) -> dL/dx_0, (B, S, D); adds every dL/dparam into :attr:`grads`."""
        if self._shape is None:
            raise RuntimeError("backward: no forward to differentiate; call stack(x) first")
        dx = check_same_shape(dy, self._shape, "dy").astype(self.dtype, copy=False)
        if self.final_norm:                                         # y = LN_f(x_L)
            dx, dgamma, dbeta = layer_norm_backward(dx, self._norm_cache)
            self.norm_grads["weight"] += dgamma
            self.norm_grads["bias"] += dbeta
        for l in reversed(range(self.n_layers)):                    # x_l = Block_l(x_{l-1})
            layer = self.layers[l]
            if self.checkpoint:                                     # recompute block l's forward:
                x, kpm, state = self._inputs[l]                     # same input, same dropout draws,
                after = layer.rng.bit_generator.state               # same ops in the same order
                layer.rng.bit_generator.state = state
                layer(x, kpm)
                layer.rng.bit_generator.state = after
            dx = layer.backward(dx)
            if self.checkpoint:
                layer.drop_cache()                                  # one block's activations at a time
        return dx
