"""What every block family shares: the sublayer protocol, the residual stream, and the plumbing.

A block's ``forward`` is its equations over this pass's sublayers, as nanoGPT's ``Block`` is
written over ``LayerNorm``, ``CausalSelfAttention`` and ``MLP``:

    Pre-norm:   h = x + attn(ln1(x));   y = h + mlp(ln2(h))
    Post-norm:  h = ln1(x + attn(x));   y = ln2(h + mlp(h))

and its ``backward`` is those lines read from the bottom up. A :class:`Sublayer` computes one
term: ``out = sublayer(x)`` keeps what its backward needs in ``sublayer.cache``, and
``sublayer.backward(dout, cache)`` returns dL/dx, adding dL/dparam into the block's ``grads``.
Variants swap a component, never the equations: a sublayer's implementation (the op-by-op one, every
op its own numpy call, watched by the overflow tracer; the fused kernels), a quantised model's
linears (the family's ``linear(name)`` hook), the attention core (:meth:`BlockBase.step` with a KV
store: a contiguous cache when decoding, a paged pool when serving).

The residual stream. A sublayer's output enters it as a :class:`Branch`, and ``x + branch`` is a
:class:`Residual` -- the sum, computed when it is first needed. A fused norm right after it takes
it whole and adds it inside its own kernel (the residual add, the sublayer's last bias and the norm
in one pass over memory); anything else reads the sum with :func:`added`, which adds it as the
sublayer says (with the tracer watching, or a fused bias + residual kernel).

:class:`BlockBase` holds the plumbing of :class:`preln.TransformerBlock` and :class:`preln.LlamaBlock`:
construction, train/eval, gradients, the strict state dict, the cache's bytes, decoding.
:class:`KVStore` is the preallocated keys and values both families' KV caches are.
"""
from collections import namedtuple

import numpy as np

from preln.ops.attention import flash_attention_forward
from preln.precision import SAFE, Watch, no_watch, resolve_dtype, resolve_policy
from preln.validation import (check_bool, check_choice, check_float_array, check_input, check_seed,
                              check_same_shape, check_state_keys, positive_int)

__all__ = ["Sublayer", "Norm", "Branch", "Residual", "added", "block_cache_type",
           "Module", "BlockBase", "KVStore", "ATTENTIONS", "DEFAULT_DTYPE", "DEFAULT_ATTENTION"]

#: the attention choices of a block: tiled in eval mode and plain in training mode, or either always
ATTENTIONS = ("auto", "plain", "tiled")

#: the one set of defaults of every block, the stack and the LMs, as PyTorch's: float32 storage and
#: "auto" attention. A gradient check asks for float64 explicitly.
DEFAULT_DTYPE = np.dtype(np.float32)
DEFAULT_ATTENTION = "auto"


def block_cache_type(name, norm1, norm2, module):
    """The NamedTuple a family's forward keeps for its backward, its norms' caches named as the
    family names its norms: (shape, norm1, attn, norm2, mlp, fused). ``fused``: the forward ran
    the fused kernels, so the backward takes the fused ones too. ``module``: the defining module's
    ``__name__``, where pickle finds the type (a cache must pickle: the grader sends blocks)."""
    return namedtuple(name, ["shape", norm1, "attn", norm2, "mlp", "fused"], defaults=(False,), module=module)


# ---- sublayers and the residual stream ---------------------------------------------------------
class Sublayer:
    """One sublayer of a block for one pass. ``out = sublayer(x)`` keeps ``self.cache`` for the
    backward; ``sublayer.backward(dout, cache)`` returns dL/dx and adds dL/dparam into the block's
    ``grads``. ``watch`` names the ops for the overflow tracer; ``fused``: the fused kernels run."""

    def __init__(self, block, watch=None, fused=False):
        self.block, self.policy, self.fused = block, block.policy, fused
        self.watch = Watch() if watch is None else watch
        self.cache = None

    def grad(self, name, g):
        self.block.grads[name] += g   # gradients add up over backward calls, as in PyTorch

    def branch(self, out, residual):
        """``out`` on its way into the residual stream; ``x + branch`` is the sum the tracer
        watches as ``residual``."""
        return Branch(out, lambda x, a: self.watch(residual, x + a, x, a))


