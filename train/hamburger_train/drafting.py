"""The micro decoder as a draft head for self-verified decoding, and the
measure of what it earns: accepted tokens per verify forward.

Self-verified decoding (`docs/model.md`) reads one token per KV entry. The
base's output at a row gives its own token t0; the micro decoder drafts t1,
t2, t3 from that row's features, micro step 0 reading [features..., embed(t0)]
as in a macro step; the next base forward reads t0 and the drafts as
single-token rows and accepts the longest prefix of the drafts that equals
its own greedy tokens, plus one token of its own; the next draft starts from
the row of that last token. Given the text the base produces (its greedy
answer) and the features of its rows (`features`), that loop is simulated
exactly here, without the base: the drafts are the micro decoder's own
(autoregressive), a draft token is accepted while it equals the text's.

How many tokens are drafted is the runtime's rule (`DraftRule`): a token is
drafted while the stop head's "go on" probability before it is at least
`confidence` (the stop head predicts whether the draft will be accepted) and
its own probability under the micro decoder at least `p_min` (llama.cpp's
`--spec-draft-p-min`), up to `n_max` tokens. With `ngram`, the context
itself drafts first, as llama.cpp's `ngram-simple` does (`ngram_draft`):
where its last `ngram` tokens occurred before, the tokens that followed
them are the draft, and the micro decoder drafts only where they did not.
A `TreeRule` drafts a tree instead of a chain (EAGLE's and SpecInfer's
trees, greedy): the chain and the likeliest alternatives to its tokens,
all verified by one base forward.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from safetensors import SafetensorError
from safetensors.torch import load_file

from .copying import TextIndex, sizes_of, teacher_forced
from .features import Cache
from .gate import DraftGate, GatedRule, draft_cost
from .model import COPY_KEY, HAMburger


DRAFT_HEAD = "draft_head."
"""Key prefix of a draft head in a `grafted.safetensors` (`draft.export`):
a micro decoder and stop head for drafting alone, beside the macro steps'
own (`micro_step_decoder.`), which the converter stores as the GGUF's
`draft.blk.N.*` and `draft_stop.*`."""


def drafting_modules(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`sd` with its draft head, if it has one, in place of the macro
    steps' micro decoder and stop head: the modules that draft."""
    head = {"micro_step_decoder." + k.removeprefix(DRAFT_HEAD): t for k, t in sd.items() if k.startswith(DRAFT_HEAD)}
    return {k: t for k, t in sd.items() if not k.startswith(DRAFT_HEAD)} | head


def read_tensors(path: Path, named: str) -> dict[str, torch.Tensor]:
    """The tensors of the safetensors file `path`, or a one-line error
    starting with `named` (the stage and flag) and naming the file."""
    try:
        return load_file(str(path))
    except (OSError, SafetensorError) as e:
        raise SystemExit(f"{named} {path}: {e}") from None


def check_head_alone(tensors: dict[str, torch.Tensor], named: str) -> None:
    """Refuses, in one line starting with `named`, tensors that are not a
    draft head alone (`draft-head.safetensors`: every name `DRAFT_HEAD`*)."""
    if not tensors or any(not k.startswith(DRAFT_HEAD) for k in tensors):
        raise SystemExit(f"{named}: not a draft head alone (a tensor not named {DRAFT_HEAD}*)")


def check_same_tensors(given: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], named: str,
                       other: str) -> None:
    """Refuses, in one line starting with `named` and naming the tensor,
    `given` tensors whose names or shapes are not `expected`'s (`other`
    says where those come from)."""
    for k, t in expected.items():
        theirs = given.get(k)
        if theirs is None or theirs.shape != t.shape:
            what = "missing" if theirs is None else f"{list(theirs.shape)}"
            raise SystemExit(f"{named}: {k}: {what}; {other} has {list(t.shape)}")
    extra = sorted(set(given) - set(expected))
    if extra:
        raise SystemExit(f"{named}: {extra[0]}: not in {other}")


