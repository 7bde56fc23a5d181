"""`train`: the merger, the micro-step decoder and the stop head (and the base's first layers).

Teacher forcing as in the original implementation: each answer, cut into
macro steps by `segment`, is fed to the base as the prompt's tokens followed
by ONE merged input per macro step (at the rope position of its last token);
the features of each base output predict the next macro step's tokens: the
first through the lm_head (which trains the merger, through the base),
the rest through the micro-step decoder. Losses: cross-entropy on every token
plus 0.5 x binary cross-entropy on the stop targets. When `segment` kept the
base's most likely tokens (`top`), the token loss is the cross-entropy
against the base's distribution over them (distillation: the whole
distribution says more per token than its argmax, and keeps the first
tokens after merges, and the tuned layers, close to the base's), otherwise
against the data's tokens.

Stop targets: 1 at a macro step's last token, as in the paper, and also
before a token the micro decoder would get wrong (its argmax is not the
data's token, which is the base's own greedy choice). So the stop head learns
where the micro decoder can be trusted, and the confidence knob trades tokens
per step against agreement with the base.

The base stays frozen but for its first `tuned_layers` layers (0: frozen),
which learn at `TUNED_LR_SCALE` times the rate: a frozen base reads merged
inputs poorly, and the first layers are where a merge can be unpacked;
with `lora_rank` > 0 every other layer gets low-rank adapters too (at
`ADAPTER_LR_SCALE` times the rate: B starts at zero), so that the layers
that attend to merged keys and values can adapt to them at a few MB.
What ships is then the PyPI base plus the grafted modules, those layers and
the adapters' factors.
The prompt runs once without gradients (its keys and values are reused), so
gradients flow only from the answer's inputs.

Resumable: `train/state.pt` (grafted weights, optimizer, step, history) is
written every `SAVE_EVERY` steps; `history.json` and `loss.png` show the
curve; `train/snapshots/step-N.pt` keeps the grafted weights every
`SNAPSHOT_EVERY` steps, so how the model grew with training can be measured
afterwards (`export --snapshot N`).
"""

from __future__ import annotations

import json
import math
import random
import sys
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from .model import HAMburger
from . import records
from .progress import Progress

SAVE_EVERY = 25
SNAPSHOT_EVERY = 100
STOP_WEIGHT = 0.5
TUNED_LR_SCALE = 0.3
ADAPTER_LR_SCALE = 2.0
WARMUP = 20


def load_segments(work: Path, split: str) -> list[dict]:
    """The segmented answers of one split."""
    rows = records.read(work / "segments.jsonl")
    return [r for r in rows if r["split"] == split and len(r["steps"]) >= 2]


def init_grafted(model: HAMburger, seed: int) -> None:
    """Starting point: micro layers copied from the base's last layers (a
    pretrained transformer reading the base's own hidden states) with their
    output projections zeroed, so each starts as the identity (there is no
    norm after the micro decoder: out_s starts as the token's embedding);
    the merger starting as the mean of its embeddings (out_proj zero); the
    stop head's bias towards stopping (most positions end a step)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        n = len(model.micro)
        for m, b in zip(model.micro, model.layers[-n:]):
            m.load_state_dict({k: v for k, v in b.state_dict().items() if not k.startswith("adapters.")})
            m.o_proj.weight.zero_()
            m.down_proj.weight.zero_()
        for lin in (model.merger.q_proj, model.merger.k_proj, model.merger.v_proj):
            torch.nn.init.normal_(lin.weight, std=0.02)
            lin.bias.zero_()
        model.merger.out_proj.weight.zero_()
        model.merger.out_proj.bias.zero_()
        torch.nn.init.normal_(model.merger.pos, std=0.02)
        for lin in (model.stop_head.net[0], model.stop_head.net[2], model.stop_head.net[4]):
            torch.nn.init.normal_(lin.weight, std=1.0 / math.sqrt(lin.in_features))
            lin.bias.zero_()
        model.stop_head.net[4].bias.fill_(1.0)


def base_top(row: dict) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The base's most likely tokens at each answer token, [n, TOP] ids and
    log-probabilities, most likely first, when `segment` kept them (made
    once per row and kept in it)."""
    if "top" not in row:
        return None
    if "_top" not in row:
        top = torch.tensor(row["top"])  # [n, TOP, 2]: token, log-probability
        row["_top"] = (top[..., 0].long(), top[..., 1])
    return row["_top"]


