"""The verifying base's features at one token per entry, computed once and
cached on disk for `draft` and `accept`.

Verified decoding reads one token per KV entry, so at every row the base is
plain Llama, and the micro decoder drafts from the features of the row that
produced the base's own token (`docs/model.md`). Those features depend on
the base and the text alone; the base never changes while a draft head
trains, so they are computed once (PyTorch, f32, stored f16) and read back
for every epoch and every measurement.

A cache directory holds:

* `meta.json`: what it was computed with: `base` (SHA-256 of the verifying
  base's weights, adapters folded in), `tokenizer` (SHA-256 of
  `tokenizer.json` and `tokenizer_config.json`), `feature_layers` and `dim`.
  `load` refuses a cache whose base or tokenizer differs, naming which.
* `shard-NNNNN.safetensors`, each up to `SHARD` answers, one row per answer
  token: `features` [R, F, D] f16 (the features of the stream row that
  predicts that token: the prompt's last row, then each answer row but the
  last), `next` [R] (the token itself: the base's greedy choice at the row),
  `top_ids` [R, K] and `top_logprobs` [R, K] (the base's K = `segment.TOP`
  most likely tokens there, from the same f32 forward's logits; caches made
  before 2026-11-30 hold libllama's, scored on the verifier's base-only Q8_0
  export); the header's metadata lists the shard's answers (`id`, `split`,
  `rows`).
* `index.jsonl`: one line per shard once it is in place (what a resumed run
  skips; a shard is written to a `.part` file and renamed).

Size: F x D x 2 bytes per answer token (4 x 576 x 2 = 4.6 KB for SmolLM2)
plus 104 bytes of tokens and targets.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file

from . import records
from .generate import batch_inputs, causal_mask
from .model import HAMburger
from .progress import Progress
from .segment import TOP

SHARD = 64
"""Answers per shard file: the unit a resumed caching run redoes at most."""

COLUMNS = ("features", "next", "top_ids", "top_logprobs")
"""A shard's tensors, one row per answer token each, in `Cache`'s order."""


def base_fingerprint(model: HAMburger) -> str:
    """SHA-256 of the base's weights as the model holds them (its grafted
    modules excluded, adapters counted only once folded in)."""
    h = hashlib.sha256()
    for k, t in sorted(model.original_state().items()):
        if k.startswith("model."):
            h.update(k.encode())
            h.update(t.detach().float().cpu().contiguous().numpy().tobytes())
    for i, layer in enumerate(model.layers):
        for k, t in sorted(layer.adapters.items()):
            h.update(f"adapter.{i}.{k}".encode())
            h.update(t.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def tokenizer_fingerprint(base: Path) -> str:
    """SHA-256 of a checkpoint directory's tokenizer and chat template files."""
    h = hashlib.sha256()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        h.update((base / name).read_bytes())
    return h.hexdigest()


def meta_of(model: HAMburger, base: Path) -> dict:
    """What a cache made with `model` on `base`'s tokenizer records (`meta.json`)."""
    return {"base": base_fingerprint(model), "tokenizer": tokenizer_fingerprint(base),
            "feature_layers": model.cfg.feature_layers, "dim": model.cfg.dim}


def check_meta(cache: Path, want: dict) -> None:
    """Refuses (one line) a cache made with another base or tokenizer."""
    path = cache / "meta.json"
    if not path.exists():
        return
    have = json.loads(path.read_text())
    for key, what in (("base", "base"), ("tokenizer", "tokenizer"), ("feature_layers", "feature layers"),
                      ("dim", "width")):
        if have.get(key) != want[key]:
            raise SystemExit(f"features: {cache} was computed with another {what} ({key} {have.get(key)}, "
                             f"this model's {want[key]}): remove it or use another --work")


