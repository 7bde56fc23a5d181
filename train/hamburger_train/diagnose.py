"""`diagnose`: what a trained HAMburger's tokens per step would cost, teacher-forced.

The evaluation (`hamburger-eval run`) measures the base's log-likelihood of
free-running outputs: 10 minutes a model on 94 prompts, and one number per
confidence. `diagnose` takes seconds and says where that number comes from.
It runs the model teacher-forced over every held-out answer of a work
directory (no held-out object was ever trained on) and reports:

* per kind of predicted token (the first token after a one-token step, the
  first after a merge, a micro step's), how often its argmax is the base's
  greedy token, and what it costs the base when chosen (`losses.base_regret`, nats);
* per confidence, the micro tokens the stop head would let through in the
  window of up to `max_steps` tokens that starts at each of the data's
  macro steps (`gate`; at inference only the stop head ends a step, not
  the data's cut): how many per macro step, how often right,
  and what they cost; and the same for a perfect stop head (`oracle`: it
  goes on exactly while the micro decoder is right), which is the most the
  micro decoder allows.

The quality budget is the evaluation's: 5% of the base's own mean
log-likelihood, about 0.025 nats per token on SmolLM2's answers.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from .losses import batch_loss
from .metrics import Metrics, Positions
from .model import HAMburger
from .state import load_segments, load_trained


@dataclass
class Gate:
    """What a stop head lets through (`gate`): micro tokens taken per macro
    step, the share of them right, their mean regret (nats), and that
    regret per answer token."""

    extra_per_step: float
    micro_acc: float
    micro_regret: float
    regret_per_token: float


def gate(record: list[Positions], confidence: float | None) -> Gate:
    """The micro tokens taken in each macro step's window when a step goes on
    while the stop head's "go on" probability is at least `confidence`
    (None: while the micro decoder is right, a perfect stop head): per
    macro step, how many, the share right, and their mean `base_regret`,
    and that regret per answer token (what it takes of the quality budget)."""
    steps = taken = right = tokens = 0
    regret = 0.0
    for p in record:
        go_on = torch.sigmoid(-p.stop_logit) >= confidence if confidence is not None else None
        where = {(int(g), int(s)): i for i, (g, s) in enumerate(zip(p.g_of, p.s_of))}
        tokens += p.answer_tokens
        for g in range(len(p.spans)):
            steps += 1
            for s in range(int(p.spans[g]) - 1):
                nxt = where[(g, s + 1)]
                if not (p.correct[nxt] if go_on is None else go_on[where[(g, s)]]):
                    break
                taken += 1
                right += int(p.correct[nxt])
                regret += float(p.regret[nxt])
    return Gate(extra_per_step=taken / max(steps, 1), micro_acc=right / max(taken, 1),
                micro_regret=regret / max(taken, 1), regret_per_token=regret / max(tokens, 1))


def load_model(work: Path, base: Path, grafted: Path | None) -> HAMburger:
    """The model of `grafted` (a `grafted.safetensors`) or else of the work
    directory's training state, on the base."""
    if grafted is not None:
        model = HAMburger.from_checkpoint(base)
        try:
            model.load_original(load_file(str(grafted)), grafted_only=True)
        except (OSError, KeyError, RuntimeError, SafetensorError) as e:
            raise SystemExit(f"diagnose: {grafted}: {e}") from None
        return model
    return load_trained(work, base, "diagnose")[1]


def run(work: Path, base: Path, grafted: Path | None, confidences: list[float], as_json: bool) -> None:
    """Prints the diagnosis of `work`'s held-out answers (markdown, or JSON)."""
    if not (work / "segments.jsonl").exists():
        raise SystemExit(f"diagnose: {work}/segments.jsonl does not exist: run data and segment first")
    rows = load_segments(work, "heldout")[0]
    if not rows:
        raise SystemExit(f"diagnose: {work}/segments.jsonl has no held-out answers")
    model = load_model(work, base, grafted)
    record: list[Positions] = []
    with torch.no_grad():
        tf = Metrics.of([batch_loss(model, [a], record, windows=True)[1] for a in rows])
    gates, oracle = [(c, gate(record, c)) for c in confidences], gate(record, None)
    if as_json:
        print(json.dumps({"answers": len(rows), "teacher_forced": tf.to_json(),
                          "gate": [{"confidence": c, **asdict(g)} for c, g in gates], "oracle": asdict(oracle)}))
        return
    print(f"{len(rows)} held-out answers, {tf.tokens} predicted tokens, teacher-forced\n")
    print("| token | right | regret (nats) |\n| --- | ---: | ---: |")
    print(f"| first, after a one-token step | {tf.plain_first_acc:.3f} | {tf.plain_first_regret:.3f} |")
    print(f"| first, after a merge | {tf.merged_first_acc:.3f} | {tf.merged_first_regret:.3f} |")
    print(f"| micro step | {tf.micro_acc:.3f} | {tf.micro_regret:.3f} |\n")
    print("| stop head | micro tokens per step | right | regret per micro token | per answer token |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for c, g in gates + [("perfect", oracle)]:
        print(f"| {c} | {g.extra_per_step:.3f} | {g.micro_acc:.3f} | {g.micro_regret:.3f} | {g.regret_per_token:.4f} |")
