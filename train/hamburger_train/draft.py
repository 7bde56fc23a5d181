"""`draft`: the micro decoder and stop head trained as a draft head for
self-verified decoding, on the frozen base's features at one token per entry.

EAGLE and Medusa train heads on a frozen base's hidden states with the
base's own outputs as targets; the base here never changes either, so this
stage pays for the base once:

1. **The verifier.** The base checkpoint (`--base`) with `--init`'s base
   layers and adapters folded in (the shipped model's base: what verified
   decoding of the shipped model runs), written once as a checkpoint
   (`WORK/verifier/`) for the tools that answer and tokenize.
2. **Answers** (`data`'s prompts, `--prompts`, `--skip`): the verifier's own
   greedy answers through `hamburger-server` at confidence > 1, so every
   answer token is the base's greedy choice after the tokens before it.
   With `--reference-answers`, a training prompt from ShareGPT takes
   ShareGPT's own reply instead (EAGLE's fixed data: no answering, so
   about 3.5 times the tokens per CPU hour); the held-out prompts, which
   validate, and the standard library's are still answered by the base.
   With `--answers CORPUS`, the answers a corpus in the repository keeps
   for these prompts (`corpus`: the same verifier, chat and budget) are
   taken instead of answered again.
3. **Token ids** of every prompt and answer (`segment.tokenize`: the
   teacher GGUF's chat template and tokenizer, as the runtime reads them).
4. **Features** and the base's 8 most likely tokens at every answer token
   (the soft targets), from one f32 forward of the verifier, cached once on
   disk (`features`: `WORK/features/`), and refused by name if they were
   made with another base or tokenizer.
5. **Training**, teacher-forced at every answer row: the micro decoder reads
   [features, t0, t1, t2] (t0 the text's token at the row) and learns the
   base's distribution at the next three tokens (distilled over its top 8);
   the stop head reads out_s (the final features for s = 0; detached, so it
   is a probe and does not pull the drafts) and learns whether draft s + 1
   will be accepted (its teacher-forced argmax is the base's greedy token).
   A draft counts as accepted only along the base's own greedy path, where
   the text so far is what the base would have said: always for the base's
   answers (up to near-ties between the answering Q8_0 GGUF and the f32
   forward), not always for references. With `--copy M` the micro decoder
   also reads each token's copy candidates (`copying`: what followed the
   latest earlier occurrence of the text's last M, ..., 1 tokens, from
   `WORK/tokens.jsonl`) through a copy matrix that starts at zero and learns
   at `COPY_LR_SCALE` times the rate; it is exported as
   `draft_head.copy.weight` (the GGUF's `draft_copy.weight`).

Only the micro decoder and stop head train, from `--init`'s (its draft
head where it has one) or from `--init-head`'s, a draft head alone: a new
run on more answers goes on from the shipped head rather than start over.
The merger and the base stay as `--init` has them. Resumable
(`WORK/draft/state.pt` every `SAVE_EVERY` steps, with the rows seen and the
CPU seconds spent); every `VAL_EVERY` steps `drafting.measure` on the work
directory's first `VAL_ANSWERS` held-out answers gives the acceptance curve
(`WORK/draft/history.json`).
The result is `WORK/draft/grafted.safetensors`: `--init` unchanged, with
the new micro decoder and stop head beside it as its draft head
(`draft_head.*`; the GGUF's `draft.blk.N.*` and `draft_stop.*`): macro steps
keep `--init`'s modules, self-verified decoding drafts with the new ones.
"""

from __future__ import annotations

import json
import random
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from . import corpus, data, device, features, records, segment
from .copying import COPY_LR_SCALE
from .drafting import DRAFT_HEAD, DraftRule, attach_copies, measure, text_after, draftable, verifier
from .export import write_checkpoint, write_safetensors
from .gate import GatedRule
from .model import COPY_KEY, HAMburger
from .progress import Progress
from .state import write_state
from .train import clock_share, lr_at

SAVE_EVERY = 25
VAL_EVERY = 100
VAL_ANSWERS = 8
STOP_WEIGHT = 0.5


def draft_optimizer(model: HAMburger, lr: float, micro_lr_scale: float) -> tuple[torch.optim.Optimizer, list]:
    """AdamW over what trains: the micro decoder at `micro_lr_scale` times
    `lr` (0: frozen), its copy matrix where it has one at `COPY_LR_SCALE`
    times `lr`, and the stop head at `lr`, the rest frozen; and those parameters."""
    model.requires_grad_(False)
    groups = [{"params": list(model.stop_head.parameters()), "scale": 1.0}]
    if micro_lr_scale > 0:
        groups.append({"params": list(model.micro.parameters()), "scale": micro_lr_scale})
    if model.copy_proj is not None:
        groups.append({"params": list(model.copy_proj.parameters()), "scale": COPY_LR_SCALE})
    params = [p for g in groups for p in g["params"]]
    for p in params:
        p.requires_grad_(True)
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), weight_decay=0.01), params


