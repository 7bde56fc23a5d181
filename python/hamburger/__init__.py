"""The HAMburger runtime in Python, with llama-cpp-python's ``Llama`` API.

``from hamburger import Llama`` loads a HAMburger GGUF (or a llama GGUF, its
base alone) in this process and decodes with macro steps: one base forward
emits up to ``max_steps`` tokens and writes one KV entry. Code written for
llama-cpp-python runs with its import changed; each answer also carries the
runtime's ``timings`` (``tokens_per_step``, ``kv_entries``, ...).
"""

from ._native import LoadError
from .llama import LLAMA_DEFAULT_SEED, Llama, LlamaGrammar

__all__ = ["Llama", "LlamaGrammar", "LoadError", "LLAMA_DEFAULT_SEED"]
