"""The tokenizer a GGUF file describes, built with the ``tokenizers`` package.

A GGUF carries no tokenizer.json: it stores the vocabulary (``tokenizer.ggml.tokens``), the merges,
each token's type (1 normal, 3 control, 4 user-defined), the special ids and the chat template as
metadata. For a byte-level BPE vocabulary (``tokenizer.ggml.model == "gpt2"``, SmolLM2's and Llama
3's) this builds the tokenizer transformers builds from the same file: GPT-2's byte-level BPE over
the vocabulary, control tokens as special tokens kept whole, user-defined tokens as added ones,
and Llama 3's pre-tokenizer split where ``tokenizer.ggml.pre`` names it. tests/test_gguf.py checks
the ids against ``AutoTokenizer.from_pretrained(dir, gguf_file=...)``.
"""
import json

import numpy as np

from preln.gguf.file import GGUFError, require
from preln.validation import check_token_ids

__all__ = ["GGUFTokenizer", "TOKENIZERS_INSTALL", "JINJA_INSTALL"]

TOKENIZERS_INSTALL = "pip install tokenizers==0.23.3"
JINJA_INSTALL = "pip install Jinja2==3.1.6"

# Llama 3's split of text into words before the merges (the regex of its tokenizer.json); the
# other pre-tokenizer names use GPT-2's (what transformers does too)
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_PRE = {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0",
              "lfm2", "dbrx", "smaug-bpe"}
CONTROL, USER_DEFINED = 3, 4


def tokenizers_module():
    return require("tokenizers", "builds the tokenizer with", TOKENIZERS_INSTALL)