def head_state(model: HAMburger) -> dict[str, torch.Tensor]:
    """The micro decoder's and stop head's tensors (and its copy matrix's)
    under the original key names."""
    return {k: v for k, v in model.original_state(grafted_only=True).items() if k.startswith("micro_step_decoder.")}


def verifier_gguf(work: Path, bin_dir: Path, base: Path, model: HAMburger, meta: dict, stage: str) -> Path:
    """The verifying model's GGUF in `work`, the teacher that answers and
    tokenizes (`data.teacher_gguf`), converted from `work/verifier/` (the
    original layout, adapters folded; written once, with the `meta` it was
    made with). A work directory whose verifier has another base is refused
    naming it."""
    ckpt = work / "verifier"
    if (ckpt / "meta.json").exists():
        have = json.loads((ckpt / "meta.json").read_text())
        if have["base"] != meta["base"] or have["tokenizer"] != meta["tokenizer"]:
            raise SystemExit(f"{stage}: {ckpt} is another base or tokenizer than this one's: use another --work")
    else:
        if (work / "teacher-q8_0.gguf").exists() or (work / "base-q8_0.gguf").exists():
            raise SystemExit(f"{stage}: {work} has GGUFs of an unknown base: use another --work")
        write_checkpoint(model, base, ckpt)
        (ckpt / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    work.mkdir(parents=True, exist_ok=True)
    return data.teacher_gguf(bin_dir, ckpt, work)


def prepare(work: Path, bin_dir: Path, base: Path, init: Path | None, prompts: int, skip: int, max_tokens: int,
            slots: int, threads: int, share: float = 0.0, source: Path | None = None,
            stdlib_from: int = 0, references: bool = False,
            answers: corpus.Corpus | None = None, init_head: Path | None = None,
            answered_only: bool = False) -> tuple[HAMburger, dict]:
    """Steps 1-4: the verifier (drafting with `init_head` when given), its
    answers (ShareGPT's replies for the training prompts that have one,
    with `references`; those the corpus
    `answers` holds taken from it; with `answered_only` only those, the
    rest of the prompts left out), their token ids and their cached
    features; returns the verifier and the cache's `meta`. A work directory
    whose prompts were built the other way is refused."""
    model = verifier(base, init, "draft", init_head)
    meta = features.meta_of(model, base)
    features.check_meta(work / "features", meta)
    teacher = verifier_gguf(work, bin_dir, base, model, meta, "draft")
    rows = data.build_prompts(work, prompts, share, source, stdlib_from, references)
    general = [r for r in rows if r["id"].startswith("sharegpt:")]
    if general and references != any("reference" in r for r in general):
        made = "without" if references else "with"
        raise SystemExit(f"draft: {work / 'prompts.jsonl'} was made {made} --reference-answers: use another --work")
    later = {r["id"] for r in rows[prompts:]} - {r["id"] for r in rows[:prompts]}
    rows = rows[skip:prompts]
    if references:
        data.reference_answers(work / "responses.jsonl", rows, max_tokens)
    if answers is not None:
        corpus.seed(work / "responses.jsonl", answers, rows, meta, max_tokens)
    if answered_only:
        have = records.done_ids(work / "responses.jsonl")
        print(f"draft: {sum(r['id'] not in have for r in rows)} of {len(rows)} prompts left out: "
              "no answer in the corpus or this work directory (--answered-only)", file=sys.stderr)
        rows = [r for r in rows if r["id"] in have]
    data.answer(work / "responses.jsonl", bin_dir, teacher, rows, max_tokens, slots, threads)
    segment.tokenize(work, bin_dir, teacher)
    # Not the answers to prompts past `prompts` (a longer run's before, in the
    # same work directory): a shorter run trains on what is cached up to it.
    tokens = [t for t in records.read(work / "tokens.jsonl") if t["id"] not in later]
    features.build(work / "features", model, base, tokens)
    return model, meta


def batch_loss(model: HAMburger, cache: features.Cache, rows: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """The loss of the drafts at `rows`, teacher-forced, and its sums for
    the log: token cross-entropy against the base's distribution, stop BCE,
    drafts right per micro step, and accepted drafts per row when every
    right draft is taken (the ungated rule)."""
    n = model.cfg.max_steps - 1
    feats = cache.features[rows].float()
    text = text_after(cache, rows, n)
    valid = text >= 0
    tokens = torch.cat([cache.next[rows][:, None], text[:, :-1].clamp(min=0)], 1)
    at = (rows[:, None] + torch.arange(n + 1)[None]).clamp(max=len(cache.next) - 1)
    greedy = cache.top_ids[at, 0]  # the base's own token after each teacher-forced prefix
    on_path = (tokens == greedy[:, :-1]).long().cumprod(1).bool()  # the text so far is the base's own
    copies = cache.copies[rows] if model.copy_proj is not None else None
    with torch.set_grad_enabled(torch.is_grad_enabled() and next(model.micro.parameters()).requires_grad):
        out = model.micro_decode(feats, tokens, copies)  # out_1..out_n: drafts 1..n
    logp = F.log_softmax(model.logits(out), -1)
    top_p = torch.softmax(cache.top_logprobs[at[:, 1:]], -1)
    ce = -(top_p * logp.gather(-1, cache.top_ids[at[:, 1:]])).sum(-1)
    right = (logp.argmax(-1) == greedy[:, 1:]) & valid
    stop_in = torch.cat([feats[:, -1:], out[:, :-1].detach()], 1)  # out_s before draft s + 1
    stop_logit = model.stop_head(stop_in)
    bce = F.binary_cross_entropy_with_logits(stop_logit, (~right).float(), reduction="none")
    v = valid.float()
    n_valid = v.sum().clamp(min=1)
    loss = ((ce * v).sum() + STOP_WEIGHT * (bce * v).sum()) / n_valid
    sums = {"rows": len(rows), "ce": (ce * v).sum().item(), "bce": (bce * v).sum().item(),
            "slots": v.sum(0).tolist(), "right": right.sum(0).tolist(),
            "accepted": (right & on_path).long().cumprod(1).sum().item()}
    return loss, sums


@torch.no_grad()
def teacher_forced_accepted(model: HAMburger, cache: features.Cache, batch: int = 256) -> float:
    """Accepted drafts per row when every draft is taken, teacher-forced
    (`batch_loss`'s count): on the base's own answers, what
    `drafting.measure` finds for the ungated rule with the runtime's
    autoregressive drafts (up to near-ties), since a draft is
    only accepted when the ones before it were, and then it read the text."""
    rows = draftable(cache, model.cfg.eos)
    taken = sum(batch_loss(model, cache, rows[i:i + batch])[1]["accepted"] for i in range(0, len(rows), batch))
    return taken / max(len(rows), 1)


def summary(window: list[dict]) -> dict:
    """The means of `batch_loss`'s sums over the steps since the last log."""
    rows = sum(w["rows"] for w in window)
    slots = [sum(w["slots"][s] for w in window) for s in range(len(window[0]["slots"]))]
    right = [sum(w["right"][s] for w in window) for s in range(len(slots))]
    return {"ce": sum(w["ce"] for w in window) / max(sum(slots), 1),
            "stop_bce": sum(w["bce"] for w in window) / max(sum(slots), 1),
            "draft_acc": [r / max(n, 1) for r, n in zip(right, slots)],
            "accepted_per_row": sum(w["accepted"] for w in window) / max(rows, 1)}


def rules_of(confidences: list[float], p_mins: list[float], n_max: int) -> list[DraftRule | GatedRule]:
    """The ungated rule, each stop-head confidence alone, each p_min alone,
    and every pair; then the runtime's gate, alone and with each p_min."""
    return ([DraftRule(n_max, c, p) for c in [None, *confidences] for p in [None, *p_mins]]
            + [GatedRule(n_max, 0, p) for p in sorted({0.0, *p_mins})])


def run(work: Path, bin_dir: Path, base: Path, init: Path | None, prompts: int, skip: int, max_tokens: int, slots: int,
        threads: int, steps: int, batch: int, lr: float, seed: int, confidences: list[float],
        p_mins: list[float], out: Path | None = None, micro_lr_scale: float = 1.0, share: float = 0.0,
        source: Path | None = None, stdlib_from: int = 0, references: bool = False,
        answers: Path | None = None, init_head: Path | None = None, dtype: str = "f32",
        answered_only: bool = False, copy: int = 0) -> None:
    """Prepares the work directory (`prepare`; ShareGPT's own replies as the
    training answers with `references`, the corpus `answers`' answers
    where it has them), then trains (`train_head`, in precision `dtype`)
    into `out` (default `WORK/draft/`), starting from the draft head
    `init_head` when given. With `answered_only` nothing is answered: the
    prompts the corpus lacks are left out. With `copy` M the head reads copy
    candidates of n-grams up to M (`copying`): a new copy matrix when the
    head it starts from has none."""
    for flag, path in (("--init", init), ("--init-head", init_head)):
        if path is not None and not path.exists():
            raise SystemExit(f"draft: {flag} {path} does not exist")
    if answered_only and answers is None:
        raise SystemExit("draft: --answered-only takes its answers from a corpus: give --answers")
    if copy < 0:
        raise SystemExit(f"draft: --copy {copy}: the longest n-gram copied from is 1 or more (0: no copy candidates)")
    kept = corpus.read(answers) if answers is not None else None  # a broken corpus is refused before any work
    model, meta = prepare(work, bin_dir, base, init, prompts, skip, max_tokens, slots, threads, share, source,
                          stdlib_from, references, kept, init_head, answered_only)
    if copy and model.copy_longest() not in (0, copy):
        raise SystemExit(f"draft: --copy {copy}: the head it starts from copies from n-grams up to "
                         f"{model.copy_longest()}")
    if copy and model.copy_proj is None:
        model.add_copy(copy)
    # What macro steps keep: `--init`'s file, else the base's own modules
    # (read anew: `model`'s micro decoder is `--init-head`'s when given).
    macro = load_file(str(init)) if init is not None else {
        k: t.detach().clone() for k, t in HAMburger.from_checkpoint(base).original_state(grafted_only=True).items()}
    train_head(work, model, meta, macro, out or work / "draft", steps, batch, lr, seed, confidences, p_mins,
               micro_lr_scale, dtype)


def train_head(work: Path, model: HAMburger, meta: dict, macro: dict[str, torch.Tensor], out: Path, steps: int,
               batch: int, lr: float, seed: int, confidences: list[float], p_mins: list[float],
               micro_lr_scale: float = 1.0, dtype: str = "f32", deadline: float | None = None,
               texts: Path | None = None) -> None:
    """Trains `model`'s micro decoder (at `micro_lr_scale` times `lr`; 0:
    only the stop head learns) and stop head as a draft head on `work`'s
    cached features until `steps` optimizer steps of `batch` rows, under
    `device.autocast(dtype)`, resuming from `out/state.pt`; then writes the
    macro modules `macro` with the head beside them (`export`). SIGINT or
    SIGTERM stops it after the step under way, saved; at `deadline`
    (time.monotonic()) it stops saved and exports what it has. A head with
    copy candidates looks them up in the cached answers' texts, the records
    (`id`, `ids`, `n_prompt`) of `texts` (default `work/tokens.jsonl`)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "state.pt"
    st = torch.load(path, weights_only=False) if path.exists() else None
    if st is not None:  # a run resumes with the settings it started with
        micro_lr_scale = st.get("micro_lr_scale", 1.0)
    if st is not None and COPY_KEY in st["head"] and model.copy_proj is None:
        model.add_copy(st["head"][COPY_KEY].shape[1] // model.cfg.dim)  # resumed without --copy
    opt, params = draft_optimizer(model, lr, micro_lr_scale)
    step, history, cpu_s = 0, [], 0.0
    if st is not None:
        if st["base"] != meta["base"]:
            raise SystemExit(f"draft: {path} was trained on another base than this one")
        load_head(model, st["head"])
        opt.load_state_dict(st["opt"])
        step, history, cpu_s = st["step"], st["history"], st["cpu_s"]
        print(f"draft: resumed at step {step}", file=sys.stderr)
    rules = rules_of(confidences, p_mins, model.cfg.max_steps - 1)
    cache = features.load(work / "features", meta, "train")
    held = features.load(work / "features", meta, "heldout", VAL_ANSWERS, required=False)
    prompts = {t["id"]: t["ids"][:t["n_prompt"]] for t in records.read(texts or work / "tokens.jsonl")}
    if model.copy_proj is not None:
        for c in (cache, held):
            if c is not None:
                attach_copies(c, prompts, model.copy_longest(), model.cfg.max_steps - 1)
    rows = draftable(cache, model.cfg.eos)
    seen = history[-1]["seen_rows"] if history else 0
    t0 = time.process_time()

    def cpu() -> float:
        """CPU seconds this run has spent (all threads), resumed runs included."""
        return cpu_s + time.process_time() - t0

    def validate() -> None:
        """The acceptance of every rule on the held-out answers (when there
        are any), into the history, with the ungated rule's teacher-forced twin."""
        if held is None:
            return
        forced = teacher_forced_accepted(model, held)
        for a in measure(model, held, rules, prompts=prompts):
            history.append({"kind": "val", "step": step, "seen_rows": seen, "cpu_s": cpu(), **asdict(a),
                            "teacher_forced_accepted": forced})

    def save() -> None:
        """The training state (atomic) and `history.json`."""
        write_state(path, {"head": head_state(model), "opt": opt.state_dict(), "step": step, "history": history,
                           "cpu_s": cpu(), "base": meta["base"], "micro_lr_scale": micro_lr_scale})
        (out / "history.json").write_text(json.dumps(history))

    if step == 0 and not history:
        validate()
        save()  # the start's state and curve, even for a run of no steps
    prog = Progress("draft", steps, "rows", every=30, initial=step)
    window: list[dict] = []
    order, order_epoch = [], -1
    started = time.monotonic()  # the clock `deadline` ends
    with StopSignals() as stop:
        while step < steps:
            if deadline is not None and time.monotonic() > deadline:
                save()
                print(f"draft: stopped at the deadline, step {step} of {steps} (saved)", file=sys.stderr)
                break
            epoch, i0 = divmod(step * batch, len(rows))
            if epoch != order_epoch:
                order, order_epoch = list(range(len(rows))), epoch
                random.Random(seed + epoch).shuffle(order)
            picks = rows[torch.tensor([order[(i0 + b) % len(rows)] for b in range(batch)])]
            for g in opt.param_groups:
                g["lr"] = lr_at(step, steps, lr, clock_share(started, deadline)) * g["scale"]
            opt.zero_grad()
            with device.autocast(dtype):
                loss, sums = batch_loss(model, cache, picks)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            step += 1
            seen += batch
            window.append(sums)
            prog.update(step, batch)
            if step % 5 == 0 or step == steps:
                m = summary(window)
                window = []
                history.append({"kind": "train", "step": step, "seen_rows": seen, "cpu_s": cpu(), **m})
                prog.update(step, extra=f"ce {m['ce']:.3f} stop {m['stop_bce']:.3f} draft acc "
                            + "/".join(f"{a:.2f}" for a in m["draft_acc"])
                            + f" accepted/row {m['accepted_per_row']:.3f}", force=True)
            if step % VAL_EVERY == 0 or step == steps:
                validate()
            if step % SAVE_EVERY == 0 or step == steps or stop.asked:
                save()
            if stop.asked and step < steps:
                raise SystemExit(f"draft: stopped at step {step} of {steps}, saved: run the same command to go on")
    export(model, macro, out / "grafted.safetensors")
    for a in (h for h in history if h["kind"] == "val" and h["step"] == step):
        print(f"draft: {a['rule']}: {a['accepted_per_forward']:.3f} accepted per base forward, "
              f"{a['accepted_per_verify_forward']:.3f} per verify forward ({a['drafted_per_forward']:.2f} drafted "
              "per base forward)", file=sys.stderr)


class StopSignals:
    """Within it, SIGINT and SIGTERM only set `asked` (the training loop
    saves and stops after the step under way); the handlers before are
    restored on leaving."""

    def __init__(self):
        self.asked = False
        self.before: dict = {}

    def __enter__(self) -> "StopSignals":
        for sig in (signal.SIGINT, signal.SIGTERM):
            self.before[sig] = signal.signal(sig, self.ask)
        return self

    def ask(self, signum, frame) -> None:
        """The handler: asks the loop to stop."""
        self.asked = True

    def __exit__(self, *exc) -> None:
        for sig, handler in self.before.items():
            signal.signal(sig, handler)


def load_head(model: HAMburger, head: dict[str, torch.Tensor]) -> None:
    """Copies a saved micro decoder and stop head (`head_state`) into `model`."""
    own = model.original_state(grafted_only=True)
    with torch.no_grad():
        for k, t in head.items():
            own[k].copy_(t)


def export(model: HAMburger, macro: dict[str, torch.Tensor], path: Path) -> None:
    """The grafted modules of macro steps `macro` unchanged, with the
    trained micro decoder and stop head beside them as the draft head
    (`draft_head.*`, f16): one file, and one GGUF, for macro steps (the
    macro modules) and self-verified decoding (the draft head). The head
    alone goes to `draft-head.safetensors` beside it, the file a repository
    ships next to grafted modules it already has (`hamburger-testmodel
    smollm2 --grafted GRAFTED --grafted HEAD`)."""
    head = {DRAFT_HEAD + k.removeprefix("micro_step_decoder."): v.detach().to("cpu", torch.float16)
            for k, v in head_state(model).items()}
    write_safetensors({**macro, **head}, path)
    write_safetensors(head, path.with_name("draft-head.safetensors"))
    print(f"draft: {path} and {path.with_name('draft-head.safetensors')}", file=sys.stderr)
