"""The blocks read as their equations (issue 35): ``forward`` holds the residual lines over this
pass's sublayers, ``backward`` reads them from the bottom up, every op of preln.ops is at most two
calls from ``forward``, and the variants swap sublayers or linears, never restate them."""
import inspect
import sys

import numpy as np
import pytest

from preln import BlockConfig, LlamaBlock, LlamaConfig, TransformerBlock
from preln.nn.base import Sublayer

#: the most calls from a block's forward to an op of preln.ops: forward -> sublayer -> op
MAX_HOPS = 2

PRE_LN = ("h = x + attn(ln1(x))", "y = h + mlp(ln2(h))")
POST_LN = ("h = ln1(x + attn(x))", "y = ln2(h + mlp(h))")


def lines(method):
    return [line.split("#")[0].strip() for line in inspect.getsource(method).splitlines()]


@pytest.mark.parametrize("cls, forms", [(TransformerBlock, (PRE_LN, POST_LN)), (LlamaBlock, (PRE_LN,))])
def test_forward_holds_the_residual_equations(cls, forms):
    src = lines(cls.forward)
    for form in forms:
        at = [src.index(eq) for eq in form]            # raises ValueError if a line is missing
        assert at[0] < at[1]
    # and nothing but the sublayers computes in between: no op is called by name in forward
    assert not any("_forward(" in line for line in src)


@pytest.mark.parametrize("cls", [TransformerBlock, LlamaBlock])
def test_backward_reads_the_equations_bottom_up(cls):
    src = "\n".join(lines(cls.backward))
    # Pre-LN: the MLP's line first, then the attention's, each norm given the residual's gradient
    assert src.index("mlp.backward(dy") < src.index("attn.backward(dh")
    assert "ln2.backward(mlp.backward(dy, c.mlp)" in src
    assert "ln1.backward(attn.backward(dh, c.attn)" in src


@pytest.mark.parametrize("block", [TransformerBlock(BlockConfig(d_model=8, n_heads=2, d_ff=16)),
                                   LlamaBlock(LlamaConfig(d_model=8, n_heads=2, n_kv_heads=1, d_ff=12))])
def test_every_sublayer_has_its_backward_beside_its_forward(block):
    for sub in block.sublayers():
        assert isinstance(sub, Sublayer)
        assert "__call__" in vars(type(sub)) and "backward" in vars(type(sub)), type(sub).__name__


#: frames of a comprehension (Python 3.11 gives them their own), counted with their function
COMPREHENSIONS = ("<genexpr>", "<listcomp>", "<dictcomp>", "<setcomp>")


def ops_hops(run, forward_code):
    """{op name: the most preln calls from forward to it} over ``run()``; an op an op calls is
    the outer op's business (not counted)."""
    hops = {}

    def profile(frame, event, arg):
        if event != "call" or not frame.f_globals.get("__name__", "").startswith("preln.ops"):
            return
        chain, f = [], frame.f_back
        while f is not None and f.f_code is not forward_code:
            if f.f_code.co_name not in COMPREHENSIONS:      # part of the function it is written in
                chain.append(f.f_globals.get("__name__", ""))
            f = f.f_back
        if f is None or any(m.startswith("preln.ops") for m in chain):
            return                                       # not under forward, or inside another op
        n = 1 + sum(m.startswith("preln") for m in chain)   # frames of preln's own code in between
        name = f"{frame.f_globals['__name__']}.{frame.f_code.co_name}"
        hops[name] = max(hops.get(name, 0), n)

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return hops


def transformer_runs():
    x = np.random.default_rng(0).standard_normal((2, 5, 8))
    for norm_first in (True, False):
        for fused in (True, False):
            cfg = BlockConfig(d_model=8, n_heads=2, d_ff=16, norm_first=norm_first, causal=True,
                              dropout=0.1)
            for train in (True, False):
                block = TransformerBlock(cfg, dtype=np.float64, fused=fused).train(train)
                yield (f"TransformerBlock norm_first={norm_first} fused={fused} train={train}",
                       lambda b=block: b(x), TransformerBlock.forward)
            block = TransformerBlock(cfg, dtype=np.float64, fused=fused).eval()
            kv = block.kv_cache(2, 5)
            yield (f"TransformerBlock decode norm_first={norm_first} fused={fused}",
                   lambda b=block, kv=kv: b.decode(x, kv), TransformerBlock.forward)