def soft_targets(row: dict) -> tuple[torch.Tensor, torch.Tensor] | None:
    """`base_top`'s tokens and their probabilities renormalised over them."""
    top = base_top(row)
    if top is None:
        return None
    if "_soft" not in row:
        row["_soft"] = (top[0], torch.softmax(top[1], -1))
    return row["_soft"]


class Positions(NamedTuple):
    """One answer's predicted tokens, teacher-forced: the stop logit after
    each and its target, its place (micro step `s_of` of macro step `g_of`,
    whose micro spans are `spans`: see `sequence_loss`), whether its argmax
    is the base's greedy token and its `base_regret`; and how many tokens
    the answer has."""
    stop_logit: torch.Tensor
    stop_target: torch.Tensor
    s_of: torch.Tensor
    g_of: torch.Tensor
    spans: torch.Tensor
    correct: torch.Tensor
    regret: torch.Tensor
    answer_tokens: int


def base_regret(row: dict, at: torch.Tensor, choice: torch.Tensor) -> torch.Tensor:
    """What choosing `choice` instead of the base's greedy token at answer
    index `at` costs in the base's log-likelihood (nats), which is what the
    evaluation's quality column measures; 0 without the base's top tokens.
    A choice outside the kept top tokens costs at least the gap to the last
    of them, which is what it is counted as (a lower bound)."""
    top = base_top(row)
    if top is None:
        return torch.zeros(len(at))
    ids, lp = top[0][at], top[1][at]
    hit = ids == choice[:, None]
    chosen = torch.where(hit.any(1), (lp * hit).sum(1), lp[:, -1])
    return lp[:, 0] - chosen


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


def plain_loss(model: HAMburger, row: dict) -> torch.Tensor:
    """Distillation on plain inputs: the answer fed one token per input, as
    the base reads it at confidence > 1, and the (tuned) base's next-token
    distribution held to the base's own (`top`), per answer token. Tuned
    layers and adapters learn from segmented answers to read merges, and
    drift on plain text; this holds the one-token path to the base's."""
    ids, n_prompt = torch.tensor(row["ids"]), row["n_prompt"]
    top_ids, top_p = soft_targets(row)
    _, past = prompt_pass(model, ids[:n_prompt])
    answer = ids[n_prompt:-1]  # each predicts the next answer token
    T = len(answer)
    feats, _ = model.base(model.embed(answer)[None], torch.arange(n_prompt, n_prompt + T)[None],
                          after_prompt_mask(T, n_prompt), past=past)
    logp = F.log_softmax(model.logits(feats[-1][0]), -1)
    return -(top_p[1:] * logp.gather(1, top_ids[1:])).sum() / max(T, 1)


