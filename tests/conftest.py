"""Shared fixtures of the unit tests.

Small float64 blocks for gradient checks (every parameter is perturbed, so they must stay tiny),
and a helper that builds a block of any dtype from another block's weights.
"""
import numpy as np
import pytest

from preln import BlockConfig, TransformerBlock

#: the shape of the gradient-check blocks: B=2, S=4, D=8, H=2, F=16 (about 600 parameters)
SMALL = dict(d_model=8, n_heads=2, d_ff=16)


def make_block(dtype=np.float64, seed=0, state_dict=None, **config):
    """A TransformerBlock with SMALL sizes unless overridden; optional weights to load."""
    cfg = BlockConfig(**{**SMALL, **config})
    block = TransformerBlock(cfg, dtype=dtype, seed=seed)
    if state_dict is not None:
        block.load_state_dict(state_dict)
    return block


@pytest.fixture
def rng():
    """A fresh, fixed-seed generator per test, so tests do not depend on their order."""
    return np.random.default_rng(1234)


@pytest.fixture
def block_factory():
    return make_block