def llama_runs():
    x = np.random.default_rng(0).standard_normal((2, 5, 8))
    cfg = LlamaConfig(d_model=8, n_heads=2, n_kv_heads=1, d_ff=12,
                      rope_scaling={"rope_type": "linear", "factor": 2.0})
    for fused in (True, False):
        for train in (True, False):
            block = LlamaBlock(cfg, fused=fused).train(train)
            yield f"LlamaBlock fused={fused} train={train}", lambda b=block: b(x), LlamaBlock.forward
        block = LlamaBlock(cfg, fused=fused).eval()
        kv = block.kv_cache(2, 5)
        yield f"LlamaBlock decode fused={fused}", lambda b=block, kv=kv: b.decode(x, kv), LlamaBlock.forward


@pytest.mark.parametrize("label, run, forward", list(transformer_runs()) + list(llama_runs()),
                         ids=lambda v: v if isinstance(v, str) else "")
def test_every_op_is_at_most_two_calls_from_forward(label, run, forward):
    hops = ops_hops(run, forward.__code__)
    assert any(name.endswith(("linear_forward", "swiglu_forward")) for name in hops), hops   # ops were seen
    far = {name: n for name, n in hops.items() if n > MAX_HOPS}
    assert not far, f"{label}: ops more than {MAX_HOPS} calls from forward: {far}"


def test_the_hop_count_sees_a_deeper_call():
    """The counter itself, from a caller one level above forward: forward's own ops count one
    more (three), RoPE's tables, behind rope_tables, too."""
    block = LlamaBlock(LlamaConfig(d_model=8, n_heads=2, n_kv_heads=1, d_ff=12))
    x = np.random.default_rng(0).standard_normal((1, 3, 8))

    def caller():
        return block.forward(x)

    hops = ops_hops(caller, caller.__code__)
    assert hops["preln.ops.rope.rope_cos_sin"] == MAX_HOPS + 1        # forward -> rope_tables -> op
    assert hops["preln.ops.linear.linear_forward"] == MAX_HOPS + 1    # forward -> attn -> op
    assert max(hops.values()) == MAX_HOPS + 1


@pytest.mark.parametrize("norm_first, kernels", [(True, {"add_layer_norm", "bias_residual"}),
                                                 (False, {"add_layer_norm"})])
def test_fused_norms_take_the_residual_sum_whole(norm_first, kernels):
    """``x + attn(...)`` handed to a fused norm is added inside the norm's kernel (one pass); only
    Pre-LN's last sum, which no norm reads, runs the bias + residual kernel."""
    cfg = BlockConfig(d_model=8, n_heads=2, d_ff=16, norm_first=norm_first)
    x = np.random.default_rng(0).standard_normal((2, 5, 8))
    for fused in (True, False):
        block = TransformerBlock(cfg, dtype=np.float64, fused=fused).eval()
        hops = ops_hops(lambda: block(x), TransformerBlock.forward.__code__)
        names = {n.rpartition(".")[2] for n in hops}
        assert names & {"add_layer_norm", "bias_residual"} == (kernels if fused else set())