@torch.no_grad()
def answers_features(model: HAMburger, texts: list[tuple[list[int], int]]) -> list[torch.Tensor]:
    """For each text (`ids`, `n_prompt`), the features [n_answer, F, D] of
    the rows that predict each answer token, the base reading it one token
    per entry: all of them in one left-padded pass (one text: no padding,
    the same pass as alone)."""
    ids, pos, real = batch_inputs([t[:-1] for t, _ in texts])
    feats, _ = model.base(model.embed(ids), pos, causal_mask(real))
    L = ids.shape[1]  # a text's last len(ids) - n_prompt inputs predict its answer's tokens
    return [torch.stack([f[b, L - (len(t) - n):] for f in feats], 1) for b, (t, n) in enumerate(texts)]


@torch.no_grad()
def most_likely(model: HAMburger, feats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The base's `TOP` most likely tokens [R, TOP] and their log-probabilities
    at rows whose features are `feats` [R, F, D] (the last after the final
    norm, so its logits are the base's), most likely first."""
    logprobs, ids = F.log_softmax(model.logits(feats[:, -1]).float(), -1).topk(TOP, -1)
    return ids, logprobs


def build(cache: Path, model: HAMburger, base: Path, answers: list[dict], batch: int = 1,
          deadline: float | None = None) -> None:
    """Caches the features and the base's most likely tokens of every answer
    (`segment.tokenize`'s records: `id`, `split`, `ids`, `n_prompt`) not
    cached yet, in their order, `batch` answers a pass (more than one pays on
    a GPU); with `deadline` (time.monotonic()), no shard is begun after it."""
    cache.mkdir(parents=True, exist_ok=True)
    meta = meta_of(model, base)
    check_meta(cache, meta)
    (cache / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    index = records.read(cache / "index.jsonl")
    done = {i for r in index for i in r["ids"]}
    todo = [r for r in answers if r["id"] not in done]
    if not todo:
        print(f"features: all {len(done)} answers cached in {cache}", file=sys.stderr)
        return
    prog = Progress("features", len(done) + len(todo), "tokens", initial=len(done))
    n = len(done)
    for s in range(0, len(todo), SHARD):
        if deadline is not None and time.monotonic() > deadline:
            print(f"features: stopped at the deadline, {n} of {len(done) + len(todo)} answers cached", file=sys.stderr)
            break
        chunk = todo[s:s + SHARD]
        # Passes take answers of similar length (little padding); the shard
        # keeps them in the order given, as one answer a pass did.
        by_length = sorted(range(len(chunk)), key=lambda i: len(chunk[i]["ids"]))
        rows: list[tuple | None] = [None] * len(chunk)
        for k in range(0, len(chunk), batch):
            picked = by_length[k:k + batch]
            texts = [(chunk[i]["ids"], chunk[i]["n_prompt"]) for i in picked]
            fs = answers_features(model, texts)
            ti, tv = most_likely(model, torch.cat(fs))
            sizes = [len(f) for f in fs]
            for i, f, t, ids, lp in zip(picked, fs, texts, ti.split(sizes), tv.split(sizes)):
                # kept on the CPU until written (a GPU holds one pass's, not a shard's)
                rows[i] = (f.to(torch.float16).cpu(), torch.tensor(t[0][t[1]:], device="cpu"), ids.cpu(), lp.cpu())
                n += 1
                prog.update(n, len(f))
        feats, nxt, top_ids, top_logprobs = (list(col) for col in zip(*rows))
        listed = [{"id": r["id"], "split": r["split"], "rows": len(f)} for r, f in zip(chunk, feats)]
        name = f"shard-{len(index):05d}.safetensors"
        tmp = cache / (name + ".part")
        save_file({k: torch.cat(col).contiguous() for k, col in zip(COLUMNS, (feats, nxt, top_ids, top_logprobs))},
                  str(tmp), metadata={"answers": json.dumps(listed)})
        tmp.replace(cache / name)
        records.append(cache / "index.jsonl", {"shard": name, "ids": [a["id"] for a in listed]})
        index.append({"shard": name})
    prog.update(n, force=True)


@dataclass
class Cache:
    """A loaded cache's rows, answer after answer: `features` [R, F, D] f16,
    `next` [R], `top_ids` / `top_logprobs` [R, K], and for each row the end
    (exclusive) of its answer's rows (`end`); `answers` as the shards list
    them, each with its first row (`start`); for a head with copy
    candidates, those of the tokens read at each row, teacher-forced
    (`copies` [R, n, M], `drafting.attach_copies`)."""

    features: torch.Tensor
    next: torch.Tensor
    top_ids: torch.Tensor
    top_logprobs: torch.Tensor
    end: torch.Tensor
    answers: list[dict]
    copies: torch.Tensor | None = None


def in_memory(model: HAMburger, texts: list[tuple[str, list[int], int]]) -> Cache:
    """The rows of `texts` (`id`, token ids, prompt length) computed now and
    kept in memory, stored as a cache stores them (f16) but without the
    base's top tokens, which walking a text does not read: `accept`'s walk
    of the texts the runtime itself wrote."""
    feats, nxt, ends, answers, rows = [], [], [], [], 0
    for id_, ids, n_prompt in texts:
        f = answers_features(model, [(ids, n_prompt)])[0].to(torch.float16)
        feats.append(f)
        nxt.append(torch.tensor(ids[n_prompt:]))
        answers.append({"id": id_, "split": "heldout", "rows": len(f), "start": rows})
        rows += len(f)
        ends.append(torch.full((len(f),), rows))
    no_top = torch.zeros(rows, 0)
    return Cache(torch.cat(feats), torch.cat(nxt), no_top.long(), no_top, torch.cat(ends), answers)


def load(cache: Path, want: dict, split: str | None = None, limit: int | None = None,
         required: bool = True) -> Cache | None:
    """The cached rows of the answers of `split` (all when None; the first
    `limit` answers when given) on the default device, refusing a cache
    made with another base or tokenizer than `want` (`meta_of`); with no
    such answers, a one-line error, or None when not `required`. The rows
    are copied shard by shard into tensors of their final size, so a cache
    may take most of the memory (joining the shards' parts would need twice
    its size)."""
    if not (cache / "meta.json").exists():
        raise SystemExit(f"features: {cache} holds no feature cache")
    check_meta(cache, want)
    # Pass 1, the shards' headers only: which answers, at which rows.
    picked: list[tuple[str, list[tuple[int, dict]]]] = []
    answers: list[dict] = []
    rows = 0
    for entry in records.read(cache / "index.jsonl"):
        with safe_open(str(cache / entry["shard"]), "pt") as f:
            listed = json.loads(f.metadata()["answers"])
        keep, at = [], 0
        for a in listed:
            if (split is None or a["split"] == split) and (limit is None or len(answers) < limit):
                answers.append({**a, "start": rows})
                keep.append((at, answers[-1]))
                rows += a["rows"]
            at += a["rows"]
        if keep:
            picked.append((entry["shard"], keep))
    if not answers:
        if not required:
            return None
        raise SystemExit(f"features: {cache} holds no {split or ''} answers".replace("  ", " "))
    # Pass 2: each kept answer's rows copied to its place.
    out: dict[str, torch.Tensor] = {}
    for shard, keep in picked:
        with safe_open(str(cache / shard), "pt") as f:
            tensors = {k: f.get_tensor(k) for k in COLUMNS}
        for k, t in tensors.items():
            if k not in out:
                out[k] = torch.empty((rows, *t.shape[1:]), dtype=t.dtype)
        for at, a in keep:
            for k, t in tensors.items():
                out[k][a["start"]:a["start"] + a["rows"]] = t[at:at + a["rows"]]
    ends = torch.cat([torch.full((a["rows"],), a["start"] + a["rows"]) for a in answers])
    on = torch.get_default_device()
    return Cache(*(out[k].to(on) for k in COLUMNS), ends.to(on), answers)
