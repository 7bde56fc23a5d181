"""`calibrate`: Platt scaling of the stop head on answers training never saw.

The stop head's targets say "go on" where a macro step goes on and the micro
decoder's next token is right (`losses.batch_loss`). Trained on answers the
micro decoder has begun to memorise, it says "go on" more readily than
unseen text deserves, and the user's confidence knob then means something
else for every run. `calibrate` runs the trained model teacher-forced over
the work directory's held-out answers (the evaluation prompts,
`train/eval-prompts.jsonl`, left out), fits a scale and a shift of the stop
logit (`a * logit + b`, by cross-entropy) and folds them into the stop head's
last layer, so that its "go on" probability is as right as it says on text
it has not seen: at confidence c, a step goes on where the held-out answers
went on, with the right token, at least about c of the time.

Written into `train/state.pt` (a `calibration` entry in the history, also in
`history.json`), which `export` then writes out; running it again refits from the calibrated head
(a scale near 1 and a shift near 0), except within `all`, which calibrates a
state once after its last training step.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from .losses import batch_loss
from .metrics import Positions
from .state import Answer, load_segments, load_trained, state_path, write_history, write_state

CALIBRATION_BATCH = 8
"""Held-out answers per teacher-forced pass (`losses.batch_loss`)."""
EVAL_SETS = [Path(__file__).resolve().parents[1] / name for name in ("eval-prompts.jsonl", "sharegpt-heldout.jsonl")]
"""The evaluation prompts calibration never fits on: the quick set and the ShareGPT held-out set."""


def calibration_rows(held: list[Answer]) -> list[Answer]:
    """Held-out answers but the evaluation prompts."""
    skip = {json.loads(line)["id"] for p in EVAL_SETS for line in p.read_text().splitlines() if line.strip()}
    return [a for a in held if a.id not in skip]


def fit(logits: torch.Tensor, targets: torch.Tensor) -> tuple[float, float]:
    """The scale and shift of the stop logits that minimise their binary cross-entropy."""
    ab = torch.tensor([1.0, 0.0], requires_grad=True)
    opt = torch.optim.LBFGS([ab], max_iter=200, line_search_fn="strong_wolfe")

    def closure():
        """The fit's loss and its gradient, as LBFGS asks for them."""
        opt.zero_grad()
        loss = F.binary_cross_entropy_with_logits(ab[0] * logits + ab[1], targets)
        loss.backward()
        return loss

    opt.step(closure)
    a, b = ab.detach().tolist()
    return a, b


def calibrated(st: dict) -> bool:
    """Whether a training state's stop head was calibrated after its last training step."""
    return any(h["kind"] == "calibration" and h["step"] == st["step"] for h in st["history"])


def run(work: Path, base: Path, refit: bool = True, held: list[Answer] | None = None) -> None:
    """Calibrates the stop head of `work`'s trained state in place on its
    held-out answers (`held`, when the caller has them loaded); without
    `refit`, only when it was not calibrated since its last training step
    (what `all` does, so that running it again changes nothing)."""
    st, model = load_trained(work, base, "calibrate")
    if not refit and calibrated(st):
        print(f"calibrate: done (step {st['step']})", file=sys.stderr)
        return
    rows = calibration_rows(load_segments(work, "heldout")[0] if held is None else held)
    if not rows:
        raise SystemExit(f"calibrate: {work} has no held-out answers outside the evaluation prompts")
    record: list[Positions] = []
    with torch.no_grad():
        for i in range(0, len(rows), CALIBRATION_BATCH):
            batch_loss(model, rows[i:i + CALIBRATION_BATCH], record, windows=st.get("windows", False))
    logits, targets = torch.cat([p.stop_logit for p in record]), torch.cat([p.stop_target for p in record])
    before = F.binary_cross_entropy_with_logits(logits, targets).item()
    a, b = fit(logits, targets)
    after = F.binary_cross_entropy_with_logits(a * logits + b, targets).item()
    last = model.stop_head.net[4]
    with torch.no_grad():
        last.weight.mul_(a)
        last.bias.mul_(a).add_(b)
    history = st["history"]
    seen = history[-1]["seen_tokens"] if history else 0
    history.append({"kind": "calibration", "step": st["step"], "seen_tokens": seen, "scale": a, "shift": b,
                    "answers": len(rows), "decisions": len(targets), "bce_before": before, "bce_after": after})
    st["grafted"], st["history"] = model.trained_state(), history
    write_state(state_path(work), st)
    write_history(work, history)
    print(f"calibrate: {len(rows)} held-out answers, {len(targets)} stop decisions: logit x {a:.3f} "
          f"{b:+.3f}, stop BCE {before:.4f} -> {after:.4f}", file=sys.stderr)
