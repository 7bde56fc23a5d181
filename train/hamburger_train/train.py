"""`train`: the merger, the micro-step decoder and the stop head (and the base's first layers).

Teacher-forced on the segmented answers, with the losses of `losses`
(distilled from the base's distribution when `segment` kept it; with
`plain_weight` > 0 also on plain inputs, `losses.plain_loss`).

The base stays frozen but for its first `tuned_layers` layers (0: frozen),
which learn at `TUNED_LR_SCALE` times the rate: a frozen base reads merged
inputs poorly, and the first layers are where a merge can be unpacked;
with `lora_rank` > 0 every other layer gets low-rank adapters too (at
`ADAPTER_LR_SCALE` times the rate: B starts at zero), so that the layers
that attend to merged keys and values can adapt to them at a few MB.
What ships is then the PyPI base plus the grafted modules, those layers and
the adapters' factors.

Resumable: `train/state.pt` (grafted weights, optimizer, step, history) is
written every `SAVE_EVERY` steps, at most once in `SAVE_S` seconds, and at
the end; `history.json` and `loss.png` show the
curve (`metrics.Metrics` per entry); `train/snapshots/step-N.pt` keeps the
grafted weights every `SNAPSHOT_EVERY` steps, so how the model grew with
training can be measured afterwards (`export --snapshot N`).
"""

from __future__ import annotations

import math
import random
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from . import device
from .losses import batch_loss, plain_loss
from .metrics import Counts, Metrics, history_entry
from .model import HAMburger
from .progress import Progress
from .state import Answer, load_segments, save_state, snapshot_path, state_path, train_dir, write_history

SAVE_EVERY = 25
SAVE_S = 60.0
"""The least seconds between two writes of the training state (350 MB for
SmolLM2's grafted modules and their optimizer) and of `loss.png`: a GPU
window takes 25 steps in seconds and would spend a tenth of its clock
writing them."""
SNAPSHOT_EVERY = 100
TUNED_LR_SCALE = 0.3
ADAPTER_LR_SCALE = 2.0
WARMUP = 20
GROUP = 32
"""Batches whose answers `epoch_order` sorts by length together."""


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


def chunks(answers: list[Answer], size: int) -> list[list[Answer]]:
    """`answers` in passes of at most `size` (`losses.batch_loss`)."""
    return [answers[i:i + size] for i in range(0, len(answers), max(size, 1))]


def epoch_order(rows: list[Answer], seed: int, batch: int, by_length: bool) -> list[int]:
    """The order an epoch takes the training answers in, a permutation fixed
    by `seed` (a resumed run takes the same). With `by_length` (a step's
    answers padded into one pass, which costs as many inputs per answer as
    the longest: twice the real ones for 16 random answers of the
    ShareGPT mix), each run of `batch` holds answers of similar length:
    sorted within spans of `GROUP` batches, and the batches then shuffled."""
    rng = random.Random(seed)
    order = list(range(len(rows)))
    rng.shuffle(order)
    if not by_length:
        return order
    span = batch * GROUP
    batches = []
    for i in range(0, len(order), span):
        part = sorted(order[i:i + span], key=lambda j: len(rows[j].ids))
        batches += [part[k:k + batch] for k in range(0, len(part), batch)]
    rng.shuffle(batches)
    return [j for b in batches for j in b]


def validate(model: HAMburger, held: list[Answer], plain_weight: float, windows: bool, micro_batch: int) -> Metrics:
    """The metrics of the held-out answers, and with `plain_weight` > 0 their
    mean `plain_loss` (`plain_ce`)."""
    counts = [batch_loss(model, c, windows=windows)[1] for c in chunks(held, micro_batch)]
    plain_ce = sum(plain_loss(model, a).item() for a in held) / len(held) if plain_weight > 0 else None
    return Metrics.of(counts, plain_ce)


def lr_at(step: int, steps: int, peak: float, spent: float = 0.0) -> float:
    """Linear warm-up, then cosine decay to a tenth, by how far the run is:
    its steps, or `spent` (the share of its clock used, `clock_share`) when
    that is further, so that a run against a clock (a GPU window, whose
    speed is not known before it runs) ends at the floor rate all the same."""
    if step < WARMUP:
        return peak * (step + 1) / WARMUP
    t = max((step - WARMUP) / max(1, steps - WARMUP), spent)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(t, 1.0))))