def sequence_loss(model: HAMburger, row: dict, record: list | None = None,
                  windows: bool = False) -> tuple[torch.Tensor, dict]:
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
    ids = torch.tensor(row["ids"])
    n_prompt, steps = row["n_prompt"], row["steps"]
    resp = ids[n_prompt:]
    segs = list(torch.split(resp, steps))
    lens = torch.tensor(steps)
    ends = lens.cumsum(0) + n_prompt - 1  # stream position of each step's last token

    pfeats, past = prompt_pass(model, ids[:n_prompt])
    # One input per macro step but the last: merged when it has k > 1 tokens.
    emb = [None] * (len(segs) - 1)
    for k in range(1, cfg.max_steps + 1):
        idx = [j for j in range(len(segs) - 1) if steps[j] == k]
        if not idx:
            continue
        e = model.embed(torch.stack([segs[j] for j in idx]))
        merged = e[:, 0] if k == 1 else model.merger(e, torch.full((len(idx),), k))
        for j, m in zip(idx, merged):
            emb[j] = m
    T = len(emb)
    x = torch.stack(emb)[None]
    pos = ends[:-1][None]
    mfeats, _ = model.base(x, pos, after_prompt_mask(T, n_prompt), past=past)
    # feats[j]: the features that predict macro step j, [n_steps, F, D].
    feats = torch.cat([torch.stack([f[0, -1:] for f in pfeats], 1), torch.stack([f[0] for f in mfeats], 1)], 0)

    outs, targets, step_of = [feats[:, -1]], [torch.stack([s[0] for s in segs])], [torch.zeros(len(segs), dtype=torch.long)]
    seg_of = [torch.arange(len(segs))]
    starts = ends - n_prompt + 1 - lens  # answer index of each step's first token
    span = [min(cfg.max_steps, len(resp) - int(a)) for a in starts] if windows else steps
    for k in range(2, cfg.max_steps + 1):
        idx = [j for j in range(len(segs)) if span[j] == k]
        if not idx:
            continue
        toks = torch.stack([resp[starts[j]:starts[j] + k] for j in idx])
        o = model.micro_decode(feats[idx], toks[:, :-1])  # out_1..out_{k-1}
        outs.append(o.reshape(-1, cfg.dim))
        targets.append(toks[:, 1:].reshape(-1))
        step_of.append(torch.arange(1, k).repeat(len(idx)))
        seg_of.append(torch.tensor(idx).repeat_interleave(k - 1))
    out, target, s_of, g_of = torch.cat(outs), torch.cat(targets), torch.cat(step_of), torch.cat(seg_of)
    logp = F.log_softmax(model.logits(out), -1)
    ce = -logp.gather(1, target[:, None]).sum()
    correct = logp.argmax(-1) == target
    soft = soft_targets(row)
    at = starts[g_of] + s_of  # answer index of each predicted token
    if soft is None:
        token_loss = ce
    else:  # distillation: the base's distribution over its most likely tokens
        top_ids, top_p = soft
        token_loss = -(top_p[at] * logp.gather(1, top_ids[at])).sum()
    regret = base_regret(row, at, logp.argmax(-1))

    # Stop after out_s when it ends its span, or when the next token would be wrong.
    spans = torch.tensor(span)
    k_of = spans[g_of]
    last = s_of == k_of - 1
    next_wrong = torch.zeros_like(last)
    key = g_of * cfg.max_steps + s_of
    where = {int(kk): i for i, kk in enumerate(key)}
    for i in range(len(key)):
        if not last[i]:
            next_wrong[i] = ~correct[where[int(key[i]) + 1]]
    stop_target = (last | next_wrong).float()
    stop_logit = model.stop_head(out)
    bce = F.binary_cross_entropy_with_logits(stop_logit, stop_target, reduction="sum")
    if record is not None:
        record.append(Positions(stop_logit.detach(), stop_target, s_of, g_of, spans, correct, regret, len(resp)))
    n = len(target)
    loss = (token_loss + STOP_WEIGHT * bce) / n
    after_merge = (s_of == 0) & (g_of > 0) & (lens[(g_of - 1).clamp(min=0)] > 1)
    plain_first = (s_of == 0) & ~after_merge
    stats = {"tokens": n, "ce": ce.item(), "bce": bce.item(), "first_correct": correct[s_of == 0].sum().item(),
             "firsts": int((s_of == 0).sum()), "merged_first_correct": correct[after_merge].sum().item(),
             "merged_firsts": int(after_merge.sum()), "micro_correct": correct[s_of > 0].sum().item(),
             "micros": int((s_of > 0).sum()), "stop_correct": ((stop_logit > 0) == (stop_target > 0.5)).sum().item(),
             "plain_first_regret": regret[plain_first].sum().item(), "merged_first_regret": regret[after_merge].sum().item(),
             "micro_regret": regret[s_of > 0].sum().item()}
    return loss, stats


def validate(model: HAMburger, held: list[dict], plain_weight: float, windows: bool) -> dict:
    """`summarize` of the held-out answers, and with `plain_weight` > 0 their
    mean `plain_loss` (`plain_ce`)."""
    s = summarize([sequence_loss(model, r, windows=windows)[1] for r in held])
    if plain_weight > 0:
        s["plain_ce"] = sum(plain_loss(model, r).item() for r in held) / len(held)
    return s


