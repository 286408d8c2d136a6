"""The book's character corpus (preln/data/corpus.txt, see preln/data/README.md)."""
from pathlib import Path

from preln.models.lm import CharVocab
from preln.resources import data_path

__all__ = ["load_corpus"]


def load_corpus(path=None):
    """The chapter's corpus (preln/data/corpus.txt, see preln/data/README.md) -> (text, CharVocab, ids)."""
    path = Path(path) if path else data_path("corpus.txt")
    text = path.read_text(encoding="utf-8")
    vocab = CharVocab(text)
    return text, vocab, vocab.encode(text)