class Norm(Sublayer):
    """A block's norm; ``name``: its parameters' prefix (``norm1``, ``input_layernorm``, ...).
    ``backward(dy, cache, dskip)`` adds ``dskip``, the gradient of the residual its input also
    feeds (None: none)."""

    def __init__(self, block, name, watch=None, fused=False):
        super().__init__(block, watch, fused)
        self.name = name


class Branch:
    """A sublayer's output entering the residual stream: ``x + branch`` is a :class:`Residual`.
    ``add(x, out)`` computes the sum; ``bias``: the sublayer's last bias when ``out`` leaves it out
    for the sum's kernel to add (the fused path), else None."""

    __array_ufunc__ = None      # ndarray + Branch: numpy leaves the sum to Branch.__radd__

    def __init__(self, out, add, bias=None):
        self.out, self.add, self.bias = out, add, bias

    def __radd__(self, x):
        return Residual(x, self)


class Residual:
    """``x + branch``, computed when first needed: by a fused norm after it, in its own kernel (it
    stores the sum in ``sum``), or by :func:`added`."""

    __array_ufunc__ = None

    def __init__(self, x, branch):
        self.x, self.branch, self.sum = x, branch, None

    def __add__(self, branch):  # h + mlp(...): the next residual, on this one's sum
        return added(self) + branch


def added(v):  # a Residual -> its sum, an array; an array as it is
    """The value of ``v``: a :class:`Residual`'s sum (added now unless a fused norm already did)."""
    if not isinstance(v, Residual):
        return v
    if v.sum is None:
        v.sum = v.branch.add(v.x, v.branch.out)
    return v.sum


class KVStore:
    """The keys and values of one causal attention layer, preallocated for ``max_len`` positions.

    k, v: (B, heads, max_len, d_h) arrays in ``dtype``; positions ``0 .. length - 1`` are filled.
    nbytes: K and V, whatever ``length`` is: the memory is reserved up front.
    """

    def __init__(self, batch, max_len, n_heads, d_head, dtype):
        self.batch = positive_int(batch, "batch")
        self.max_len = positive_int(max_len, "max_len")
        self.n_heads, self.d_head = int(n_heads), int(d_head)
        self.dtype = resolve_dtype(dtype)
        shape = (self.batch, self.n_heads, self.max_len, self.d_head)   # (B, heads, max_len, d_h)
        self.k = np.zeros(shape, self.dtype)
        self.v = np.zeros(shape, self.dtype)
        self.length = 0

    @property
    def d_model(self):
        return self.n_heads * self.d_head

    @property
    def nbytes(self):
        """Bytes of K and V: 2 * B * max_len * heads * d_h * itemsize."""
        return self.k.nbytes + self.v.nbytes

    @property
    def keys(self):     # (B, heads, length, d_h), a view
        return self.k[:, :, :self.length]

    @property
    def values(self):   # (B, heads, length, d_h), a view
        return self.v[:, :, :self.length]

    def reset(self):
        """Forget every position (the memory stays allocated)."""
        self.length = 0
        return self

    def append(self, k, v):  # (B, heads, n, d_h) each -> all keys and values so far, views
        """Write the n new positions after the filled ones; ``length`` moves only once the step
        has succeeded (the block's decode does it)."""
        t0, t1 = self.length, self.length + k.shape[2]
        self.k[:, :, t0:t1] = k
        self.v[:, :, t0:t1] = v
        return self.k[:, :, :t1], self.v[:, :, :t1]

    def attend(self, q, k, v, policy=SAFE, watch=no_watch):  # (B, H, n, d_h) -> (B, H, n, d_h)
        """The attention core of a decode step (what ``sdpa(..., kv=self)`` runs): the n new keys
        and values go after the filled positions, and the queries, at positions ``length ..
        length + n - 1``, read every position up to their own, tiled."""
        t0 = self.length
        k_all, v_all = self.append(k, v)                      # (B, H_kv, t0 + n, d_h), views
        return flash_attention_forward(q, k_all, v_all, None, True, policy, watch, q_offset=t0)

    def _repr(self, heads_name):
        return (f"{type(self).__name__}(batch={self.batch}, max_len={self.max_len}, "
                f"{heads_name}={self.n_heads}, d_head={self.d_head}, dtype={self.dtype}, "
                f"length={self.length}, nbytes={self.nbytes})")