def clock_share(start: float, deadline: float | None) -> float:
    """The share of the clock from `start` to `deadline` (time.monotonic())
    spent so far; 0 without a deadline."""
    if deadline is None:
        return 0.0
    return (time.monotonic() - start) / max(deadline - start, 1e-9)


def plot(history: list, path: Path) -> None:
    """The loss curve (training tokens on x) as a PNG (none where matplotlib is not installed)."""
    try:
        import matplotlib
    except ImportError:
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    for kind, style, name in (("train", "-", "train"), ("val", "o-", "held out")):
        hs = [h for h in history if h["kind"] == kind]
        if hs:
            x = [h["seen_tokens"] for h in hs]
            ms = [Metrics.from_json(h) for h in hs]
            ax[0].plot(x, [m.ce for m in ms], style, label=f"token CE ({name})")
            ax[0].plot(x, [m.bce for m in ms], style, label=f"stop BCE ({name})")
            ax[1].plot(x, [m.micro_acc for m in ms], style, label=f"micro-step accuracy ({name})")
            ax[1].plot(x, [m.first_acc for m in ms], style, label=f"first-token accuracy ({name})")
            if not any(math.isnan(m.merged_first_acc) for m in ms):
                ax[1].plot(x, [m.merged_first_acc for m in ms], style, label=f"first token after a merge ({name})")
    for a in ax:
        a.set_xlabel("answer tokens seen")
        a.legend(fontsize=8)
        a.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def optimizer(model: HAMburger, lr: float, base_lr_scale: float = 1.0) -> tuple[torch.optim.Optimizer,
                                                                              list[torch.nn.Parameter]]:
    """AdamW over what trains (the grafted modules at `lr`, the tuned layers
    and the adapters at their scales of it, times `base_lr_scale`), and those
    parameters. With `base_lr_scale` 0 the tuned layers and the adapters stay
    as loaded (frozen, no gradients): only the grafted modules learn."""
    groups = [{"params": list(model.grafted_parameters()), "scale": 1.0}]
    for ps, scale in ((list(model.tuned_parameters()), TUNED_LR_SCALE),
                      ([p for p in model.adapter_parameters() if p.requires_grad], ADAPTER_LR_SCALE)):
        if base_lr_scale > 0:
            groups.append({"params": ps, "scale": scale * base_lr_scale})
        else:
            for p in ps:
                p.requires_grad_(False)
    params = [p for g in groups for p in g["params"]]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, betas=(0.9, 0.95), weight_decay=0.01), params


