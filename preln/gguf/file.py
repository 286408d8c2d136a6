"""Reading a GGUF file: its metadata, its tensors dequantised, and llama.cpp's q/k row order undone.

A GGUF (llama.cpp's format) is a header of key/value metadata, a table of tensors (name, shape,
type, offset) and the tensors' bytes. llama.cpp's own reader (the ``gguf`` package) parses the
header and maps the bytes; the dequantisation is written here, in numpy, as ggml defines each block
format. Every format cuts a row into blocks of 32 weights:

    Q8_0: 34 bytes  = f16 scale d, 32 int8 codes q            w = d q
    Q4_0: 18 bytes  = f16 d, 16 bytes of two 4-bit codes      w = d (q - 8)
    Q4_1: 20 bytes  = f16 d, f16 minimum m, 16 bytes of codes w = d q + m
    (4-bit: byte j holds weight j in its low nibble and weight j + 16 in its high one)

The products are computed in float32, as ggml computes them, so the weights are exactly the ones
llama.cpp (and transformers' GGUF loader, which calls the same formulas) multiplies with; a float64
model casts those float32 numbers, exactly.
"""
import importlib
import os

import numpy as np

__all__ = ["GGUFError", "read", "dequantize", "dequantize_blocks", "unpermute_qk", "permute_qk",
           "tensor_array", "SUPPORTED_TYPES", "BLOCK", "GGUF_INSTALL"]

#: the exact install command of llama.cpp's reader, named by every error that needs it
GGUF_INSTALL = "pip install gguf==0.19.0"
#: weights per quantisation block in Q8_0, Q4_0 and Q4_1
BLOCK = 32
#: bytes per block: the scale (and minimum) as float16, then the codes
BLOCK_BYTES = {"Q8_0": 2 + BLOCK, "Q4_0": 2 + BLOCK // 2, "Q4_1": 4 + BLOCK // 2}
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1")


class GGUFError(ValueError):
    """A GGUF file this loader cannot use: truncated, of another architecture, of an unsupported
    tensor type, or missing a tensor."""


def require(module, what, install):
    """Import an optional package, or raise ModuleNotFoundError saying what needs it and the exact
    install command."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ModuleNotFoundError(f"preln.gguf {what} the {module!r} package, which is not "
                                  f"installed: {install}") from e


def gguf_module():
    """llama.cpp's reader, or an error saying how to install it."""
    return require("gguf", "reads GGUF files with llama.cpp's reader,", GGUF_INSTALL)


def read(path):
    """Open ``path`` -> (metadata {key: python value}, {tensor name: the reader's tensor}).

    Raises FileNotFoundError for a missing file and :class:`GGUFError` for one that is not a whole
    GGUF file (a truncated download, another format): the header must parse and every tensor's
    bytes must lie inside the file.
    """
    gguf = gguf_module()
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"path: no GGUF file at {path!r}")
    size = os.path.getsize(path)
    try:
        reader = gguf.GGUFReader(path)
    except (ValueError, IndexError, KeyError, OSError, TypeError) as e:   # what a cut header raises
        # a cut file fails inside the reader, wherever the cut falls (header, table or tensor bytes)
        raise GGUFError(f"path: {path!r} ({size} bytes) is not a complete GGUF file (truncated, or "
                        f"not GGUF): the reader failed with {type(e).__name__}: {e}") from e
    tensors = {}
    for t in reader.tensors:
        end = int(t.data_offset) + int(t.n_bytes)
        if end > size or t.data.nbytes != t.n_bytes:
            raise GGUFError(f"path: {path!r} is truncated: tensor {t.name!r} needs bytes up to {end}, "
                            f"the file has {size}")
        tensors[t.name] = t
    metadata = {}
    for key, field in reader.fields.items():
        value = field.contents()
        metadata[key] = value
    return metadata, tensors


