"""Copy candidates: what the text so far says comes next, as inputs of a
draft head.

Where a draft head misses a token the base is sure of, the token is a copy
of the text before it nine times in ten (`docs/training.md`, "Copy
candidates"): a name of the prompt, a phrase the answer repeats. The micro
decoder sees only the features of one row and the tokens it drafts, so it
cannot copy what it never sees. A draft head with copy candidates reads,
at each token it is fed, the tokens that followed the latest earlier
occurrence of the text's last m tokens there, for m = M, M-1, ..., 1
(llama.cpp's `ngram-simple` lookup, one token of it per size), and adds
`copy([embed(c_M); ...; embed(c_1)])` to the token's embedding, a missing
candidate counting as a zero vector. `copy` is one [M*D -> D] matrix
without bias (the GGUF's `draft_copy.weight`), zero at first: the head
starts as the one it trains from.

The text is the prompt, the answer so far and the drafts before the token;
`TextIndex` looks candidates up in it both for a teacher-forced row (the
text's own tokens) and for autoregressive drafts (the text up to a row,
then drafts the text may not hold).
"""

from __future__ import annotations

from bisect import bisect_right

import torch
import torch.nn as nn

COPY_LR_SCALE = 10.0
"""The copy matrix's learning rate over the head's: from zero it has far to
go, and at the head's own rate it does not get there in a run (measured:
1e-3 against the head's 1e-4)."""


def sizes_of(longest: int) -> list[int]:
    """The n-gram sizes of a head that copies from matches of up to
    `longest` tokens, longest first (the order of the copy matrix's input)."""
    return list(range(longest, 0, -1))


def copy_matrix(longest: int, dim: int) -> nn.Linear:
    """A new copy matrix for n-grams up to `longest` over embeddings of
    `dim`, zero: it changes nothing until trained."""
    lin = nn.Linear(longest * dim, dim, bias=False)
    nn.init.zeros_(lin.weight)
    return lin


class TextIndex:
    """One text (a prompt and the answer after it) indexed for lookups:
    where each run of m tokens ends, for every m of `sizes`."""

    def __init__(self, text: list[int], sizes: list[int]):
        self.text, self.sizes = text, sizes
        self.ends: list[dict[tuple, list[int]]] = []
        for m in sizes:
            ends: dict[tuple, list[int]] = {}
            for p in range(m - 1, len(text)):
                ends.setdefault(tuple(text[p - m + 1:p + 1]), []).append(p)
            self.ends.append(ends)

    def candidates(self, length: int, tail: list[int] = ()) -> list[int]:
        """For the last token of the text's first `length` tokens followed by
        `tail` (drafts), each size's candidate, longest first: the token
        after the latest earlier occurrence of the last m tokens, -1 where
        they did not occur before."""
        tail = list(tail)
        # Occurrences ending inside the tail (or at the text's last token) are followed by a tail token.
        near = self.text[max(0, length - max(self.sizes) - len(tail)):length] + tail
        offset = length - (len(near) - len(tail))
        q = len(near) - 1
        out = []
        for m, ends in zip(self.sizes, self.ends):
            found = -1
            if q + 1 >= m:
                key = near[q - m + 1:q + 1]
                for p in range(q - 1, max(m - 2, length - 2 - offset), -1):
                    if near[p - m + 1:p + 1] == key:
                        found = near[p + 1]
                        break
                if found < 0:
                    at = ends.get(tuple(key), [])
                    i = bisect_right(at, length - 2) - 1  # ended before the text's last token
                    if i >= 0:
                        found = self.text[at[i] + 1]
            out.append(found)
        return out


def teacher_forced(index: TextIndex, n_prompt: int, rows: int, n: int) -> torch.Tensor:
    """The candidates of the `n` tokens the micro decoder reads at each of
    an answer's `rows` rows, teacher-forced (the text's own: row k reads the
    text's tokens n_prompt + k .. n_prompt + k + n - 1), [rows, n, M]; -1
    where there is none or the text has ended."""
    first, m = min(n_prompt, len(index.text)), len(index.sizes)
    # Each place's candidates once (a row reads n consecutive places), from the first place a row reads.
    per_pos = torch.tensor([index.candidates(q + 1) for q in range(first, len(index.text))],
                           dtype=torch.long).reshape(-1, m)
    q = n_prompt - first + torch.arange(rows)[:, None] + torch.arange(n)[None]
    out = torch.full((rows, n, m), -1, dtype=torch.long)
    inside = q < len(per_pos)
    out[inside] = per_pos[q[inside]]
    return out


def embed_candidates(embed: nn.Embedding, copy: nn.Linear, candidates: torch.Tensor) -> torch.Tensor:
    """`copy([embed(c_M); ...; embed(c_1)])` for candidates [..., M] (-1:
    none, a zero vector), [..., D]."""
    e = embed(candidates.clamp(min=0)) * (candidates >= 0)[..., None]
    return copy(e.flatten(-2).to(copy.weight.dtype))
