"""`accept`: accepted tokens per verify forward of a grafted file's micro
decoder as a draft head, on a prompt set, with the runtime's draft rules.

The verifier (the base with the file's base layers and adapters folded in,
`drafting.verifier`) answers every prompt greedily through
`hamburger-server` at confidence > 1, exactly as self-verified greedy
decoding answers it; `hamburger-eval score` gives the answer's token ids;
the verifier's features at one token per entry are cached
(`features`); `drafting.measure` then walks each answer as the runtime
would: at each verify forward the micro decoder drafts from the last
accepted row, and the base accepts the drafts that equal its own tokens.
Everything lives in `WORK/accept/<prompt file's stem>/` and is made once
per base: measuring another file of the same base reuses it.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

from . import data, features, records, segment
from .draft import rules_of, verifier_ggufs
from .drafting import measure, verifier


def run(work: Path, bin_dir: Path, base: Path, grafted: Path | None, prompts: Path, max_tokens: int, slots: int,
        threads: int, confidences: list[float], p_mins: list[float], as_json: bool) -> None:
    """Measures `grafted` (default: the work directory's `draft` result) on
    the prompts of `prompts` (JSON lines with `id` and `prompt`)."""
    grafted = grafted or work / "draft" / "grafted.safetensors"
    if not grafted.exists():
        raise SystemExit(f"accept: {grafted} does not exist (run draft first, or give --grafted)")
    try:
        rows = records.read(prompts)
        rows = [{"id": r["id"], "prompt": r["prompt"], "split": "heldout"} for r in rows]
    except (OSError, KeyError, TypeError) as e:
        raise SystemExit(f"accept: {prompts}: not JSON lines with id and prompt ({e})") from None
    if not rows:
        raise SystemExit(f"accept: {prompts} holds no prompts")
    model = verifier(base, grafted, "accept")
    meta = features.meta_of(model, base)
    teacher, scorer = verifier_ggufs(work, bin_dir, base, model, meta, "accept")
    here = work / "accept" / prompts.stem
    here.mkdir(parents=True, exist_ok=True)
    data.answer(here / "responses.jsonl", bin_dir, teacher, rows, max_tokens, slots, threads)
    segment.score(here, bin_dir, teacher, scorer, threads)
    features.build(here / "features", model, base, records.read(here / "scored.jsonl"))
    cache = features.load(here / "features", meta)
    results = measure(model, cache, rules_of(confidences, p_mins, model.cfg.max_steps - 1))
    if as_json:
        print(json.dumps({"grafted": str(grafted), "prompts": str(prompts), "answers": len(cache.answers),
                          "tokens": len(cache.next), "rules": [asdict(r) for r in results]}))
        return
    print(f"{grafted} on {len(cache.answers)} answers of {prompts} ({len(cache.next)} tokens)\n")
    print("| draft rule | base forwards | verify forwards | accepted per base forward | per verify forward "
          "| drafted per base forward | every row: accepted | drafted |\n"
          "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        print(f"| {r.rule} | {r.forwards} | {r.verify_forwards} | {r.accepted_per_forward:.3f} "
              f"| {r.accepted_per_verify_forward:.3f} | {r.drafted_per_forward:.3f} | {r.all_accepted:.3f} "
              f"| {r.all_drafted:.3f} |")