def run(work: Path, base: Path, steps: int, batch: int, lr: float, seed: int, tuned_layers: int,
        init: Path | None = None, lora_rank: int = 0, plain_weight: float = 0.0, windows: bool = False,
        base_lr_scale: float = 1.0, dtype: str = "f32", micro_batch: int = 1,
        deadline: float | None = None, segments: list[list[Answer]] | None = None) -> None:
    """Trains until `steps` optimizer steps, resuming from `train/state.pt`.
    A new run starts from `init` when given (a `grafted.safetensors`, e.g. the
    shipped model: training goes on from it on new data) instead of
    `init_grafted`'s starting point. With `plain_weight` > 0 every step also
    distils one of its answers on plain inputs (`plain_loss`), at that weight.
    With `windows` the micro decoder and the stop head learn every step's
    window (`batch_loss`). `base_lr_scale` scales the tuned layers' and
    the adapters' rates (0: they stay as `init` left them). The passes run
    under `device.autocast(dtype)`, `micro_batch` answers a pass (the same
    gradients, up to rounding, in fewer and larger products); at `deadline` (time.monotonic()) the run
    saves its state and stops, to go on when run again. `segments`: the
    work directory's train and held-out answers, when the caller has them
    loaded (`load_segments`)."""
    out = train_dir(work)
    out.mkdir(parents=True, exist_ok=True)
    rows, held = segments or load_segments(work, "train", "heldout")
    held = held[:8]
    if not rows:
        raise SystemExit(f"train: {work}/segments.jsonl holds no training answers of two macro steps or more: "
                         "answer more prompts (a window: a larger --answer-share or --minutes)")
    if plain_weight > 0 and any(a.top is None for a in rows + held):
        raise SystemExit(f"train: --plain-weight distils from the base's top tokens, and {work}/segments.jsonl "
                         "lacks them (scored before segment kept them)")
    path = state_path(work)
    st = torch.load(path, weights_only=False, map_location=torch.get_default_device()) if path.exists() else None
    if st is not None:  # a run resumes with the settings it started with
        tuned_layers, lora_rank = st.get("tuned_layers", tuned_layers), st.get("lora_rank", lora_rank)
        windows, base_lr_scale = st.get("windows", False), st.get("base_lr_scale", 1.0)
    if plain_weight > 0 and base_lr_scale == 0:
        raise SystemExit("train: --plain-weight holds the tuned layers and adapters to the base, and "
                         "--base-lr-scale 0 freezes them, so it would train nothing: drop one of the two")
    model = HAMburger.from_checkpoint(base, tuned_layers, lora_rank)
    init_grafted(model, seed)
    if init is not None:
        model.load_original(load_file(str(init)), grafted_only=True)
    opt, params = optimizer(model, lr, base_lr_scale)
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
            history.append(history_entry("val", 0, 0, validate(model, held, plain_weight, windows, micro_batch)))
    order, order_epoch = [], -1
    per_epoch = -(-len(rows) // batch)  # steps an epoch takes
    prog = Progress("train", steps, "tokens", every=30, initial=step)
    prog.update(step)
    window: list[Counts] = []
    plains: list[float] = []
    started = saved = time.monotonic()
    while step < steps:
        if deadline is not None and time.monotonic() > deadline:
            save_state(path, model, opt, step, history, windows, base_lr_scale)
            write_history(work, history)
            print(f"train: stopped at the deadline, step {step} of {steps} (saved)", file=sys.stderr)
            return
        epoch, k = divmod(step, per_epoch)
        if epoch != order_epoch:
            order, order_epoch = epoch_order(rows, seed + epoch, batch, micro_batch > 1), epoch
        picks = [rows[order[(k * batch + b) % len(rows)]] for b in range(batch)]
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, lr, clock_share(started, deadline)) * g["scale"]
        opt.zero_grad()
        for chunk in chunks(picks, micro_batch):
            with device.autocast(dtype):
                loss, counts = batch_loss(model, chunk, windows=windows)
            (loss / batch).backward()
            window.append(counts)
            seen += counts.tokens
            prog.update(step, counts.tokens)
        if plain_weight > 0:
            with device.autocast(dtype):
                pl = plain_loss(model, picks[0])
            (plain_weight * pl / batch).backward()
            plains.append(pl.item())
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        if step % 5 == 0 or step == steps:
            m = Metrics.of(window, sum(plains) / len(plains) if plains else None)
            history.append(history_entry("train", step, seen, m) | {"lr": opt.param_groups[0]["lr"]})
            window, plains = [], []
            prog.update(step, extra=f"ce {m.ce:.3f} stop {m.bce:.3f} micro acc {m.micro_acc:.3f} "
                        f"first acc {m.first_acc:.3f}", force=True)
        if step % SAVE_EVERY == 0 or step == steps:
            if held:
                with torch.no_grad():
                    m = validate(model, held, plain_weight, windows, micro_batch)
                    history.append(history_entry("val", step, seen, m))
            if step % SNAPSHOT_EVERY == 0:
                snapshot_path(work, step).parent.mkdir(exist_ok=True)
                torch.save({"grafted": model.trained_state(), "step": step, "seen_tokens": seen},
                           snapshot_path(work, step))
            write_history(work, history)
            if step == steps or time.monotonic() - saved >= SAVE_S:
                save_state(path, model, opt, step, history, windows, base_lr_scale)
                plot(history, out / "loss.png")
                saved = time.monotonic()
