"""`draft-window`: a draft head trained inside one window on a GPU machine.

What `draft` does on the CPU in hours, from the same pack as `window`
(`pack`: the base's GGUF, its side files, the grafted modules to start
from, the prompts as token ids) and against one clock (`--minutes`):

1. the verifier: the base from its GGUF with `--init` (the pack's
   `init.safetensors` by default; its tuned base layers and adapters folded
   in: the base that verifies the shipped model's drafts), as `draft`
   builds it, the same weights to the bit (the same fingerprint);
2. the verifier's greedy answers (`generate`, the CPU path's greedy rule),
   until `--answer-share` of the clock is spent;
3. their features and the verifier's 8 most likely tokens (`features`);
4. the draft head trained from `init`'s micro decoder and stop head
   (`draft.train_head`; with `copy` M, reading copy candidates, a new
   copy matrix where `init`'s head has none) until the steps are done or
   the clock leaves only the export's time;
5. the head exported (`draft-head.safetensors`, f16) in parts under 16 MiB.

What comes back (`--out`): the verifier's answers as a corpus
(`verifier-answers.jsonl.gz`, `corpus.py`: decoded as the runtime's server
returns them, so `hamburger-train answers --from` adds them to the
repository's corpus, and CPU draft runs take them), written as soon as
answering ends; the head's parts, `draft-history.json` and
`draft-window.json` (what was done, in how long), rewritten at every step,
so a window cut short says how far it got. Answering stops at its share
of the clock and training keeps the export's time, but the features pass
runs to its end once begun.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file

from . import corpus, draft, features, generate, records
from .drafting import verifier
from .window import EXPORT_RESERVE_S, base_checkpoint, read_gz_lines, split_file, start

FEATURES_BATCH = 32
"""Answers a features pass takes at once: one at a time leaves a GPU idle
between small kernels (as training one answer at a time did in the first
macro window)."""


def run(pack: Path, work: Path, out: Path, init: Path | None, minutes: float, answer_share: float, max_tokens: int,
        answer_batch: int, steps: int, batch: int, lr: float, seed: int, micro_lr_scale: float, dtype: str,
        copy: int = 0) -> None:
    """The window's steps (the module's list), against a clock of `minutes`,
    from `init` (default: the pack's `init.safetensors`)."""
    clock = start(pack, work, out, minutes, "draft-window.json")
    note = clock.note
    init = init or pack / "init.safetensors"
    if not init.is_file():
        raise SystemExit(f"draft-window: --init {init} does not exist")
    base = base_checkpoint(pack, work)
    work = work / "draft-window"  # the verifier's answers and features, apart from a macro window's base answers
    work.mkdir(exist_ok=True)
    model = verifier(base, init, "draft-window")
    model.eval()
    if copy and model.copy_proj is None:
        model.add_copy(copy)
    meta = features.meta_of(model, base)
    note(verifier=meta["base"])
    prompts = read_gz_lines(pack / "prompt-ids.jsonl.gz")
    answering_ends = clock.start + answer_share * minutes * 60
    generate.run(work, model, prompts, max_tokens, answer_batch, deadline=answering_ends, with_scores=False)
    answers = records.read(work / "scored.jsonl")
    asked = {r["id"]: r["asked"] for r in prompts if "asked" in r}
    kept = corpus.from_ids(answers, asked, base / "tokenizer.json", max_tokens)
    corpus.write(out / "verifier-answers.jsonl.gz", corpus.header_of(meta, max_tokens), kept)
    note(answered=len(answers), answer_tokens=sum(len(a["ids"]) - a["n_prompt"] for a in answers), kept=len(kept))
    features.build(work / "features", model, base, answers, FEATURES_BATCH)
    note(features=True)
    head = work / "draft"
    draft.train_head(work, model, meta, load_file(str(init)), head, steps, batch, lr, seed, [0.5], [0.5],
                     micro_lr_scale, dtype, deadline=clock.end - EXPORT_RESERVE_S, texts=work / "scored.jsonl")
    st = torch.load(head / "state.pt", weights_only=False, map_location="cpu")
    note(steps=st["step"], seen_rows=st["history"][-1]["seen_rows"] if st["history"] else 0)
    note(parts=[p.name for p in split_file(head / "draft-head.safetensors", out)])
    shutil.copyfile(head / "history.json", out / "draft-history.json")
    note(done=True)
