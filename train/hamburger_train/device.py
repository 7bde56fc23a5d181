"""Where training runs: the torch device every tensor is made on, and the
precision of the training passes (`--device`, `--dtype`).

One switch moves the tool: `use` makes the device torch's default, so every
tensor the stages make (`torch.arange`, `torch.tensor` of an answer's ids,
the model's parameters) lands there without a device argument at each call.
Training passes run under `autocast` (bf16 on a GPU, where the matrix
products go to bfloat16 and the losses stay f32, as PyTorch's autocast keeps
log-softmax and the cross-entropies); answers, scores, calibration and the
export stay f32.
"""

from __future__ import annotations

import contextlib

import torch

DTYPES = {"f32": None, "bf16": torch.bfloat16}
"""`--dtype`'s choices (the parser names them without importing torch): the
autocast precision of the training passes (None: plain f32)."""


def use(name: str) -> torch.device:
    """Makes `name` ("cpu", "cuda", "cuda:1") the default device of every
    tensor made from here on; a device that is not there is a one-line error."""
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise SystemExit(f"hamburger-train: --device {name}: not a torch device (cpu, cuda, cuda:N)") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"hamburger-train: --device {name}: this PyTorch sees no CUDA device")
    torch.set_default_device(dev)
    return dev


def autocast(dtype: str):
    """The context the training passes run in: autocast to `dtype` on the default device, or nothing for f32."""
    low = DTYPES[dtype]
    if low is None:
        return contextlib.nullcontext()
    return torch.autocast(torch.get_default_device().type, dtype=low)
