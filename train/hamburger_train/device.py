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
import functools
import sys

import torch


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
    """The context the training passes run in (`--dtype`): nothing for f32,
    autocast to bfloat16 on the default device for bf16."""
    if dtype == "f32":
        return contextlib.nullcontext()
    kind = torch.get_default_device().type
    if kind == "cpu":
        warn_if_bf16_emulated()
    return torch.autocast(kind, dtype=torch.bfloat16)


@functools.cache
def warn_if_bf16_emulated() -> None:
    """Says once when this CPU has no bfloat16 instructions (AVX512-BF16 or
    AMX): oneDNN then emulates the products, and a bf16 training pass ran
    some 30 times slower than f32 on a 2-core AVX2 EPYC (3 rows/s against 68)."""
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        print("hamburger-train: --dtype bf16: this CPU has no bfloat16 instructions (AVX512-BF16 or AMX), "
              "so its products are emulated, some 30x slower than --dtype f32", file=sys.stderr)