def lr_at(step: int, steps: int, peak: float) -> float:
    """Linear warm-up, then cosine decay to a tenth."""
    if step < WARMUP:
        return peak * (step + 1) / WARMUP
    t = (step - WARMUP) / max(1, steps - WARMUP)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(t, 1.0))))


def summarize(stats: list[dict]) -> dict:
    """Means over a list of per-sequence counts."""
    tot = {k: sum(s[k] for s in stats) for k in stats[0]}
    n = max(tot["tokens"], 1)
    plain_firsts = max(tot["firsts"] - tot["merged_firsts"], 1)
    return {"ce": tot["ce"] / n, "bce": tot["bce"] / n, "first_acc": tot["first_correct"] / max(tot["firsts"], 1),
            "plain_first_acc": (tot["first_correct"] - tot["merged_first_correct"]) / plain_firsts,
            "plain_first_regret": tot["plain_first_regret"] / plain_firsts,
            "merged_first_regret": tot["merged_first_regret"] / max(tot["merged_firsts"], 1),
            "micro_regret": tot["micro_regret"] / max(tot["micros"], 1),
            "merged_first_acc": tot["merged_first_correct"] / max(tot["merged_firsts"], 1),
            "micro_acc": tot["micro_correct"] / max(tot["micros"], 1), "stop_acc": tot["stop_correct"] / n,
            "tokens": tot["tokens"]}


def save_state(path: Path, model: HAMburger, opt: torch.optim.Optimizer, step: int, history: list,
               windows: bool) -> None:
    """Writes the training state atomically, with the settings a resumed run keeps."""
    write_state(path, {"grafted": model.trained_state(), "opt": opt.state_dict(), "step": step, "history": history,
                       "tuned_layers": model.tuned_layers, "lora_rank": model.lora_rank, "windows": windows})


def load_trained(work: Path, base: Path, stage: str, snapshot: int | None = None) -> tuple[dict, HAMburger]:
    """`work`'s training state (`save_state`'s dict, or the snapshot of step
    `snapshot`) and its model on the base, for the stages that read a run
    (`stage` names the one that asks, in the error when there is none)."""
    path = work / "train" / ("state.pt" if snapshot is None else f"snapshots/step-{snapshot}.pt")
    if not path.exists():
        raise SystemExit(f"{stage}: {path} does not exist: run train first")
    st = torch.load(path, weights_only=False)
    model = HAMburger.from_checkpoint(base, st.get("tuned_layers", 0), st.get("lora_rank", 0))
    model.load_original(st["grafted"], grafted_only=True)
    return st, model


def write_state(path: Path, state: dict) -> None:
    """Writes a training state (`save_state`'s dict) atomically: a `.part` renamed into place."""
    tmp = path.with_suffix(".part")
    torch.save(state, tmp)
    tmp.replace(path)


