"""`graft-head`: grafted modules whose macro steps' micro decoder and stop
head are a draft head's.

A draft head (`draft`, `draft-window`) learns the same thing as the macro
steps' micro decoder, the base's next tokens from its features, on every
answer row rather than on a step's merged ones, so it has seen far more
text: the shipped head 1.26 M rows against the macro modules' 1.1 M answer
tokens over runs 1-4. Put in their place (`docs/training.md`, "The draft
head in macro steps"), it merges more per lost log-likelihood on general
chat, and a macro run can start from it (`train --init`, `pack --init`).
The merger and the base's tuned layers and adapters stay the grafted
file's; the draft head itself is not kept (macro steps and drafting then
share the modules).
"""

from __future__ import annotations

import sys
from pathlib import Path

from .drafting import DRAFT_HEAD, check_head_alone, check_same_tensors, drafting_modules, read_tensors
from .export import write_safetensors

MICRO = "micro_step_decoder."


def run(grafted: Path, head: Path, out: Path) -> None:
    """Writes `out`: `grafted` with `head`'s micro decoder and stop head as
    its macro steps' own. A head that is not a draft head alone, whose
    tensors are not the grafted micro decoder's names and shapes, or that
    copies (macro steps read no copy candidates), is refused in one line
    naming the tensor."""
    macro, drafts = read_tensors(grafted, "graft-head: --grafted"), read_tensors(head, "graft-head: --head")
    check_head_alone(drafts, f"graft-head: --head {head}")
    if DRAFT_HEAD + "copy.weight" in drafts:
        raise SystemExit(f"graft-head: --head {head}: {DRAFT_HEAD}copy.weight: a head that copies cannot run "
                         "macro steps, which read no copy candidates")
    own = {k: t for k, t in macro.items() if k.startswith(MICRO)}
    if not own:
        raise SystemExit(f"graft-head: --grafted {grafted}: no {MICRO}* tensors (not grafted modules)")
    check_same_tensors(drafts, {DRAFT_HEAD + k.removeprefix(MICRO): t for k, t in own.items()},
                       f"graft-head: --head {head}", "the grafted micro decoder")
    kept = {k: t for k, t in macro.items() if not k.startswith(DRAFT_HEAD)}
    swapped = drafting_modules(kept | drafts)
    write_safetensors({k: t.to(macro[k].dtype) for k, t in swapped.items()}, out)
    print(f"graft-head: {out}: {grafted} with {head}'s micro decoder and stop head", file=sys.stderr)
