"""`average-heads`: draft heads averaged tensor by tensor, a model soup.

Two draft runs that go on from the same head, on other draws of rows (a
seed) or other answers, end in nearby minima; their mean, with the head they
started from, accepts more than any of them (`docs/training.md`, "Draft run
16: a soup of heads"), as Wortsman et al.'s model soups and WiSE-FT found for
fine-tuned models. The heads must be draft heads alone
(`draft-head.safetensors`) with the same names and shapes; the mean is taken
in f32 and written in the first head's types.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from .drafting import check_head_alone, check_same_tensors, read_tensors
from .export import write_safetensors


def average(heads: list[dict[str, torch.Tensor]], paths: list[Path]) -> dict[str, torch.Tensor]:
    """The tensor-by-tensor mean of `heads` (read from `paths`), in the
    first's types. A head whose names or shapes differ from the first's is
    refused in one line naming its file and the tensor."""
    first = heads[0]
    for head, path in zip(heads[1:], paths[1:]):
        check_same_tensors(head, first, f"average-heads: --head {path}", str(paths[0]))
    # Summed from the first head's values, not from 0, so that -0 stays -0.
    total = {k: sum((h[k].float() for h in heads[1:]), t.float()) for k, t in first.items()}
    return {k: (total[k] / len(heads)).to(t.dtype) for k, t in first.items()}


def run(heads: list[Path], out: Path) -> None:
    """Writes `out`, the mean of the draft heads `heads` (at least two)."""
    if len(heads) < 2:
        raise SystemExit("average-heads: --head: give at least two draft heads to average")
    tensors = []
    for path in heads:
        t = read_tensors(path, "average-heads: --head")
        check_head_alone(t, f"average-heads: --head {path}")
        tensors.append(t)
    write_safetensors(average(tensors, heads), out)
    print(f"average-heads: {out}: the mean of {len(heads)} draft heads", file=sys.stderr)
