"""The base's scores of an answer's tokens as `scored.jsonl` and
`segments.jsonl` keep them: at every answer token its entropy (`entropy`)
and its most likely tokens with their log-probabilities, most likely first.

Two forms are read. `hamburger-eval score` (the CPU path, and work
directories made by hand) writes JSON numbers: `entropy` a list and `top` a
list per token of [token, log-probability] pairs. `generate` (a GPU window)
writes each as a base64 string of a native-endian array (`entropy`: f32
[n]; `top_ids`: i32 [n * k]; `top_logp`: f32 [n * k]): a window's 1.2 M
answer tokens hold 20 M such numbers, which as JSON took about a minute of
the window's clock to write, read back and parse, and as arrays take seconds.
"""

from __future__ import annotations

import base64
from array import array
from itertools import chain

import torch


def packed(entropy: list[float], ids: list[list[int]], logp: list[list[float]]) -> dict:
    """The fields of one answer's scores in the packed form: `entropy` [n],
    and its `ids` [n][k] and their `logp` [n][k]."""
    def b64(kind: str, values) -> str:
        return base64.b64encode(array(kind, values).tobytes()).decode("ascii")
    return {"entropy": b64("f", entropy), "top_ids": b64("i", chain.from_iterable(ids)),
            "top_logp": b64("f", chain.from_iterable(logp))}


def unpack(text: str, dtype: torch.dtype) -> torch.Tensor:
    """A packed field as a 1-D tensor of `dtype` (f32 or i32) on the default
    device, as `torch.tensor` makes the list form's (in a GPU window, the
    GPU: `frombuffer` alone gives a CPU tensor, which training's indexing
    by device tensors refuses)."""
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=dtype).to(torch.get_default_device())


def entropy(row: dict) -> list[float]:
    """The entropy at each answer token of a record, in either form."""
    e = row["entropy"]
    return e if isinstance(e, list) else array("f", base64.b64decode(e)).tolist()


def has_top(row: dict) -> bool:
    """Whether a record keeps the base's most likely tokens (in either form)."""
    return "top" in row or "top_ids" in row


TOP_FIELDS = ("top", "top_ids", "top_logp")
"""The fields that hold the most likely tokens, in either form: what `segment` copies on."""


def top(row: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The most likely tokens of a record's answer tokens, [n, k] ids (int64)
    and [n, k] log-probabilities (f32), in either form."""
    if "top" in row:
        t = torch.tensor(row["top"])  # [n, k, 2]: token, log-probability
        return t[..., 0].long(), t[..., 1].float()
    n = len(row["ids"]) - row["n_prompt"]
    return (unpack(row["top_ids"], torch.int32).long().view(n, -1),
            unpack(row["top_logp"], torch.float32).view(n, -1))
