"""`draft-vocab`: the draft vocabulary of self-verified decoding, counted
from the base's answers (FR-Spec's cut of the output layer).

The answers' tokens are those of a `draft` work directory (`tokens.jsonl`:
each answer's ids after its prompt's), or of a training work directory's
`scored.jsonl`, where `segment` keeps the same ids. The training split's answers are counted,
and the K most frequent tokens, most frequent first, are written to `--out`
as a JSON list, which `hamburger-convert --draft-vocab FILE` (or
`hamburger.json`'s `draft_vocab`) stores in the GGUF. How much of the
held-out answers' tokens each K covers is printed, so K can be chosen by
measured coverage: a draft outside the vocabulary is never made, so the
coverage bounds the share of tokens a draft can be right on.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from . import records

SIZES = (1024, 2048, 4096, 8192)


def answer_tokens(answers: list[dict], split: str) -> Counter:
    """How often each token id is an answer token in the `split` answers."""
    counts: Counter = Counter()
    for r in answers:
        if r.get("split", "train") == split:
            counts.update(r["ids"][r["n_prompt"]:])
    return counts


def coverage(vocab: list[int], counts: Counter) -> float:
    """The share of the tokens counted in `counts` that `vocab` holds."""
    total = sum(counts.values())
    return sum(counts[t] for t in vocab) / total if total else 0.0


def run(work: Path, k: int, out: Path) -> None:
    """Writes the `k` most frequent answer tokens of `work`'s training split
    to `out`, and prints each size's coverage of the held-out answers."""
    path = work / "tokens.jsonl"
    if not path.exists():
        path = work / "scored.jsonl"
    answers = records.read(path)
    train, held = answer_tokens(answers, "train"), answer_tokens(answers, "heldout")
    if not train:
        raise SystemExit(f"draft-vocab: {path} has no training answers: run `draft` (or `segment`) first")
    ranked = [t for t, _ in train.most_common()]
    print(f"{sum(train.values())} training answer tokens ({len(ranked)} distinct), "
          f"{sum(held.values())} held-out; coverage of the held-out answers' tokens:")
    for size in sorted({*SIZES, k}):
        print(f"  K = {size:5d}: {coverage(ranked[:size], held):.3f}")
    out.write_text(json.dumps(ranked[:k]) + "\n")
    print(f"wrote {min(k, len(ranked))} token ids to {out}")
