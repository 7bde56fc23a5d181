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
gradients flow only from the answer's inputs. `plain_loss` holds the base's
one-token path to the base's own distribution.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from .metrics import Counts, Positions
from .model import HAMburger
from .state import Answer

STOP_WEIGHT = 0.5


def prompt_pass(model: HAMburger, prompt: torch.Tensor) -> tuple[list[torch.Tensor], list]:
    """The prompt, once, without gradients: its features and its keys/values."""
    n = len(prompt)
    with torch.no_grad():
        mask = torch.ones(n, n, dtype=torch.bool).tril()[None, None]
        return model.base(model.embed(prompt)[None], torch.arange(n)[None], mask, want_kv=True)


def after_prompt_mask(T: int, n_prompt: int) -> torch.Tensor:
    """[1, 1, T, n_prompt + T]: T inputs after a prompt's cached keys and
    values attend to all of it and causally to each other."""
    own = torch.ones(T, T, dtype=torch.bool).tril()
    return torch.cat([torch.ones(T, n_prompt, dtype=torch.bool), own], 1)[None, None]


def base_regret(answer: Answer, at: torch.Tensor, choice: torch.Tensor) -> torch.Tensor:
    """What choosing `choice` instead of the base's greedy token at answer
    index `at` costs in the base's log-likelihood (nats), which is what the
    evaluation's quality column measures; 0 without the base's top tokens.
    A choice outside the kept top tokens costs at least the gap to the last
    of them, which is what it is counted as (a lower bound)."""
    if answer.top is None:
        return torch.zeros(len(at))
    ids, lp = answer.top[0][at], answer.top[1][at]
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
    _, past = prompt_pass(model, ids[:n_prompt])
    tokens = ids[n_prompt:-1]  # each predicts the next answer token
    T = len(tokens)
    feats, _ = model.base(model.embed(tokens)[None], torch.arange(n_prompt, n_prompt + T)[None],
                          after_prompt_mask(T, n_prompt), past=past)
    logp = F.log_softmax(model.logits(feats[-1][0]), -1)
    return -(top_p[1:] * logp.gather(1, top_ids[1:])).sum() / max(T, 1)


def merged_inputs(model: HAMburger, segs: list[torch.Tensor]) -> torch.Tensor:
    """The base's inputs after the prompt, [1, n_steps - 1, D]: one per macro
    step `segs` but the last, merged when it has k > 1 tokens."""
    emb: list[torch.Tensor | None] = [None] * (len(segs) - 1)
    for k in range(1, model.cfg.max_steps + 1):
        idx = [j for j in range(len(segs) - 1) if len(segs[j]) == k]
        if not idx:
            continue
        e = model.embed(torch.stack([segs[j] for j in idx]))
        merged = e[:, 0] if k == 1 else model.merger(e, torch.full((len(idx),), k))
        for j, m in zip(idx, merged):
            emb[j] = m
    return torch.stack(emb)[None]


def step_features(model: HAMburger, answer: Answer, segs: list[torch.Tensor], ends: torch.Tensor) -> torch.Tensor:
    """feats[j]: the features that predict macro step j, [n_steps, F, D]: the
    prompt's last position's, then the base's outputs at the merged inputs
    (each at `ends`, the stream position of its step's last token)."""
    n_prompt = answer.n_prompt
    pfeats, past = prompt_pass(model, answer.ids[:n_prompt])
    x = merged_inputs(model, segs)
    mfeats, _ = model.base(x, ends[:-1][None], after_prompt_mask(x.shape[1], n_prompt), past=past)
    return torch.cat([torch.stack([f[0, -1:] for f in pfeats], 1), torch.stack([f[0] for f in mfeats], 1)], 0)


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


def sequence_loss(model: HAMburger, answer: Answer, record: list[Positions] | None = None,
                  windows: bool = False) -> tuple[torch.Tensor, Counts]:
    """The loss of one segmented answer, and its counts for the metrics;
    `record`, when given, gets the answer's per-position tensors appended
    (`Positions`: what calibration and `diagnose` read).

    The micro decoder learns each macro step's later tokens, or with
    `windows` the up to `max_steps` - 1 tokens after each step's first,
    wherever the data's step ends (`span`): at inference the stop head alone
    decides how far a step goes, and a window teaches the micro decoder and
    the stop head every token it could be asked for, at the cost of the
    micro decoder only (the base reads the data's macro steps either way)."""
    cfg = model.cfg
    n_prompt, steps = answer.n_prompt, answer.steps
    resp = answer.ids[n_prompt:]
    segs = list(torch.split(resp, steps))
    lens = torch.tensor(steps)
    ends = lens.cumsum(0) + n_prompt - 1  # stream position of each step's last token
    starts = ends - n_prompt + 1 - lens  # answer index of each step's first token
    feats = step_features(model, answer, segs, ends)
    span = [min(cfg.max_steps, len(resp) - int(a)) for a in starts] if windows else steps
    p = predictions(model, feats, resp, segs, starts, span)

    logp = F.log_softmax(model.logits(p.out), -1)
    ce = -logp.gather(1, p.target[:, None]).sum()
    choice = logp.argmax(-1)
    correct = choice == p.target
    at = starts[p.g_of] + p.s_of  # answer index of each predicted token
    if answer.soft is None:
        token_loss = ce
    else:  # distillation: the base's distribution over its most likely tokens
        top_ids, top_p = answer.soft
        token_loss = -(top_p[at] * logp.gather(1, top_ids[at])).sum()
    regret = base_regret(answer, at, choice)

    spans = torch.tensor(span)
    stop_target = stop_targets(p, correct, spans, cfg.max_steps)
    stop_logit = model.stop_head(p.out)
    bce = F.binary_cross_entropy_with_logits(stop_logit, stop_target, reduction="sum")
    positions = Positions(stop_logit.detach(), stop_target, p.s_of, p.g_of, spans, correct, regret, len(resp))
    if record is not None:
        record.append(positions)
    loss = (token_loss + STOP_WEIGHT * bce) / len(p.target)
    return loss, Counts.of(positions, lens, ce.item(), bce.item())