def bytes_to_unicode():
    """GPT-2's map of the 256 bytes to printable characters: a byte-level vocabulary spells every
    token with these (a space is 'Ġ'), so that BPE works on text with no byte left unprintable."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


class GGUFTokenizer:
    """encode(text) -> ids, decode(ids) -> text, apply_chat_template(messages) -> ids, for the
    byte-level BPE vocabulary of a GGUF file's metadata.

    Attributes: ``vocab_size``, ``bos_token_id``, ``eos_token_id``, ``unk_token_id``,
    ``pad_token_id`` (None where the file names none), ``chat_template`` (str or None),
    ``special_tokens`` (the control tokens), ``backend`` (the ``tokenizers.Tokenizer``).
    """

    def __init__(self, metadata):
        tk = tokenizers_module()
        kind = metadata.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise GGUFError(f"tokenizer.ggml.model: {kind!r} is not supported; supported: 'gpt2' "
                            f"(byte-level BPE, as SmolLM2 and Llama 3)")
        tokens = list(metadata["tokenizer.ggml.tokens"])
        types = list(metadata.get("tokenizer.ggml.token_type", [1] * len(tokens)))
        merges = [tuple(m.split(" ")) for m in metadata.get("tokenizer.ggml.merges", [])]
        spelling = bytes_to_unicode()
        alphabet = set(spelling.values())
        # tokens outside the byte alphabet (a control token such as '<|im_start|>' is in it) are
        # re-spelled byte by byte, as transformers does
        vocab = {t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8")): i
                 for i, t in enumerate(tokens)}
        backend = tk.Tokenizer(tk.models.BPE(vocab=vocab, merges=merges, dropout=None,
                                             continuing_subword_prefix="", end_of_word_suffix="",
                                             fuse_unk=False))
        prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", False))
        if metadata.get("tokenizer.ggml.pre") in LLAMA3_PRE:
            backend.pre_tokenizer = tk.pre_tokenizers.Sequence([
                tk.pre_tokenizers.Split(tk.Regex(LLAMA3_SPLIT), behavior="isolated"),
                tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        else:
            backend.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=prefix)
        backend.decoder = tk.decoders.ByteLevel()
        # control tokens stay whole wherever they occur in the text (else '<|im_end|>' is cut into
        # '<', '|', 'im', ...); a mislabelled one outside the byte alphabet is skipped, as transformers does
        self.special_tokens = [t for t, k in zip(tokens, types) if k == CONTROL and set(t) <= alphabet]
        backend.add_special_tokens([tk.AddedToken(t, normalized=False, special=True)
                                    for t in self.special_tokens])
        user = [t for t, k in zip(tokens, types) if k == USER_DEFINED and t in vocab]
        if user:
            backend.add_tokens([tk.AddedToken(t, normalized=False, special=False) for t in user])
        self.backend = backend
        self.vocab_size = len(tokens)
        self.tokens = tokens
        for name, key in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("unk", "unknown_token_id"),
                          ("pad", "padding_token_id")):
            i = metadata.get(f"tokenizer.ggml.{key}")
            setattr(self, f"{name}_token_id", None if i is None else int(i))
            setattr(self, f"{name}_token", None if i is None else tokens[int(i)])
        self.add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", False))
        self.add_eos = bool(metadata.get("tokenizer.ggml.add_eos_token", False))
        self.chat_template = metadata.get("tokenizer.chat_template")

    def __len__(self):
        return self.vocab_size

    def encode(self, text, add_special_tokens=True):
        """text -> list of ids. Special tokens written in the text ('<|im_start|>') are one id each;
        add_special_tokens: prepend BOS / append EOS where the file asks for it (``add_bos_token``)."""
        if not isinstance(text, str):
            raise TypeError(f"text: expected a str; got {type(text).__name__}")
        try:                      # a lone surrogate ('\ud800') is a str the backend cannot take
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"text: expected Unicode text (encodable as UTF-8); got {text[e.start:e.end]!r} "
                             f"at index {e.start}, a lone surrogate") from None
        ids = self.backend.encode(text, add_special_tokens=False).ids
        if add_special_tokens and self.add_bos and self.bos_token_id is not None:
            ids = [self.bos_token_id] + ids
        if add_special_tokens and self.add_eos and self.eos_token_id is not None:
            ids = ids + [self.eos_token_id]
        return ids

    def decode(self, ids, skip_special_tokens=False):
        """ids -> text (bytes that do not form UTF-8 come out as U+FFFD); no ids -> "".
        Integer ids only: 1.5 is refused, not read as 1."""
        ids = np.asarray(ids)
        if ids.size == 0 and ids.ndim == 1:
            return ""
        ids = check_token_ids(ids, self.vocab_size, "ids", ndim=1)
        return self.backend.decode(ids.tolist(), skip_special_tokens=skip_special_tokens)

    def render_chat(self, messages, add_generation_prompt=False):
        """The file's chat template (Jinja) rendered as transformers renders it: a sandbox, blocks
        trimmed, ``bos_token``/``eos_token`` and ``raise_exception`` available."""
        if self.chat_template is None:
            raise ValueError("chat template: the GGUF file has no tokenizer.chat_template")
        try:
            import jinja2
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError as e:
            raise ModuleNotFoundError(f"the chat template is Jinja; install it: {JINJA_INSTALL}") from e

        def raise_exception(message):
            raise jinja2.exceptions.TemplateError(message)

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                              sort_keys=sort_keys)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        return env.from_string(self.chat_template).render(
            messages=list(messages), add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "", eos_token=self.eos_token or "",
            unk_token=self.unk_token or "", pad_token=self.pad_token or "")

    def apply_chat_template(self, messages, add_generation_prompt=False, tokenize=True):
        """[{"role": ..., "content": ...}, ...] -> the ids of the rendered chat (or its text with
        tokenize=False); add_generation_prompt: end with the assistant's opening."""
        if not isinstance(messages, (list, tuple)) or not all(
                isinstance(m, dict) and {"role", "content"} <= set(m) for m in messages):
            raise TypeError("messages: expected a list of {'role': ..., 'content': ...} dicts")
        text = self.render_chat(messages, add_generation_prompt)
        return self.encode(text, add_special_tokens=False) if tokenize else text
