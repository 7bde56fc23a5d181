"""The training losses: teacher forcing of a segmented answer as in the original implementation.

Each answer, cut into macro steps by `segment`, is fed to the base as the
prompt's tokens followed by ONE merged input per macro step (at the rope
position of its last token, `merged_inputs`, `step_features`); the features
of each base output predict the next macro step's tokens: the first through
the lm_head (which trains the merger, through the base), the rest through the
micro-step decoder (`predictions`). Losses: cross-entropy on every token plus
`STOP_WEIGHT` x binary cross-entropy on the stop targets. When `segment` kept
the base's most likely tokens, the token loss is the cross-entropy against
the base's distribution over them (distillation: the whole distribution says
more per token than its argmax, and keeps the first tokens after merges, and
the tuned layers, close to the base's), otherwise against the data's tokens.

Stop targets (`stop_targets`): 1 at a macro step's last token, as in the
paper, and also before a token the micro decoder would get wrong (its argmax
is not the data's token, which is the base's own greedy choice). So the stop
head learns where the micro decoder can be trusted, and the confidence knob
trades tokens per step against agreement with the base.

The prompt runs once without gradients (its keys and values are reused), so
gradients flow only from the answer's inputs. `batch_loss` takes several
answers in one pass, right-padded (what fills a GPU), each still its own
mean. `plain_loss` holds the base's one-token path to the base's own
distribution.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from .metrics import Counts, Positions
from .model import HAMburger
from .state import Answer

STOP_WEIGHT = 0.5


def pad_right(seqs: list[torch.Tensor]) -> torch.Tensor:
    """Tensors [L_b, ...] (ids, positions, inputs), right-padded with 0 into one [B, max L_b, ...]."""
    return torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True)


def prompt_pass(model: HAMburger, prompts: list[torch.Tensor]) -> tuple[list[torch.Tensor], list, torch.Tensor]:
    """The prompts, once, without gradients, right-padded into one batch:
    their features, their keys/values and which of their positions are real
    ([B, P]; a padding row attends causally to its prompt's real positions)."""
    n = torch.tensor([len(p) for p in prompts])
    P = int(n.max())
    valid = torch.arange(P)[None, :] < n[:, None]
    mask = (torch.ones(P, P, dtype=torch.bool).tril()[None] & valid[:, None, :])[:, None]
    with torch.no_grad():
        feats, past = model.base(model.embed(pad_right(prompts)), torch.arange(P).expand(len(prompts), P), mask,
                                 want_kv=True)
    return feats, past, valid


def after_prompt_mask(T: int, valid: torch.Tensor) -> torch.Tensor:
    """[B, 1, T, P + T]: T inputs after their prompt's cached keys and values
    (real where `valid` [B, P]) attend to all of it and causally to each other."""
    B, P = valid.shape
    own = torch.ones(T, T, dtype=torch.bool).tril()
    return torch.cat([valid[:, None, :].expand(B, T, P), own.expand(B, T, T)], 2)[:, None]


def base_regret(top: tuple[torch.Tensor, torch.Tensor] | None, at: torch.Tensor,
                choice: torch.Tensor) -> torch.Tensor:
    """What choosing `choice` instead of the base's greedy token at answer
    index `at` costs in the base's log-likelihood (nats), which is what the
    evaluation's quality column measures; 0 without the base's top tokens
    (`Answer.top`). A choice outside the kept top tokens costs at least the
    gap to the last of them, which is what it is counted as (a lower bound)."""
    if top is None:
        return torch.zeros(len(at))
    ids, lp = top[0][at], top[1][at]
    hit = ids == choice[:, None]
    chosen = torch.where(hit.any(1), (lp * hit).sum(1), lp[:, -1])
    return lp[:, 0] - chosen


def plain_loss(model: HAMburger, answer: Answer) -> torch.Tensor:
    """Distillation on plain inputs: the answer fed one token per input, as
    the base reads it at confidence > 1, and the (tuned) base's next-token
    distribution held to the base's own (`Answer.soft`), per answer token.
    Tuned layers and adapters learn from segmented answers to read merges,
    and drift on plain text; this holds the one-token path to the base's."""
    ids, n_prompt = answer.ids, answer.n_prompt
    top_ids, top_p = answer.soft
    _, past, valid = prompt_pass(model, [ids[:n_prompt]])
    tokens = ids[n_prompt:-1]  # each predicts the next answer token
    T = len(tokens)
    feats, _ = model.base(model.embed(tokens)[None], torch.arange(n_prompt, n_prompt + T)[None],
                          after_prompt_mask(T, valid), past=past)
    logp = F.log_softmax(model.logits(feats[-1][0]), -1)
    return -(top_p[1:] * logp.gather(1, top_ids[1:])).sum() / max(T, 1)


def merged_inputs(model: HAMburger, segs_per: list[list[torch.Tensor]]) -> torch.Tensor:
    """The base's inputs after each answer's prompt, right-padded into
    [B, max n_steps - 1, D]: one per macro step of the answer's `segs` but
    the last, merged when it has k > 1 tokens (every answer's k-token steps
    through the merger at once)."""
    flat = [s for segs in segs_per for s in segs[:-1]]
    emb: list[torch.Tensor | None] = [None] * len(flat)
    for k in range(1, model.cfg.max_steps + 1):
        idx = [j for j, s in enumerate(flat) if len(s) == k]
        if not idx:
            continue
        e = model.embed(torch.stack([flat[j] for j in idx]))
        merged = e[:, 0] if k == 1 else model.merger(e, torch.full((len(idx),), k))
        for j, m in zip(idx, merged):
            emb[j] = m
    rows = list(torch.split(torch.stack(emb), [len(segs) - 1 for segs in segs_per]))
    return pad_right(rows)


def step_features(model: HAMburger, answers: list[Answer], segs_per: list[list[torch.Tensor]],
                  ends_per: list[torch.Tensor]) -> torch.Tensor:
    """feats[j]: the features that predict macro step j of the answers, in
    order, [sum of n_steps, F, D]: each answer's prompt's last position's,
    then the base's outputs at its merged inputs (each at `ends`, the stream
    position of its step's last token). One base pass over the prompts, one
    over the merged inputs, for the whole batch."""
    pfeats, past, valid = prompt_pass(model, [a.ids[:a.n_prompt] for a in answers])
    x = merged_inputs(model, segs_per)
    mfeats, _ = model.base(x, pad_right([e[:-1] for e in ends_per]), after_prompt_mask(x.shape[1], valid), past=past)
    out = []
    for b, (a, segs) in enumerate(zip(answers, segs_per)):
        out.append(torch.stack([f[b, a.n_prompt - 1] for f in pfeats])[None])
        out.append(torch.stack([f[b, :len(segs) - 1] for f in mfeats], 1))
    return torch.cat(out)


class Predictions(NamedTuple):
    """Every predicted token of an answer: the output it is read from (`out`,
    [N, D]), its `target` token, and its place (micro step `s_of` of macro
    step `g_of`; micro step 0 is the base's lm_head, the rest the micro decoder's)."""

    out: torch.Tensor
    target: torch.Tensor
    s_of: torch.Tensor
    g_of: torch.Tensor


def predictions(model: HAMburger, feats: torch.Tensor, resp: torch.Tensor, segs: list[torch.Tensor],
                starts: torch.Tensor, span: list[int]) -> Predictions:
    """Each macro step's first token from its features, then the micro
    decoder over the `span[j]` - 1 tokens after it (answer `resp`, each step
    starting at answer index `starts[j]`), teacher-forced."""
    cfg = model.cfg
    first = starts.tolist()  # slicing by Python ints: no device round trip per step
    outs, targets = [feats[:, -1]], [torch.stack([s[0] for s in segs])]
    step_of, seg_of = [torch.zeros(len(segs), dtype=torch.long)], [torch.arange(len(segs))]
    for k in range(2, cfg.max_steps + 1):
        idx = [j for j in range(len(segs)) if span[j] == k]
        if not idx:
            continue
        toks = torch.stack([resp[first[j]:first[j] + k] for j in idx])
        o = model.micro_decode(feats[idx], toks[:, :-1])  # out_1..out_{k-1}
        outs.append(o.reshape(-1, cfg.dim))
        targets.append(toks[:, 1:].reshape(-1))
        step_of.append(torch.arange(1, k).repeat(len(idx)))
        seg_of.append(torch.tensor(idx).repeat_interleave(k - 1))
    return Predictions(torch.cat(outs), torch.cat(targets), torch.cat(step_of), torch.cat(seg_of))


def stop_targets(p: Predictions, correct: torch.Tensor, spans: torch.Tensor, max_steps: int) -> torch.Tensor:
    """1 after each predicted token that ends its span, or whose next
    token the model gets wrong (`correct`: right, per predicted token)."""
    last = p.s_of == spans[p.g_of] - 1
    key = p.g_of * max_steps + p.s_of
    index_of = torch.full((int(len(spans)) * max_steps + 1,), -1, dtype=torch.long)
    index_of[key] = torch.arange(len(key))
    following = index_of[key + 1]  # the next micro step of the same macro step (-1: none)
    next_wrong = ~last & (following >= 0) & ~correct[following.clamp(min=0)]
    return (last | next_wrong).float()


def batch_loss(model: HAMburger, answers: list[Answer], record: list[Positions] | None = None,
               windows: bool = False) -> tuple[torch.Tensor, Counts]:
    """The summed losses of segmented answers, each its mean per predicted
    token (one answer: its loss), computed in one batch (`step_features`:
    two base passes for all of them; the micro decoder and the lm_head over
    all their steps at once), and their summed counts for the metrics;
    `record`, when given, gets their per-position tensors appended, as one
    `Positions` whose macro steps are the answers' in order.

    The micro decoder learns each macro step's later tokens, or with
    `windows` the up to `max_steps` - 1 tokens after each step's first,
    wherever the data's step ends (`span`): at inference the stop head alone
    decides how far a step goes, and a window teaches the micro decoder and
    the stop head every token it could be asked for, at the cost of the
    micro decoder only (the base reads the data's macro steps either way)."""
    cfg = model.cfg
    segs_per, ends_per, starts_per, resps, span, merged_before = [], [], [], [], [], []
    offset = 0  # where each answer's tokens start in the batch's answers, concatenated
    for a in answers:
        resp = a.ids[a.n_prompt:]
        lens = torch.tensor(a.steps)
        ends = lens.cumsum(0) + a.n_prompt - 1  # stream position of each step's last token
        starts = ends - a.n_prompt + 1 - lens  # answer index of each step's first token
        segs_per.append(list(torch.split(resp, a.steps)))
        ends_per.append(ends)
        starts_per.append(starts + offset)
        resps.append(resp)
        span += [min(cfg.max_steps, len(resp) - int(i)) for i in starts] if windows else a.steps
        merged_before.append(torch.cat([torch.zeros(1, dtype=torch.bool), lens[:-1] > 1]))
        offset += len(resp)
    feats = step_features(model, answers, segs_per, ends_per)
    resp, starts = torch.cat(resps), torch.cat(starts_per)
    p = predictions(model, feats, resp, [s for segs in segs_per for s in segs], starts, span)

    logp = F.log_softmax(model.logits(p.out), -1)
    nll = -logp.gather(1, p.target[:, None])[:, 0]
    choice = logp.argmax(-1)
    correct = choice == p.target
    at = starts[p.g_of] + p.s_of  # index of each predicted token in the answers, concatenated
    soft = top = None
    if all(a.soft is not None for a in answers):
        soft = (torch.cat([a.soft[0] for a in answers]), torch.cat([a.soft[1] for a in answers]))
        top = (torch.cat([a.top[0] for a in answers]), torch.cat([a.top[1] for a in answers]))
    # distillation where the base's distribution over its most likely tokens is kept, else the data's token
    token_loss = nll if soft is None else -(soft[1][at] * logp.gather(1, soft[0][at])).sum(1)
    regret = base_regret(top, at, choice)

    spans = torch.tensor(span)
    stop_target = stop_targets(p, correct, spans, cfg.max_steps)
    stop_logit = model.stop_head(p.out)
    bce = F.binary_cross_entropy_with_logits(stop_logit, stop_target, reduction="none")
    positions = Positions(stop_logit.detach(), stop_target, p.s_of, p.g_of, spans, correct, regret, offset)
    if record is not None:
        record.append(positions)
    answer_of = torch.repeat_interleave(torch.arange(len(answers)), torch.tensor([len(s) for s in segs_per]))[p.g_of]
    per_answer = torch.bincount(answer_of, minlength=len(answers))[answer_of]  # predicted tokens of its answer
    loss = ((token_loss + STOP_WEIGHT * bce) / per_answer).sum()
    return loss, Counts.of(positions, torch.cat(merged_before), nll.sum().item(), bce.sum().item())
