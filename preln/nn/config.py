"""Configuration of one Transformer encoder block."""
from dataclasses import dataclass

from preln.ops.activations import ACTIVATIONS
from preln.validation import check_bool, check_choice, positive_float, positive_int


@dataclass(frozen=True)
class BlockConfig:
    """Hyper-parameters of one block; the names follow torch.nn.TransformerEncoderLayer.

    d_model:    D, the width of the residual stream (the last axis of x).
    n_heads:    H; each head works in d_h = D / H dimensions, so H must divide D.
    d_ff:       F, the hidden width of the MLP (4 D in most models).
    norm_first: True for Pre-LN, x + Attn(LN(x)); False for Post-LN, LN(x + Attn(x)).
    activation: "gelu" (exact, with erf), "gelu_tanh" or "relu".
    dropout:    drop probability in [0, 1), applied where PyTorch applies it (attention
                probabilities, both sublayer outputs and the MLP hidden layer) in training mode.
    eps:        LayerNorm epsilon, added to the variance inside the square root.
    causal:     mask each query from the keys after it.
    """

    d_model: int = 64
    n_heads: int = 4
    d_ff: int = 256
    norm_first: bool = True
    activation: str = "gelu"
    dropout: float = 0.0
    eps: float = 1e-5
    causal: bool = False

    def __post_init__(self):
        for name in ("d_model", "n_heads", "d_ff"):
            object.__setattr__(self, name, positive_int(getattr(self, name), name))   # numpy ints -> int
        if self.d_model % self.n_heads:
            raise ValueError(f"n_heads: expected a divisor of d_model={self.d_model}; got {self.n_heads}")
        check_choice(self.activation, ACTIVATIONS, "activation")
        if not isinstance(self.dropout, (int, float)) or not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout: expected a probability in [0, 1); got {self.dropout!r}")
        positive_float(self.eps, "eps")
        for name in ("norm_first", "causal"):
            check_bool(getattr(self, name), name)

    @property
    def d_head(self):
        """d_h = D / H, the width of one attention head."""
        return self.d_model // self.n_heads