class Module:
    """train / eval / zero_grad / state_dict / num_params for anything with ``params`` and
    ``grads`` dicts of live arrays and sub-modules in ``children()`` (blocks, stacks, LMs)."""

    training = True               # as a fresh torch.nn.Module

    def children(self):
        return ()

    def train(self, mode=True):
        mode = check_bool(mode, "mode")
        self._set_mode(mode)
        for child in self.children():
            child.train(mode)
        return self

    def _set_mode(self, mode):
        self.training = mode

    def eval(self):
        return self.train(False)

    def zero_grad(self):
        for g in self.grads.values():
            g[...] = 0

    def drop_cache(self):
        """Forget what the last forward kept for the backward, here and in every child: its
        memory is freed, and a backward now needs a new forward. Returns self."""
        self._drop_own_cache()
        for child in self.children():
            child.drop_cache()
        return self

    def _drop_own_cache(self):
        self._cache = None

    def state_dict(self):
        """A copy of the parameters, keyed and shaped as the reference model's state dict."""
        return {k: v.copy() for k, v in self.params.items()}

    def num_params(self):
        return int(sum(v.size for v in self.params.values()))


class BlockBase(Module):
    """The plumbing of a block family. A subclass sets ``config_type``, ``kv_type``,
    ``shapes_of(config)``, ``init_of(config, rng, dtype)`` and ``kv_heads``
    (the config's attribute counting the cached heads, and its symbol), then writes its forward
    and backward."""

    config_type = None
    kv_type = None
    _kv = None                    # the KV store of a step, while it runs (see step)

    def __init__(self, config, dtype=None, seed=0, policy="safe", check_finite=False, trace=False,
                 attention=DEFAULT_ATTENTION, fused=True):
        if not isinstance(config, self.config_type):
            raise TypeError(f"config: expected a preln.{self.config_type.__name__}; got "
                            f"{type(config).__name__}")
        self.config = config
        self.attention = check_choice(attention, ATTENTIONS, "attention")
        self.fused = check_bool(fused, "fused")
        self.check_finite = check_bool(check_finite, "check_finite")
        self.trace = check_bool(trace, "trace")
        self.dtype = resolve_dtype(DEFAULT_DTYPE if dtype is None else dtype)
        self.policy = resolve_policy(policy)
        self.rng = np.random.default_rng(check_seed(seed))
        self.params = type(self).init_of(config, self.rng, self.dtype)
        self.grads = {k: np.zeros_like(v) for k, v in self.params.items()}
        self.overflow = None          # set by forward when trace or check_finite is on
        self._cache = None

    def param_shapes(self):
        """The state dict's keys and shapes."""
        return type(self).shapes_of(self.config)

    def load_state_dict(self, state_dict):
        """Load parameters (numpy arrays or torch tensors); strict: every key, no extra, exact shapes."""
        shapes = self.param_shapes()
        check_state_keys(state_dict, shapes)
        new = {}
        for k, shape in shapes.items():
            a = check_float_array(state_dict[k], f"state_dict[{k!r}]")
            if a.shape != shape:
                raise ValueError(f"state_dict[{k!r}]: expected shape {shape}; got {a.shape}")
            new[k] = a.astype(self.dtype, copy=True)
        self.params = new
        self.grads = {k: np.zeros_like(v) for k, v in new.items()}

    @property
    def cache(self):
        """What the last forward kept for the backward: a NamedTuple of NamedTuples named after
        the forward's variables, or None. For reading: the backward uses it as it is."""
        return self._cache

    def cache_nbytes(self):
        """Bytes the last forward keeps for the backward (activations only, parameters excluded)."""
        if self._cache is None:
            return 0
        param_ids = {id(p) for p in self.params.values()}
        seen, total, stack = set(), 0, [self._cache]
        while stack:
            item = stack.pop()
            if isinstance(item, tuple):
                stack.extend(item)
            elif isinstance(item, np.ndarray):
                while isinstance(item.base, np.ndarray):
                    item = item.base   # views (q, k, v of qkv) share their base's memory
                if id(item) not in seen and id(item) not in param_ids:
                    seen.add(id(item))
                    total += item.nbytes
        return total

    # ---- shared steps of forward, decode and backward ------------------------------------------
    def _watch(self):
        return Watch(enabled=self.trace, raise_error=self.check_finite)

    def tiled(self):
        """Whether this pass's attention runs tiled: ``attention="tiled"``, or "auto" in eval mode."""
        return self.attention == "tiled" or (self.attention == "auto" and not self.training)

    def _backward_input(self, dy):  # -> the last forward's cache, dy in the block's dtype
        if self._cache is None:
            raise RuntimeError("backward: no forward to differentiate; call block(x) first "
                               "(a forward that raised leaves nothing to differentiate)")
        c = self._cache
        return c, check_same_shape(dy, c.shape, "dy").astype(self.dtype, copy=False)

    def _check_causal(self, name):
        """Causal blocks only may decode; a family that is always causal keeps this no-op."""

    def kv_cache(self, batch, max_len, dtype=None):
        """A fresh KV cache for ``batch`` sequences of up to ``max_len`` positions.

        dtype: the cache's storage dtype; None means the block's. Another dtype (a float16 cache for
        a float32 block, say) halves the memory and rounds every key and value once.
        """
        self._check_causal("kv_cache")
        dtype = self.dtype if dtype is None else resolve_dtype(dtype)
        return self.kv_type(batch, max_len, getattr(self.config, self.kv_heads[0]), self.config.d_head, dtype)

    def decode(self, x_new, kv):
        """Run the block on the next n positions of B sequences, given a KV cache
        (``block.kv_cache(batch, max_len)``) of the positions before them; x_new: (B, n, D), n >= 1
        -> y_new: (B, n, D).

        It is ``forward`` on the n positions with the attention reading and extending ``kv``
        (``kv.length`` grows by n; a Llama block rotates them at positions ``kv.length ..
        kv.length + n - 1``). Eval mode only, causal blocks only, no padding mask (every sequence
        of the batch is at the same position). Nothing is kept for a backward: ``block.backward``
        still differentiates the last ``forward``.
        """
        y = self.step(self.check_decode(x_new, kv), kv)           # (B, n, D)
        kv.length += y.shape[1]                                   # only once the step has succeeded
        return y

    def step(self, x, kv, fused=None):  # (B, n, D) -> (B, n, D)
        """``forward`` on x with the attention core swapped for the KV store's: ``kv.attend(q, k, v,
        policy, watch)`` takes the n new keys and values and returns what the queries read of every
        position so far -- :meth:`decode`'s step (after its checks), and a paged server's, whose
        store is one layer of its block pool. fused: False runs every op its own numpy call in this
        pass (None: as :meth:`fuses` says). ``kv`` is not advanced; nothing is kept for a backward.
        """
        kept = self._cache, self.fused
        self._kv, self.fused = kv, self.fused if fused is None else fused   # forward reads both
        try:
            return self.forward(x)
        finally:
            self._kv = None
            self._cache, self.fused = kept

    def check_decode(self, x_new, kv):  # -> x_new as (B, n, D) in the block's dtype
        """The checks of :meth:`decode`, alone: a stack runs them on every layer before any
        layer's cache moves. Raises what decode would; returns x_new as decode reads it."""
        self._check_causal("decode")
        if self.training:
            raise RuntimeError("decode: the block is in training mode; decoding is inference -- "
                               "call block.eval() first (dropout would differ from call to call)")
        kv_name = f"{self.kv_type.__module__}.{self.kv_type.__name__}"
        if not isinstance(kv, self.kv_type):
            raise TypeError(f"kv: expected a {kv_name} from block.kv_cache(batch, max_len); "
                            f"got {type(kv).__name__}")
        cfg = self.config
        heads, label = getattr(cfg, self.kv_heads[0]), self.kv_heads[1]
        if (kv.n_heads, kv.d_head) != (heads, cfg.d_head):
            raise ValueError(f"kv: expected a cache of {label} = {heads} heads of d_h = {cfg.d_head} "
                             f"(D = {cfg.d_model}); got {label} = {kv.n_heads}, d_h = {kv.d_head}")
        x = check_input(x_new, cfg.d_model, self.dtype, "x_new")   # (B, n, D)
        B, n, _ = x.shape
        if B != kv.batch:
            raise ValueError(f"x_new: expected batch B = {kv.batch} (the cache's); got shape {x.shape}")
        if kv.length + n > kv.max_len:
            raise ValueError(f"kv: the cache is full: it holds {kv.length} of max_len = {kv.max_len} "
                             f"positions and x_new brings {n} more; make a cache with a larger max_len")
        return x
