"""`draft-window`: a draft head trained inside one window on a GPU machine.

What `draft` does on the CPU in hours, from the same pack as `window`
(`pack`: the base's GGUF, its side files, the grafted modules to start
from, the prompts as token ids) and against one clock (`--minutes`):

1. the verifier: the base from its GGUF with `--init` (the pack's
   `init.safetensors` by default; its tuned base layers and adapters folded
   in: the base that verifies the shipped model's drafts), as `draft`
   builds it, the same weights to the bit (the same fingerprint), drafting
   with the pack's `init-head.safetensors` where it has one;
2. the verifier's answers the pack carries (`answered.jsonl.gz`, from the
   repository's corpus: `pack --verifier-answers`), taken as they are, then
   its greedy answers to the other prompts (`generate`, the CPU path's
   greedy rule), until `--answer-share` of the clock is spent;
3. their features and the verifier's 8 most likely tokens (`features`),
   the new answers first, until `--features-share` of the clock is spent;
4. the draft head trained from there (`draft.train_head`; with `copy` M,
   reading copy candidates, a new copy matrix where the head has none)
   until the steps are done or the clock leaves only the export's time;
5. the head exported (`draft-head.safetensors`, f16) in parts under 16 MiB.

What comes back (`--out`): the verifier's answers as a corpus
(`verifier-answers.jsonl.gz`, `corpus.py`: decoded as the runtime's server
returns them, so `hamburger-train answers --from` adds them to the
repository's corpus, and CPU draft runs take them; not the ones the pack
carried), written as soon as
answering ends; the head's parts, `draft-history.json` and
`draft-window.json` (what was done, in how long), rewritten at every step,
so a window cut short says how far it got. Answering stops at its share
of the clock, features at theirs, and training keeps the export's time.
"""

from __future__ import annotations

import json
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


def take_answered(path: Path, scored: Path, meta: dict, max_tokens: int, limit: int | None) -> set[str]:
    """Appends the first `limit` (all: None) of the pack's verifier answers
    `path` to `scored` where it lacks them, and returns their ids; answers of
    another verifier, tokenizer or budget than `meta`'s at `max_tokens` are
    refused in one line naming the file (`corpus.check_header`)."""
    lines = read_gz_lines(path)
    if not lines:
        return set()
    header, rows = lines[0], lines[1:limit + 1 if limit is not None else None]
    corpus.check_header(path, header, corpus.header_of(meta, max_tokens), "this verifier's")
    done = records.done_ids(scored)
    with open(scored, "a") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows if r["id"] not in done)
    return {r["id"] for r in rows}


def run(pack: Path, work: Path, out: Path, init: Path | None, minutes: float, answer_share: float, max_tokens: int,
        answer_batch: int, steps: int, batch: int, lr: float, seed: int, micro_lr_scale: float, dtype: str,
        copy: int = 0, answered: int | None = None, features_share: float = 1.0) -> None:
    """The window's steps (the module's list), against a clock of `minutes`,
    from `init` (default: the pack's `init.safetensors`) and the pack's draft
    head, with the first `answered` (None: all) of the pack's answers."""
    clock = start(pack, work, out, minutes, "draft-window.json")
    note = clock.note
    init = init or pack / "init.safetensors"
    if not init.is_file():
        raise SystemExit(f"draft-window: --init {init} does not exist")
    head_file = pack / "init-head.safetensors"
    init_head = head_file if head_file.is_file() else None
    base = base_checkpoint(pack, work)
    work = work / "draft-window"  # the verifier's answers and features, apart from a macro window's base answers
    work.mkdir(exist_ok=True)
    model = verifier(base, init, "draft-window", init_head)
    model.eval()
    if copy and model.copy_longest() not in (0, copy):
        raise SystemExit(f"draft-window: --copy {copy}: the head it starts from copies from n-grams up to "
                         f"{model.copy_longest()}")
    if copy and model.copy_proj is None:
        model.add_copy(copy)
    meta = features.meta_of(model, base)
    carried = take_answered(pack / "answered.jsonl.gz", work / "scored.jsonl", meta, max_tokens, answered)
    note(verifier=meta["base"], init_head=init_head is not None, carried=len(carried))
    prompts = read_gz_lines(pack / "prompt-ids.jsonl.gz")
    answering_ends = clock.start + answer_share * minutes * 60
    generate.run(work, model, prompts, max_tokens, answer_batch, deadline=answering_ends, with_scores=False)
    answers = records.read(work / "scored.jsonl")
    new = [a for a in answers if a["id"] not in carried]
    asked = {r["id"]: r["asked"] for r in prompts if "asked" in r}
    kept = corpus.from_ids(new, asked, base / "tokenizer.json", max_tokens)
    corpus.write(out / "verifier-answers.jsonl.gz", corpus.header_of(meta, max_tokens), kept)
    note(answered=len(new), answer_tokens=sum(len(a["ids"]) - a["n_prompt"] for a in new), kept=len(kept))
    features.build(work / "features", model, base, new + [a for a in answers if a["id"] in carried], FEATURES_BATCH,
                   deadline=clock.start + features_share * minutes * 60)
    note(features=sum(len(r["ids"]) for r in records.read(work / "features" / "index.jsonl")))
    head = work / "draft"
    draft.train_head(work, model, meta, load_file(str(init)), head, steps, batch, lr, seed, [0.5], [0.5],
                     micro_lr_scale, dtype, deadline=clock.end - EXPORT_RESERVE_S, texts=work / "scored.jsonl")
    st = torch.load(head / "state.pt", weights_only=False, map_location="cpu")
    note(steps=st["step"], seen_rows=st["history"][-1]["seen_rows"] if st["history"] else 0)
    note(parts=[p.name for p in split_file(head / "draft-head.safetensors", out)])
    shutil.copyfile(head / "history.json", out / "draft-history.json")
    note(done=True)