@pytest.mark.parametrize("family", ["transformer", "llama"])
def test_the_sharded_block_is_the_block_with_sharded_sublayers(family):
    """ParallelBlock runs the family's own forward, its attention and MLP the family's sublayers
    wrapped in Sharded (column/row parallel, the collectives around them), nothing restated."""
    from preln.nn.block import MLP, LayerNorm, MultiheadAttention
    from preln.nn.llama import RMSNorm, SwiGLU, GroupedQueryAttention
    from preln.parallel import ParallelBlock, run_simulated
    from preln.parallel.tensor import Sharded

    if family == "llama":
        block, types = LlamaBlock(LlamaConfig(d_model=16, n_heads=4, n_kv_heads=2, d_ff=24)), \
            (RMSNorm, GroupedQueryAttention, RMSNorm, SwiGLU)
    else:
        block, types = TransformerBlock(BlockConfig(d_model=16, n_heads=4, d_ff=32), dtype=np.float64), \
            (LayerNorm, MultiheadAttention, LayerNorm, MLP)

    def rank(comm):
        pb = ParallelBlock(block.eval(), comm)
        subs = pb.block.sublayers()
        assert type(pb.block).forward is type(block).forward
        assert [type(s.inner if isinstance(s, Sharded) else s) for s in subs] == list(types)
        assert [isinstance(s, Sharded) for s in subs] == [False, True, False, True]
        return True

    assert all(run_simulated(2, rank))


def test_one_attention_core_and_the_quantised_block_swaps_only_its_linears():
    """Both families' attention sublayers run preln.ops.sdpa, the sharded and the quantised blocks
    run those sublayers (no attention of their own), and the quantised block's only change to
    the computation is its linears."""
    import preln.quant.weight_only as gq
    import preln.parallel.tensor as tensor
    from preln.nn.block import MultiheadAttention
    from preln.nn.llama import GroupedQueryAttention

    kernels = ("attention_forward(", "flash_attention_forward(", "flash_attention_train(", "softmax(")
    for cls in (MultiheadAttention, GroupedQueryAttention):
        src = inspect.getsource(cls.__call__)
        assert "sdpa(" in src and not any(k in src for k in kernels), cls.__name__
    # weight-only quantisation (both families' blocks and models, its linear, AWQ's objective)
    for part in (tensor, gq):
        src = inspect.getsource(part)
        assert not any(k in src for k in kernels + ("sdpa(", "split_heads(")), part.__name__
    for cls in (gq.WeightOnlyLlamaBlock, gq.WeightOnlyBlock):     # what weight_only's classes add
        own = {k for c in cls.__mro__ if c.__module__ == gq.__name__ for k in vars(c)}
        assert "linear" in own and not own & {"forward", "sublayers", "decode"}, cls.__name__


def test_the_int8_reference_and_the_paged_step_run_the_blocks_forward(monkeypatch):
    """The INT8 chapter's op-by-op reference swaps the block's linears, the paged server swaps its
    attention core for the pool (a KV store's ``attend``): both run TransformerBlock.forward, once
    a block, and neither module states a sublayer of its own."""
    import preln.nn.base as base
    import preln.nn.block as block_module
    import preln.quant.int8 as int8
    import preln.serve.paged as paged
    from preln.models.lm import LMConfig, TinyLM

    runs = []
    forward = TransformerBlock.forward
    monkeypatch.setattr(TransformerBlock, "forward", lambda self, *a: runs.append(self) or forward(self, *a))
    block = TransformerBlock(BlockConfig(d_model=8, n_heads=2, d_ff=16), dtype=np.float64).eval()
    int8.block_forward(block.params, block.config, np.ones((1, 3, 8)))
    assert len(runs) == 1
    lm = TinyLM(LMConfig(vocab_size=5, max_len=8, d_model=8, n_heads=2, d_ff=16, n_layers=2), seed=1).eval()
    cache = paged.PagedKVCache(2, 4, 4, 2, 4, lm.dtype)
    cache.add("a")
    paged.paged_forward(lm, cache, [("a", np.array([1, 2, 3]))])
    assert runs[1:] == lm.stack.layers                         # each layer's own forward, in order
    assert not hasattr(block_module, "Reference") and not hasattr(base, "block_equations")
    restated = ("split_heads(", "attention_forward(", "activation_forward(", "linear_forward(")
    for part in (int8, paged):
        src = inspect.getsource(part)
        assert not any(k in src for k in restated), part.__name__
