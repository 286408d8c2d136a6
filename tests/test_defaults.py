"""One set of defaults for every block, the stack and the LMs: README.md's table of defaults (in
its package section) is what the code does -- each class built with no dtype or attention argument
stores every parameter in the table's dtype and runs every block with the table's attention."""
import inspect
import re
from pathlib import Path

import numpy as np
import pytest

import preln.models.llama_lm
import preln.models.lm
import preln.nn.block
import preln.nn.llama
import preln.nn.stack
from preln import BlockConfig, LlamaBlock, LlamaConfig, PreLNTransformerBlock, TransformerBlock
from preln.models.llama_lm import LlamaLM
from preln.models.lm import TinyLM
from preln.nn.base import DEFAULT_ATTENTION, DEFAULT_DTYPE, BlockBase
from preln.nn.stack import TransformerStack

README = Path(__file__).resolve().parents[1] / "README.md"
HEADER = "| classes | `dtype` | `attention` |"

#: each class of the table built with its defaults (the smallest configuration it takes)
BUILD = {
    "TransformerBlock": lambda: TransformerBlock(BlockConfig(d_model=8, n_heads=2, d_ff=16)),
    "PreLNTransformerBlock": lambda: PreLNTransformerBlock(d_model=8),
    "LlamaBlock": lambda: LlamaBlock(LlamaConfig(d_model=8, n_heads=2, n_kv_heads=1, d_ff=12)),
    "TransformerStack": lambda: TransformerStack(BlockConfig(d_model=8, n_heads=2, d_ff=16), 2),
    "TinyLM": lambda: TinyLM(),
    "LlamaLM": lambda: LlamaLM(),
}


def readme_defaults():
    """{class name: (dtype, attention)} from the README's table of defaults."""
    lines = README.read_text().splitlines()
    start = lines.index(HEADER) + 2                        # past the header and its rule
    out = {}
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        classes, dtype, attention = (c.strip() for c in line.strip("|").split("|"))
        for name in re.findall(r"`(\w+)`", classes):
            out[name] = (np.dtype(dtype), attention.strip('"'))
    return out


def blocks_of(model):
    if isinstance(model, BlockBase):
        return [model]
    if isinstance(model, TransformerStack):
        return model.layers
    return model.stack.layers if isinstance(model, TinyLM) else model.layers


def test_the_table_is_one_set_the_package_states_once():
    table = readme_defaults()
    assert set(table) == set(BUILD)
    assert set(table.values()) == {(DEFAULT_DTYPE, DEFAULT_ATTENTION)}
    assert (DEFAULT_DTYPE, DEFAULT_ATTENTION) == (np.float32, "auto")    # PyTorch's dtype


@pytest.mark.parametrize("name", sorted(BUILD))
def test_a_class_built_with_no_arguments_has_the_table_s_defaults(name):
    dtype, attention = readme_defaults()[name]
    model = BUILD[name]()
    assert model.dtype == dtype
    assert {v.dtype for v in model.params.values()} == {dtype}
    blocks = blocks_of(model)
    assert [b.attention for b in blocks] == [attention] * len(blocks)
    assert all(b.eval().tiled() for b in blocks) and not any(b.train().tiled() for b in blocks)


def test_every_block_stack_and_lm_class_is_in_the_table():
    """A new class of preln.nn or preln.models taking a dtype gets a row (or the test names it)."""
    modules = (preln.nn.block, preln.nn.llama, preln.nn.stack, preln.models.lm, preln.models.llama_lm)
    with_dtype = {name for m in modules for name in m.__all__
                  if inspect.isclass(cls := getattr(m, name)) and "dtype" in inspect.signature(cls).parameters
                  and not name.endswith("KVCache")}
    assert with_dtype == set(readme_defaults())


@pytest.mark.parametrize("name", sorted(BUILD))
def test_the_signature_says_the_default(name):
    """What help() and the API page show: float32 (a block's None is float32 too)."""
    classes = {"TransformerBlock": TransformerBlock, "PreLNTransformerBlock": PreLNTransformerBlock,
               "LlamaBlock": LlamaBlock, "TransformerStack": TransformerStack, "TinyLM": TinyLM,
               "LlamaLM": LlamaLM}
    params = inspect.signature(classes[name]).parameters
    assert params["dtype"].default in (None, DEFAULT_DTYPE)
    if "attention" in params:
        assert params["attention"].default == DEFAULT_ATTENTION
