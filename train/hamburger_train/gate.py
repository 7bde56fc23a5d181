"""The runtime's draft gate for self-verified decoding, ported so that
`drafting.measure` drafts exactly as the runtime does.

The runtime (`src/decode/draft.rs`, `DraftGate`, as of issue 35's first version)
keeps, per sequence, the acceptance it has seen in buckets of the stop
head's "go on" signal (`1 - p_stop` after the token a draft would follow:
below 0.5, 0.8, 0.95, and above), and drafts the next token only while the
chance that every draft so far and this one are accepted pays for its cost
(`draft_cost`: a micro step's share of a base forward). A first draft gated
off is probed now and then, at intervals that double after each failed
probe. A drafted token less likely than `p_min` under the micro decoder is
dropped, with the drafting (llama.cpp's `--spec-draft-p-min`); `n_min`
drafts are always made. Everything here mirrors that code line for line;
when it changes, this must. The runtime's gate also has `may_draft` and `skip` (a
forward stores no features when no bucket pays and no probe is due, and
the step after it counts toward the next probe without asking the gate):
that decides as `wants` does here, where such a step is gated off and
counted the same way, so there is nothing of it to port.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .model import Config

EDGES = (0.5, 0.8, 0.95)
PRIOR = 0.3
PRIOR_WEIGHT = 2.0
DECAY = 0.95
PROBE_FIRST = 4
PROBE_MOST = 256
ROW_COST = 0.03  # one more row of a base forward, relative to the forward of one row


def draft_cost(cfg: Config) -> float:
    """What one drafted token costs as a share of one base forward: the
    micro decoder's layers and the lm_head against the base's layers and
    the lm_head (weights read per forward), plus one more verified row."""
    d, kv, ff = cfg.dim, cfg.n_head_kv * cfg.head_dim, cfg.ffn
    layer = 2 * d * d + 2 * d * kv + 3 * d * ff
    head = cfg.vocab * d
    return (cfg.micro_layers * layer + head) / (cfg.n_layer * layer + head) + ROW_COST


def bucket(p_stop: float) -> int:
    """The bucket of the stop head's signal after the token a draft would follow."""
    go_on = 0.0 if math.isnan(p_stop) else 1.0 - p_stop
    return sum(go_on >= e for e in EDGES)


@dataclass(frozen=True)
class GatedRule:
    """The runtime's draft settings with its gate: up to `n_max` drafts,
    `n_min` always, a drafted token kept while at least `p_min` likely."""

    n_max: int = 3
    n_min: int = 0
    p_min: float = 0.0

    def __str__(self) -> str:
        return f"runtime gate, n_max {self.n_max}" + (f", p >= {self.p_min:g}" if self.p_min > 0 else "")

    def keeps(self, depth: int, prob: float) -> bool:
        """Whether drafted token `depth` (1 for the first) of probability `prob` stays."""
        return depth <= self.n_min or prob >= self.p_min


class DraftGate:
    """One sequence's record of which drafts were accepted, and the decision
    to draft the next token (the module's doc)."""

    def __init__(self, cost: float):
        self.cost = cost
        self.tried = [0.0] * (len(EDGES) + 1)
        self.accepted = [0.0] * (len(EDGES) + 1)
        self.waited = 0
        self.interval = PROBE_FIRST
        self.probing = False

    def acceptance(self, p_stop: float) -> float:
        """The acceptance expected of a draft after a token of stop probability `p_stop`."""
        b = bucket(p_stop)
        return (self.accepted[b] + PRIOR * PRIOR_WEIGHT) / (self.tried[b] + PRIOR_WEIGHT)

    def wants(self, rule: GatedRule, depth: int, p_stop_before: list[float]) -> bool:
        """Whether to draft token `depth` given the stop probabilities after
        the verified token and each drafted one so far (the last the one it follows)."""
        if depth > rule.n_max:
            return False
        if depth <= rule.n_min:
            return True
        reach, expected = 1.0, 1.0
        for p in p_stop_before[:depth - 1]:
            reach *= self.acceptance(p)
            expected += reach
        chance = reach * self.acceptance(p_stop_before[depth - 1])
        rate = expected / (1.0 + (depth - 1) * self.cost)
        if chance >= self.cost * rate:
            return True
        if depth > 1:
            return False
        self.waited += 1
        self.probing = self.waited >= self.interval
        if self.probing:
            self.waited = 0
        return self.probing

    def record(self, p_stop_before: list[float], accepted: int) -> None:
        """Records a verified draft: the stop probabilities it was drafted
        after and how many of its tokens were accepted."""
        judged = min(accepted + 1, len(p_stop_before))
        for j, p in enumerate(p_stop_before[:judged]):
            b = bucket(p)
            self.tried[b] = self.tried[b] * DECAY + 1.0
            self.accepted[b] = self.accepted[b] * DECAY + (1.0 if j < accepted else 0.0)
        probing, self.probing = self.probing, False
        if probing and judged > 0:
            self.interval = max(self.interval // 2, PROBE_FIRST) if accepted > 0 else min(self.interval * 2, PROBE_MOST)

    def draft(self, rule: GatedRule, tokens: list[int], probs: list[float], p_stops: list[float], t0: int,
              room: int, end_tokens: list[int]) -> tuple[int, list[float]]:
        """How many of the micro decoder's `tokens` (each with its
        probability `probs` and the stop probability before it `p_stops`)
        the runtime drafts after the base's token `t0`, with `room` tokens
        of text left; and the stop probabilities the gate judged them by
        (what `record` takes)."""
        before: list[float] = []
        last, n = t0, 0
        while True:
            depth = n + 1
            if last in end_tokens or depth > room or depth > len(tokens):
                return n, before
            signal = before + [p_stops[n]]
            if not self.wants(rule, depth, signal):
                return n, before
            before = signal
            if not rule.keeps(depth, probs[n]):
                return n, before
            last, n = tokens[n], n + 1