def plot(history: list, path: Path) -> None:
    """The loss curve (training tokens on x) as a PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    train = [h for h in history if h["kind"] == "train"]
    val = [h for h in history if h["kind"] == "val"]
    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    for hs, style, name in ((train, "-", "train"), (val, "o-", "held out")):
        if hs:
            x = [h["seen_tokens"] for h in hs]
            ax[0].plot(x, [h["ce"] for h in hs], style, label=f"token CE ({name})")
            ax[0].plot(x, [h["bce"] for h in hs], style, label=f"stop BCE ({name})")
            ax[1].plot(x, [h["micro_acc"] for h in hs], style, label=f"micro-step accuracy ({name})")
            ax[1].plot(x, [h["first_acc"] for h in hs], style, label=f"first-token accuracy ({name})")
            if all("merged_first_acc" in h for h in hs):
                ax[1].plot(x, [h["merged_first_acc"] for h in hs], style, label=f"first token after a merge ({name})")
    for a in ax:
        a.set_xlabel("answer tokens seen")
        a.legend(fontsize=8)
        a.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def run(work: Path, base: Path, steps: int, batch: int, lr: float, seed: int, tuned_layers: int,
        init: Path | None = None, lora_rank: int = 0, plain_weight: float = 0.0, windows: bool = False) -> None:
    """Trains until `steps` optimizer steps, resuming from `train/state.pt`.
    A new run starts from `init` when given (a `grafted.safetensors`, e.g. the
    shipped model: training goes on from it on new data) instead of
    `init_grafted`'s starting point. With `plain_weight` > 0 every step also
    distils one of its answers on plain inputs (`plain_loss`), at that weight.
    With `windows` the micro decoder and the stop head learn every step's
    window (`sequence_loss`)."""
    out = work / "train"
    out.mkdir(parents=True, exist_ok=True)
    rows, held = load_segments(work, "train"), load_segments(work, "heldout")[:8]
    if plain_weight > 0 and any("top" not in r for r in rows + held):
        raise SystemExit(f"train: --plain-weight distils from the base's top tokens, and {work}/segments.jsonl "
                         "lacks them (scored before segment kept them)")
    state_path = out / "state.pt"
    st = torch.load(state_path, weights_only=False) if state_path.exists() else None
    if st is not None:  # a run resumes with the settings it started with
        tuned_layers, lora_rank = st.get("tuned_layers", tuned_layers), st.get("lora_rank", lora_rank)
        windows = st.get("windows", False)
    model = HAMburger.from_checkpoint(base, tuned_layers, lora_rank)
    init_grafted(model, seed)
    if init is not None:
        model.load_original(load_file(str(init)), grafted_only=True)
    groups = [{"params": list(model.grafted_parameters()), "scale": 1.0},
              {"params": list(model.tuned_parameters()), "scale": TUNED_LR_SCALE},
              {"params": [p for p in model.adapter_parameters() if p.requires_grad], "scale": ADAPTER_LR_SCALE}]
    params = [p for g in groups for p in g["params"]]
    opt = torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, betas=(0.9, 0.95), weight_decay=0.01)
    step, history = 0, []
    if st is not None:
        model.load_original(st["grafted"], grafted_only=True)
        opt.load_state_dict(st["opt"])
        step, history = st["step"], st["history"]
        print(f"train: resumed at step {step}", file=sys.stderr)
    if step >= steps:
        print(f"train: done ({step} steps)", file=sys.stderr)
        return
    seen = history[-1]["seen_tokens"] if history else 0
    if step == 0 and init is not None and held:  # where the run starts from, on this run's held-out answers
        with torch.no_grad():
            history.append({"kind": "val", "step": 0, "seen_tokens": 0, **validate(model, held, plain_weight, windows)})
    order = list(range(len(rows)))
    prog = Progress("train", steps, "tokens", every=30, initial=step)
    prog.update(step)
    window: list[dict] = []
    plains: list[float] = []
    while step < steps:
        epoch, i0 = divmod(step * batch, len(rows))
        random.Random(seed + epoch).shuffle(order)
        picks = [rows[order[(i0 + b) % len(rows)]] for b in range(batch)]
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, lr) * g["scale"]
        opt.zero_grad()
        for r in picks:
            loss, stats = sequence_loss(model, r, windows=windows)
            (loss / batch).backward()
            window.append(stats)
            seen += stats["tokens"]
            prog.update(step, stats["tokens"])
        if plain_weight > 0:
            pl = plain_loss(model, picks[0])
            (plain_weight * pl / batch).backward()
            plains.append(pl.item())
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        if step % 5 == 0 or step == steps:
            s = summarize(window)
            if plains:
                s["plain_ce"] = sum(plains) / len(plains)
            history.append({"kind": "train", "step": step, "seen_tokens": seen, **s})
            window, plains = [], []
            prog.update(step, extra=f"ce {s['ce']:.3f} stop {s['bce']:.3f} micro acc {s['micro_acc']:.3f} "
                        f"first acc {s['first_acc']:.3f}", force=True)
        if step % SAVE_EVERY == 0 or step == steps:
            if held:
                with torch.no_grad():
                    s = validate(model, held, plain_weight, windows)
                history.append({"kind": "val", "step": step, "seen_tokens": seen, **s})
            save_state(state_path, model, opt, step, history, windows)
            if step % SNAPSHOT_EVERY == 0:
                (out / "snapshots").mkdir(exist_ok=True)
                torch.save({"grafted": model.trained_state(), "step": step,
                            "seen_tokens": seen}, out / "snapshots" / f"step-{step}.pt")
            (out / "history.json").write_text(json.dumps(history))
            plot(history, out / "loss.png")
