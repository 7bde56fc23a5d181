"""The base's answers and their scores in PyTorch, batched, on any device.

Where the Rust tools are not (a GPU machine in a training window) the base
answers prompts here with the CPU path's greedy rule: the chat-templated
prompt's ids (`hamburger-eval tokenize`, made before the window), the most
likely token at each step until an end token or `max_tokens`, and an answer
cut there ended by the end token as `hamburger-eval score` ends it. The same
pass keeps what `segment` keeps (the base's entropy and its `TOP` most likely
tokens at every answer token, `scores.packed`), so one pass writes
`scored.jsonl` rows. Given
the answers already (`forced`, from an earlier window), it scores them
teacher-forced in one pass instead of generating.

Prompts go in batches of similar length, padded on the left; the base runs
in f32 (the scores are what training distils).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from . import records, scores
from .model import HAMburger
from .progress import Progress
from .segment import TOP


SCORE_ROWS = 4096
"""Answer tokens whose full-vocabulary distribution `score_batch` computes at once (f32 logits of 0.8 GB)."""


def batch_inputs(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-padded ids [B, L], rope positions [B, L] (0 under the padding)
    and which inputs are real [B, L]."""
    L = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), L, dtype=torch.long)
    real = torch.zeros(len(prompts), L, dtype=torch.bool)
    for b, p in enumerate(prompts):
        ids[b, L - len(p):] = torch.tensor(p)
        real[b, L - len(p):] = True
    pos = (real.long().cumsum(1) - 1).clamp(min=0)
    return ids, pos, real


def causal_mask(real: torch.Tensor) -> torch.Tensor:
    """[B, 1, L, L]: each real input of left-padded rows attends causally to
    its row's real inputs; a padding input attends to itself (no row of -inf)."""
    L = real.shape[1]
    mask = (torch.ones(L, L, dtype=torch.bool).tril()[None] & real[:, None, :])[:, None]
    return mask | torch.eye(L, dtype=torch.bool)[None, None]


def scored(logits: torch.Tensor) -> tuple[list[float], list[list[int]], list[list[float]]]:
    """The entropy, the `TOP` most likely tokens and their log-probabilities
    of each row of `logits` [N, vocab], as `segment` keeps them."""
    logp = F.log_softmax(logits.float(), -1)
    ent = -(logp.exp() * logp).nansum(-1)  # a token of probability 0 adds 0, not 0 * -inf
    tv, ti = logp.topk(TOP, -1)
    return ent.tolist(), ti.tolist(), tv.tolist()


@torch.no_grad()
def answer_batch(model: HAMburger, prompts: list[list[int]], max_tokens: int) -> list[dict]:
    """Greedy answers of `prompts`, each `{ids: answer ids, scores}` (`scores.packed`):
    the answer ended by its first end token, or cut at `max_tokens` and ended
    by the end token."""
    eos = model.cfg.eos
    end = eos[0]
    ids, pos, real = batch_inputs(prompts)
    B = len(prompts)
    feats, past = model.base(model.embed(ids), pos, causal_mask(real), want_kv=True)
    last = feats[-1][:, -1]
    next_pos = pos[:, -1] + 1
    answers: list[list[int]] = [[] for _ in range(B)]
    entropy: list[list[float]] = [[] for _ in range(B)]
    top_ids: list[list[list[int]]] = [[] for _ in range(B)]
    top_logp: list[list[list[float]]] = [[] for _ in range(B)]
    done = [False] * B  # a Python list: a device tensor would cost a synchronisation per row and step
    for i in range(max_tokens + 1):
        ent_c, ids_c, logp_c = scored(model.logits(last))
        for b in range(B):
            if done[b]:
                continue
            tok = end if i == max_tokens else ids_c[b][0]  # the most likely token
            answers[b].append(tok)
            entropy[b].append(ent_c[b])
            top_ids[b].append(ids_c[b])
            top_logp[b].append(logp_c[b])
            done[b] = tok in eos
        if all(done):
            break
        nxt = torch.tensor([a[-1] if a else end for a in answers])
        real = torch.cat([real, torch.ones(B, 1, dtype=torch.bool)], 1)
        feats, kv = model.base(model.embed(nxt)[:, None], next_pos[:, None], real[:, None, None, :], past=past,
                               want_kv=True)
        past, last, next_pos = kv, feats[-1][:, -1], next_pos + 1
    return [{"ids": a, "scores": scores.packed(e, i, p)} for a, e, i, p in zip(answers, entropy, top_ids, top_logp)]


@torch.no_grad()
def score_batch(model: HAMburger, prompts: list[list[int]], answers: list[list[int]]) -> list[dict]:
    """Given answers of `prompts` scored teacher-forced in one base pass, each
    `{ids, scores}` as `answer_batch` gives them: the base's
    distribution at every answer token."""
    ids, pos, real = batch_inputs([p + a[:-1] for p, a in zip(prompts, answers)])
    feats, _ = model.base(model.embed(ids), pos, causal_mask(real))
    L = ids.shape[1]  # a row's last len(a) inputs predict its answer's tokens
    rows = torch.cat([feats[-1][b, L - len(a):] for b, a in enumerate(answers)])
    ent: list[float] = []
    top_ids: list[list[int]] = []
    top_logp: list[list[float]] = []
    for i in range(0, len(rows), SCORE_ROWS):  # one host round trip per chunk, not per answer
        e, t, v = scored(model.logits(rows[i:i + SCORE_ROWS]))
        ent += e
        top_ids += t
        top_logp += v
    out, at = [], 0
    for a in answers:
        span = slice(at, at + len(a))
        out.append({"ids": a, "scores": scores.packed(ent[span], top_ids[span], top_logp[span])})
        at += len(a)
    return out


def run(work: Path, model: HAMburger, prompt_rows: list[dict], max_tokens: int, batch: int,
        forced: dict[str, list[int]] | None = None, deadline: float | None = None, with_scores: bool = True) -> None:
    """Answers (or, for ids in `forced`, scores) every prompt row (`id`,
    `split`, `ids`) not yet in `work/scored.jsonl`, appending as batches
    finish, until `deadline` (time.monotonic()) when given; without
    `with_scores`, each answer's ids alone (a draft head's features pass takes
    the base's top tokens itself: tens of bytes a token fewer to write)."""
    path = work / "scored.jsonl"
    done = records.done_ids(path)
    todo = sorted((r for r in prompt_rows if r["id"] not in done), key=lambda r: len(r["ids"]))
    if not todo:
        return
    prog = Progress("answer", len(prompt_rows), "tokens", initial=len(prompt_rows) - len(todo))
    n = len(prompt_rows) - len(todo)
    with open(path, "a") as f:
        for k in range(0, len(todo), batch):
            if deadline is not None and time.monotonic() > deadline:
                print(f"answer: stopped at the deadline, {n} of {len(prompt_rows)} answered", file=sys.stderr)
                return
            rows = todo[k:k + batch]
            if forced is not None and all(r["id"] in forced for r in rows):
                outs = score_batch(model, [r["ids"] for r in rows], [forced[r["id"]] for r in rows])
            else:
                outs = answer_batch(model, [r["ids"] for r in rows], max_tokens)
            for r, o in zip(rows, outs):
                row = {"id": r["id"], "split": r["split"], "ids": r["ids"] + o["ids"], "n_prompt": len(r["ids"])}
                f.write(json.dumps(row | (o["scores"] if with_scores else {})) + "\n")
                n += 1
                prog.update(n, len(o["ids"]))
            f.flush()
    prog.update(n, force=True)