def verifier(base: Path, grafted: Path | None, stage: str, head: Path | None = None) -> HAMburger:
    """The model that verifies and drafts: the base checkpoint `base` with
    what `grafted` (a `grafted.safetensors`; None: nothing) changes: its
    base layers and adapters (folded into the weights: the frozen verifying
    base) and its grafted modules (the micro decoder and stop head that
    draft: its draft head where it has one, or `head`'s, a draft head alone
    as `draft-head.safetensors` holds it). A broken file is refused in one
    line naming it (`stage` first)."""
    model = HAMburger.from_checkpoint(base)
    # A head beside no grafted file drafts beside the base checkpoint's own modules.
    sd = dict(model.original_state(grafted_only=True)) if grafted is None and head is not None else {}
    for path in (p for p in (grafted, head) if p is not None):
        tensors = read_tensors(path, f"{stage}:")
        if path is head:
            check_head_alone(tensors, f"{stage}: {head}")
        sd |= tensors
    sd = drafting_modules(sd)
    if COPY_KEY in sd:
        w, dim = sd[COPY_KEY], model.cfg.dim
        if w.dim() != 2 or w.shape[0] != dim or w.shape[1] % dim or not w.shape[1]:
            named = head if head is not None else grafted
            raise SystemExit(f"{stage}: {named}: {DRAFT_HEAD}copy.weight is {list(w.shape)}, "
                             f"not [{dim}, M x {dim}]")
        model.add_copy(w.shape[1] // dim)
    try:
        if sd:
            model.load_original(sd, grafted_only=True)
    except (KeyError, RuntimeError) as e:
        named = head if grafted is None else grafted if head is None else f"{grafted} with {head}"
        raise SystemExit(f"{stage}: {named}: {e}") from None
    model.merge_adapters()
    return model


@dataclass(frozen=True)
class DraftRule:
    """How many tokens the runtime drafts after the base's own token: up to
    `n_max`, each while the stop head's "go on" probability before it is at
    least `confidence` (None: not gated by it) and the micro decoder's
    probability of it at least `p_min` (None: not gated by it)."""

    n_max: int = 3
    confidence: float | None = None
    p_min: float | None = None
    ngram: int | None = None

    def __str__(self) -> str:
        gates = [f"n_max {self.n_max}"] + ([f"ngram-simple n {self.ngram} first"] if self.ngram else [])
        if self.confidence is not None:
            gates.append(f"stop head >= {self.confidence:g}")
        if self.p_min is not None:
            gates.append(f"p >= {self.p_min:g}")
        return ", ".join(gates)


@dataclass(frozen=True)
class TreeRule:
    """A tree of `nodes` drafted tokens that one base forward verifies
    (greedy: the base keeps the deepest node whose path equals its own
    tokens): the micro decoder's chain of up to `n_max` tokens (its most
    likely token at each micro step) and the likeliest alternatives to
    them, `nodes` in all, taken best-first by the micro decoder's
    probability of the path to each. An alternative is a sibling of a chain
    token, read from the same micro step's distribution, so a tree costs
    no more micro steps than the chain; nothing is drafted after it. The
    verify forward reads one row per node, each attending only its own
    path (a tree mask), as EAGLE-2's dynamic trees do."""

    nodes: int
    n_max: int = 3

    def __str__(self) -> str:
        return f"tree of {self.nodes}, n_max {self.n_max}"


@dataclass
class Drafts:
    """The micro decoder's drafts at N rows: `tokens` [N, S], each one's
    probability `p` [N, S] and the stop head's "go on" probability before
    it `go_on` [N, S] (micro step s reads out_s: the base's final features
    for s = 0); and at each micro step the next most likely tokens after
    the drafted one, `alternatives` [N, S, A], with their probabilities
    `alternative_p` [N, S, A] (A may be 0)."""

    tokens: torch.Tensor
    p: torch.Tensor
    go_on: torch.Tensor
    alternatives: torch.Tensor
    alternative_p: torch.Tensor

    def lengths(self, rule: DraftRule) -> torch.Tensor:
        """How many of each row's drafts `rule` lets through, [N]."""
        ok = torch.ones_like(self.p, dtype=torch.bool)[:, : rule.n_max]
        if rule.confidence is not None:
            ok &= self.go_on[:, : rule.n_max] >= rule.confidence
        if rule.p_min is not None:
            ok &= self.p[:, : rule.n_max] >= rule.p_min
        return ok.long().cumprod(1).sum(1)


Lookup = Callable[[list[list[int]]], torch.Tensor]
"""Copy candidates during drafting: given each row's drafts so far, the
candidates [N, M] of the last token fed to the micro decoder (`copying`)."""


@torch.no_grad()
def draft(model: HAMburger, feats: torch.Tensor, t0: torch.Tensor, n: int, lookup: Lookup | None = None,
          alternatives: int = 0) -> Drafts:
    """The micro decoder's `n` drafts from features `feats` [N, F, D] after
    the base's tokens `t0` [N], each from the ones before (as the runtime
    drafts: autoregressive, greedy), with the `alternatives` next most
    likely tokens at each micro step; a head with copy candidates looks
    them up with `lookup` (required then)."""
    tokens = t0[:, None]
    drafted, probs, go_on = [], [], [torch.sigmoid(-model.stop_head(feats[:, -1]))]
    alts, alt_p = [], []
    copies = [] if model.copy_proj is not None else None
    for s in range(n):
        if copies is not None:
            copies.append(lookup(tokens[:, 1:].tolist()).to(tokens.device))
        fed = torch.stack(copies, 1) if copies is not None else None
        out = model.micro_decode(feats, tokens, fed)[:, -1]
        probs_all = F.softmax(model.logits(out), -1)
        top_p, top = probs_all.topk(min(1 + alternatives, probs_all.shape[-1]), -1)
        p, d = top_p[:, 0], top[:, 0]
        drafted.append(d)
        probs.append(p)
        alts.append(top[:, 1:])
        alt_p.append(top_p[:, 1:])
        if s + 1 < n:
            go_on.append(torch.sigmoid(-model.stop_head(out)))
        tokens = torch.cat([tokens, d[:, None]], 1)
    return Drafts(torch.stack(drafted, 1), torch.stack(probs, 1), torch.stack(go_on, 1), torch.stack(alts, 1),
                  torch.stack(alt_p, 1))


def ngram_draft(context: list[int], n: int, k: int) -> list[int]:
    """llama.cpp's `ngram-simple` draft: the (up to) `k` tokens that followed
    the latest earlier occurrence of the last `n` tokens of `context`
    (prompt and answer so far); none where they did not occur before."""
    if len(context) <= n:
        return []
    key = context[-n:]
    for end in range(len(context) - 1, n - 1, -1):
        if context[end - n:end] == key:
            return context[end:end + k]
    return []


def accepted(drafts: torch.Tensor, text: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """How many of each row's first `lengths` drafts [N, S] agree with the
    text's tokens after it `text` [N, S] (-1 past the text's end), as a
    prefix: the tokens the base accepts."""
    s = torch.arange(drafts.shape[1])[None]
    return ((drafts == text) & (s < lengths[:, None])).long().cumprod(1).sum(1)


def tree_accepted(d: Drafts, text: torch.Tensor, rule: TreeRule) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's accepted drafts [N] under the tree `rule` (the text's
    tokens after the row `text` [N, S], -1 past its end), and the tree's
    size there [N] (its nodes within the text's room). A node is accepted
    when its path equals the text; the chain goes on past an accepted chain
    token only, an accepted alternative ends the path."""
    levels = min(rule.n_max, d.tokens.shape[1])
    tokens = torch.cat([d.tokens[:, :levels, None], d.alternatives[:, :levels]], 2)  # [N, L, 1 + A]
    chain_p = d.p[:, :levels]
    before = torch.cat([torch.ones_like(chain_p[:, :1]), chain_p.cumprod(1)[:, :-1]], 1)
    score = (torch.cat([chain_p[:, :, None], d.alternative_p[:, :levels]], 2) * before[:, :, None]).flatten(1)
    chosen = torch.zeros_like(score, dtype=torch.bool)
    chosen.scatter_(1, score.topk(min(rule.nodes, score.shape[1]), 1).indices, True)
    chosen = chosen.reshape(tokens.shape)
    # A node's parent (the chain token before its level) is in the tree too, whatever ties topk broke.
    chain_in = chosen[:, :, 0].long().cumprod(1).bool()
    chosen &= torch.cat([torch.ones_like(chain_in[:, :1]), chain_in[:, :-1]], 1)[:, :, None]
    text = text[:, :levels]
    chain_right = torch.cat([torch.ones_like(text[:, :1], dtype=torch.bool),
                             (d.tokens[:, :levels] == text).long().cumprod(1).bool()[:, :-1]], 1)
    hit = (chosen & (tokens == text[:, :, None])).any(2) & chain_right
    room = (text >= 0).sum(1)
    inside = torch.arange(levels)[None] < room[:, None]
    return hit.long().cumprod(1).sum(1), (chosen & inside[:, :, None]).sum((1, 2))


@dataclass
class Acceptance:
    """What a draft rule earns on a set of answers. Along the runtime's own
    path (a base forward after the last accepted row each time, drafting
    there): the base `forwards`, those that verified a draft
    (`verify_forwards`, the runtime's count), accepted drafts per forward and
    per verify forward, drafted tokens per forward. Over every row (`all_*`,
    each row drafting as if verified there; None for the runtime's gate,
    whose decisions depend on the path): accepted and drafted tokens per row."""

    rule: str
    forwards: int
    verify_forwards: int
    accepted_per_forward: float
    accepted_per_verify_forward: float
    drafted_per_forward: float
    rows: int
    all_accepted: float | None
    all_drafted: float | None


def text_after(cache: Cache, rows: torch.Tensor, n: int) -> torch.Tensor:
    """The text's `n` tokens after each of `rows` [N] (-1 past the answer's end), [N, n]."""
    at = rows[:, None] + 1 + torch.arange(n)[None]
    inside = at < cache.end[rows][:, None]
    return torch.where(inside, cache.next[at.clamp(max=len(cache.next) - 1)], torch.full_like(at, -1))


def draftable(cache: Cache, end_tokens: list[int]) -> torch.Tensor:
    """The rows a verify forward follows: the base's token there is not an
    end token and the text goes on after it."""
    rows = torch.arange(len(cache.next))
    is_end = torch.isin(cache.next, torch.tensor(end_tokens))
    return rows[~is_end & (rows + 1 < cache.end)]


@torch.no_grad()
def measure(model: HAMburger, cache: Cache, rules: list[DraftRule | GatedRule | TreeRule], batch: int = 256,
            prompts: dict[str, list[int]] | None = None) -> list[Acceptance]:
    """Accepted tokens per verify forward of each rule on every answer of
    `cache`: the drafts of every row once (the longest any rule drafts,
    with as many alternatives as the largest tree could take), then each
    rule's walk along each answer from the prompt's last row. A rule with
    `ngram`, and a head with copy candidates, look up each answer's prompt
    ids in `prompts` (by the answer's id) and the answer so far."""
    n = max(r.n_max for r in rules)
    alternatives = max([r.nodes - 1 for r in rules if isinstance(r, TreeRule)], default=0)
    rows = draftable(cache, model.cfg.eos)
    texts = row_texts(cache, prompts or {}, model.copy_longest()) if model.copy_proj is not None else None
    out: list[Drafts] = []
    for i in range(0, len(rows), batch):
        r = rows[i:i + batch]
        lookup = None
        if texts is not None:
            at = [texts[int(x)] for x in r]

            def lookup(tails: list[list[int]], at=at) -> torch.Tensor:
                """Each row's candidates after its drafts so far."""
                return torch.tensor([index.candidates(length, tail) for (index, length), tail in zip(at, tails)])
        out.append(draft(model, cache.features[r].float(), cache.next[r], n, lookup, alternatives))
    d = Drafts(*(torch.cat([getattr(o, f.name) for o in out]) for f in fields(Drafts)))
    text = text_after(cache, rows, n)
    room = (text >= 0).sum(1)
    where = {int(r): i for i, r in enumerate(rows)}
    results = []
    for rule in rules:
        if isinstance(rule, GatedRule):
            counts = walk_gated(model, cache, rule, d, text, room, where)
            every = (None, None)
        elif isinstance(rule, TreeRule):
            acc, size = tree_accepted(d, text, rule)
            counts = walk(cache, where, lambda i: (int(size[i]), int(acc[i])))
            every = (acc.sum().item() / max(len(rows), 1), size.sum().item() / max(len(rows), 1))
        else:
            tokens, lengths = d.tokens, d.lengths(rule)
            if rule.ngram:
                tokens, lengths = with_ngram_drafts(cache, rows, prompts or {}, rule, tokens, lengths)
            lengths = lengths.clamp(max=room)
            acc = accepted(tokens, text, lengths)
            counts = walk(cache, where, lambda i: (int(lengths[i]), int(acc[i])))
            every = (acc.sum().item() / max(len(rows), 1), lengths.sum().item() / max(len(rows), 1))
        forwards, verifies, taken, drafted = counts
        results.append(Acceptance(str(rule), forwards, verifies, taken / max(forwards, 1), taken / max(verifies, 1),
                                  drafted / max(forwards, 1), len(rows), *every))
    return results


def row_texts(cache: Cache, prompts: dict[str, list[int]], longest: int) -> list[tuple[TextIndex, int]]:
    """For every row of `cache`, its answer's text (the prompt's ids from
    `prompts`, then the answer's tokens) indexed for copy candidates of
    n-grams up to `longest`, and the length of the text up to the row's
    token: what the runtime has looked up in when it drafts there."""
    out = []
    nxt = cache.next.tolist()
    for a in cache.answers:
        prompt = prompts.get(a["id"])
        if prompt is None:
            raise SystemExit(f"drafting: no prompt ids for answer {a['id']}: copy candidates need the text")
        index = TextIndex(list(prompt) + nxt[a["start"]:a["start"] + a["rows"]], sizes_of(longest))
        out += [(index, len(prompt) + k + 1) for k in range(a["rows"])]
    return out


def attach_copies(cache: Cache, prompts: dict[str, list[int]], longest: int, n: int) -> None:
    """Sets `cache.copies` [R, n, M]: the copy candidates of the `n` tokens
    the micro decoder reads at each row, teacher-forced (`copying.teacher_forced`)."""
    parts, texts = [], row_texts(cache, prompts, longest)
    for a in cache.answers:
        index, length = texts[a["start"]]
        parts.append(teacher_forced(index, length - 1, a["rows"], n))
    cache.copies = torch.cat(parts).to(cache.next.device)


def with_ngram_drafts(cache: Cache, rows: torch.Tensor, prompts: dict[str, list[int]], rule: DraftRule,
                      tokens: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The drafts `tokens` [N, S] and their `lengths` [N] at `rows`, with
    `rule`'s n-gram drafts (`ngram_draft` on the prompt and the answer up to
    each row's token) in place of the micro decoder's wherever there is one."""
    tokens, lengths = tokens.clone(), lengths.clone()
    at = {int(r): i for i, r in enumerate(rows)}
    nxt = cache.next.tolist()
    for a in cache.answers:
        context = list(prompts.get(a["id"], []))
        for r in range(a["start"], a["start"] + a["rows"]):
            context.append(nxt[r])
            i = at.get(r)
            found = ngram_draft(context, rule.ngram, rule.n_max) if i is not None else []
            if found:
                tokens[i, :len(found)] = torch.tensor(found)
                lengths[i] = len(found)
    return tokens, lengths


def walk(cache: Cache, where: dict[int, int], step: Callable[[int], tuple[int, int]],
         start: Callable[[], None] = lambda: None) -> tuple[int, int, int, int]:
    """Walks every answer as the runtime decodes it: a base forward after
    the base's token at row r, whose draft (`step(index of r)`: drafted,
    accepted) moves r past the accepted drafts and the base's own next token;
    `start` is called before each answer. A walk ends at its answer's end,
    even where the accepted drafts reach it (the next row is another
    answer's first). Returns the forwards, those with a draft, the accepted
    and the drafted tokens."""
    forwards = verifies = taken = drafted = 0
    for a in cache.answers:
        start()
        r, end = a["start"], a["start"] + a["rows"]
        while r < end and r in where:
            n, k = step(where[r])
            forwards, verifies, taken, drafted = forwards + 1, verifies + (n > 0), taken + k, drafted + n
            r += 1 + k
    return forwards, verifies, taken, drafted


def walk_gated(model: HAMburger, cache: Cache, rule: GatedRule, d: Drafts, text: torch.Tensor, room: torch.Tensor,
               where: dict[int, int]) -> tuple[int, int, int, int]:
    """`walk` with the runtime's gate deciding each draft's length (a new
    gate per answer, as per sequence), taught by each verification."""
    cost = draft_cost(model.cfg)
    gate = [DraftGate(cost)]
    tokens, probs, p_stops = d.tokens.tolist(), d.p.tolist(), (1 - d.go_on).tolist()
    t0s, rooms, texts = cache.next.tolist(), room.tolist(), text.tolist()
    rows = sorted(where, key=where.get)

    def step(i: int) -> tuple[int, int]:
        """The gate's draft at row index i, verified against the text."""
        n, before = gate[0].draft(rule, tokens[i], probs[i], p_stops[i], t0s[rows[i]], rooms[i], model.cfg.eos)
        k = 0
        while k < n and tokens[i][k] == texts[i][k]:
            k += 1
        gate[0].record(before, k)
        return n, k

    def start() -> None:
        gate[0] = DraftGate(cost)

    return walk(cache, where, step, start)
