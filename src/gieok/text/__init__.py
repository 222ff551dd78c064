"""Text handling: Korean-aware tokenization, English stemming and stop words, keywords."""

from .tokenize import Tokenizer, TokenizerOptions, get_tokenizer
from .validate import clean_text

__all__ = ["Tokenizer", "TokenizerOptions", "get_tokenizer", "clean_text"]
