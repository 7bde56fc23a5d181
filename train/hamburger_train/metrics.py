"""What teacher forcing measures of a model on segmented answers.

`Positions` is one answer's (or one batch's) per-token record (what `calibrate` fits and
`diagnose` gates on), `Counts` its sums per kind of predicted token, and
`Metrics` the means over answers that `train` logs and `diagnose` reports.
`Metrics`' field names are the keys of `history.json` and of `diagnose
--json`'s `teacher_forced`: spelled here alone.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import NamedTuple

import torch


class Positions(NamedTuple):
    """One answer's predicted tokens, teacher-forced (or one batch's, its
    answers' macro steps in order): the stop logit after each and its target,
    its place (micro step `s_of` of macro step `g_of`, whose micro spans are
    `spans`: see `losses.batch_loss`), whether its argmax is the base's
    greedy token and its `losses.base_regret`; and how many tokens the
    answers have."""

    stop_logit: torch.Tensor
    stop_target: torch.Tensor
    s_of: torch.Tensor
    g_of: torch.Tensor
    spans: torch.Tensor
    correct: torch.Tensor
    regret: torch.Tensor
    answer_tokens: int


@dataclass
class Counts:
    """Sums over one answer's predicted tokens (or several answers'): how
    many, their token cross-entropy and stop BCE (nats), how many of each
    kind are the base's greedy token (a step's first token, the first after
    a merge, a micro step's), how many stop decisions are right, and each
    kind's summed regret (nats)."""

    tokens: int
    ce: float
    bce: float
    first_correct: int
    firsts: int
    merged_first_correct: int
    merged_firsts: int
    micro_correct: int
    micros: int
    stop_correct: int
    plain_first_regret: float
    merged_first_regret: float
    micro_regret: float

    @staticmethod
    def of(p: Positions, merged_before: torch.Tensor, ce: float, bce: float) -> Counts:
        """The counts of `Positions` (one answer's or a batch's), with
        `merged_before` true for each macro step whose step before, in the same
        answer, has more than one token (its first token follows a merge),
        and the summed `ce` and `bce`."""
        first, micro = p.s_of == 0, p.s_of > 0
        after_merge = first & merged_before[p.g_of]
        plain_first = first & ~after_merge
        return Counts(
            tokens=len(p.s_of), ce=ce, bce=bce, first_correct=p.correct[first].sum().item(), firsts=int(first.sum()),
            merged_first_correct=p.correct[after_merge].sum().item(), merged_firsts=int(after_merge.sum()),
            micro_correct=p.correct[micro].sum().item(), micros=int(micro.sum()),
            stop_correct=((p.stop_logit > 0) == (p.stop_target > 0.5)).sum().item(),
            plain_first_regret=p.regret[plain_first].sum().item(),
            merged_first_regret=p.regret[after_merge].sum().item(), micro_regret=p.regret[micro].sum().item())

    @staticmethod
    def total(counts: list[Counts]) -> Counts:
        """The field-wise sums of `counts`."""
        return Counts(*(sum(getattr(c, f.name) for c in counts) for f in fields(Counts)))


@dataclass
class Metrics:
    """Means over answers: token cross-entropy and stop BCE per predicted
    token, the share of each kind of token that is the base's greedy one
    (`*_acc`) and its mean regret (nats), the share of stop decisions right,
    how many tokens were predicted, and the plain-input distillation loss when
    it was measured (`train --plain-weight`)."""

    ce: float
    bce: float
    first_acc: float
    plain_first_acc: float
    plain_first_regret: float
    merged_first_regret: float
    micro_regret: float
    merged_first_acc: float
    micro_acc: float
    stop_acc: float
    tokens: int
    plain_ce: float | None = None

    @staticmethod
    def of(counts: list[Counts], plain_ce: float | None = None) -> Metrics:
        """The means of per-answer `counts` (and `plain_ce`, when measured)."""
        tot = Counts.total(counts)
        n = max(tot.tokens, 1)
        plain_firsts = max(tot.firsts - tot.merged_firsts, 1)
        merged_firsts, micros = max(tot.merged_firsts, 1), max(tot.micros, 1)
        return Metrics(
            ce=tot.ce / n, bce=tot.bce / n, first_acc=tot.first_correct / max(tot.firsts, 1),
            plain_first_acc=(tot.first_correct - tot.merged_first_correct) / plain_firsts,
            plain_first_regret=tot.plain_first_regret / plain_firsts,
            merged_first_regret=tot.merged_first_regret / merged_firsts, micro_regret=tot.micro_regret / micros,
            merged_first_acc=tot.merged_first_correct / merged_firsts, micro_acc=tot.micro_correct / micros,
            stop_acc=tot.stop_correct / n, tokens=tot.tokens, plain_ce=plain_ce)

    def to_json(self) -> dict:
        """The metrics as `history.json` and `diagnose --json` write them
        (`plain_ce` only when measured)."""
        d = asdict(self)
        if self.plain_ce is None:
            del d["plain_ce"]
        return d

    @staticmethod
    def from_json(d: dict) -> Metrics:
        """Reads `to_json`'s keys out of a history entry; a metric an older
        history lacks (logged before it existed) reads as NaN."""
        return Metrics(**{f.name: d.get(f.name, None if f.name == "plain_ce" else math.nan) for f in fields(Metrics)})


def history_entry(kind: str, step: int, seen_tokens: int, metrics: Metrics) -> dict:
    """One `history.json` entry: `kind` ("train" or "val") after optimizer
    step `step` and `seen_tokens` answer tokens, and its metrics."""
    return {"kind": kind, "step": step, "seen_tokens": seen_tokens, **metrics.to_json()}