def dequantize_blocks(raw, type_name):
    """Bytes of whole blocks, (..., n_blocks * block_bytes) uint8 -> (..., n_blocks * 32) float32."""
    nbytes = BLOCK_BYTES[type_name]
    raw = np.ascontiguousarray(raw, np.uint8)
    if raw.shape[-1] % nbytes:
        raise GGUFError(f"{type_name}: expected rows of whole {nbytes}-byte blocks; got {raw.shape[-1]} bytes")
    lead = raw.shape[:-1]
    b = raw.reshape(-1, nbytes)                                    # one block per row
    d = b[:, :2].copy().view(np.float16).astype(np.float32)        # (n, 1) the scale
    if type_name == "Q8_0":
        w = d * b[:, 2:].view(np.int8).astype(np.float32)          # w = d q, q in [-128, 127]
    else:
        qs = b[:, 4:] if type_name == "Q4_1" else b[:, 2:]         # (n, 16) two codes a byte
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=1)           # weights 0..15, then 16..31
        if type_name == "Q4_0":
            w = d * (q.astype(np.int8) - np.int8(8)).astype(np.float32)   # w = d (q - 8), symmetric
        else:
            m = b[:, 2:4].copy().view(np.float16).astype(np.float32)      # (n, 1) the minimum
            w = d * q.astype(np.float32) + m                              # w = d q + m, asymmetric
    return w.reshape(*lead, -1)


def tensor_array(t):
    """A reader tensor -> float32 (or float16 for F16) array in numpy's (rows, columns) order.

    GGUF lists a tensor's dimensions fastest first (ggml's ne[0] is the row length), so numpy's shape
    is the reversed list: token_embd.weight is [576, 49152] in the file, (49152, 576) here.
    """
    type_name = t.tensor_type.name
    shape = tuple(int(n) for n in reversed(t.shape))
    if type_name not in SUPPORTED_TYPES:
        raise GGUFError(f"tensor {t.name!r}: type {type_name} is not supported; supported: "
                        f"{', '.join(SUPPORTED_TYPES)}")
    data = np.asarray(t.data)
    if type_name == "F32":
        return data.astype(np.float32, copy=False).reshape(shape)
    if type_name == "F16":
        return data.view(np.float16).reshape(shape)
    if type_name == "BF16":   # the top 16 bits of a float32
        bits = data.view(np.uint16).astype(np.uint32) << 16
        return bits.view(np.float32).reshape(shape)
    if shape[-1] % BLOCK:
        raise GGUFError(f"tensor {t.name!r}: rows of {shape[-1]} weights are not whole {BLOCK}-weight blocks")
    return dequantize_blocks(data.reshape(-1, data.shape[-1]), type_name).reshape(shape)


def dequantize(t, dtype=np.float32):
    """A reader tensor, dequantised (in float32, as ggml does), then cast to ``dtype``."""
    return tensor_array(t).astype(dtype)


def permute_qk(w, n_heads):
    """transformers' rows of a q or k projection -> llama.cpp's: within each head, row i of the first
    half and row i of the second half become the adjacent rows 2i, 2i + 1.

    Why: RoPE rotates pairs of a head's dimensions. Meta's Llama code (and ggml's "normal" RoPE)
    pairs adjacent dimensions (2i, 2i + 1), as complex numbers; transformers' ``rotate_half`` pairs
    i with i + d_h / 2. Its conversion script reordered the q and k rows so that rotate-half computes
    Meta's model; llama.cpp's converter (``LlamaModel.permute``) puts them back in adjacent pairs.
    Only the order of the rows changes: q.k products, and so the model, are the same either way.
    """
    w = np.asarray(w)
    rows = w.shape[0]
    return w.reshape(n_heads, 2, rows // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_qk(w, n_heads):
    """llama.cpp's q/k rows -> transformers' (rotate-half) order; the inverse of :func:`permute_qk`.

    n_heads: the tensor's own heads -- H for attn_q, H_kv for attn_k.
    """
    w = np.asarray(w)
    rows = w.shape[0]
    if rows % (2 * n_heads):
        raise GGUFError(f"n_heads: {rows} rows are not {n_heads} heads of an even width")
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
