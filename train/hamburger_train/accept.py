"""`accept`: accepted tokens per verify forward of a grafted file's micro
decoder as a draft head, on a prompt set, with the runtime's draft rules.

The verifier (the base with the file's base layers and adapters folded in,
`drafting.verifier`) answers every prompt greedily through
`hamburger-server` at confidence > 1, exactly as self-verified greedy
decoding answers it; `hamburger-eval tokenize` gives the answer's token
ids; the verifier's features at one token per entry and its most likely
tokens are cached (`features`); `drafting.measure` then walks each answer as the runtime
would: at each verify forward the micro decoder drafts from the last
accepted row, and the base accepts the drafts that equal its own tokens.
Everything lives in `WORK/accept/<prompt file's stem>/` and is made once
per base: measuring another file of the same base reuses it.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from dataclasses import asdict
from pathlib import Path

from . import data, features, records, segment
from .draft import rules_of, verifier_gguf
from .drafting import DraftRule, TreeRule, measure, verifier
from .export import write_checkpoint
from .model import HAMburger


def run(work: Path, bin_dir: Path, base: Path, grafted: Path | None, prompts: Path, max_tokens: int, slots: int,
        threads: int, confidences: list[float], p_mins: list[float], as_json: bool,
        with_runtime: bool = False, head: Path | None = None, ngrams: list[int] | None = None,
        trees: list[int] | None = None) -> None:
    """Measures `grafted` (default: the work directory's `draft` result),
    with the draft head alone in `head` when given, on the prompts of
    `prompts` (JSON lines with `id` and `prompt`); with `with_runtime` also
    the runtime's self-verified greedy decoding of the same prompts
    (`runtime`) on that model as a GGUF (`runtime_gguf`); for each size in
    `ngrams`, also every draft with the context's n-grams drafting first
    (with `with_runtime`, the runtime's too: every draft, and its gate); for
    each size in `trees`, also a tree of that many drafts at every verify
    forward (`TreeRule`; with `with_runtime`, the runtime's too,
    `--spec-draft-tree`, beside the tool's walk of the texts it wrote)."""
    grafted = grafted or work / "draft" / "grafted.safetensors"
    if any(n < 1 for n in ngrams or []):
        raise SystemExit(f"accept: --ngram {','.join(map(str, ngrams))}: n-gram sizes are 1 or more")
    if any(n < 1 for n in trees or []):
        raise SystemExit(f"accept: --tree {','.join(map(str, trees))}: a tree has 1 draft or more")
    if not grafted.exists():
        raise SystemExit(f"accept: {grafted} does not exist (run draft first, or give --grafted)")
    try:
        rows = records.read(prompts)
        rows = [{"id": r["id"], "prompt": r["prompt"], "split": "heldout"} for r in rows]
    except (OSError, KeyError, TypeError) as e:
        raise SystemExit(f"accept: {prompts}: not JSON lines with id and prompt ({e})") from None
    if not rows:
        raise SystemExit(f"accept: {prompts} holds no prompts")
    model = verifier(base, grafted, "accept", head)
    if with_runtime and model.copy_proj is not None:
        raise SystemExit("accept: --runtime converts the measured head in the original layout, which has no copy "
                         "matrix: measure the runtime with hamburger-eval run --spec-type draft-mtp")
    meta = features.meta_of(model, base)
    teacher = verifier_gguf(work, bin_dir, base, model, meta, "accept")
    here = work / "accept" / prompts.stem
    here.mkdir(parents=True, exist_ok=True)
    data.answer(here / "responses.jsonl", bin_dir, teacher, rows, max_tokens, slots, threads)
    segment.tokenize(here, bin_dir, teacher)
    features.build(here / "features", model, base, records.read(here / "tokens.jsonl"))
    cache = features.load(here / "features", meta)
    n_max = model.cfg.max_steps - 1
    rules = rules_of(confidences, p_mins, n_max) + [DraftRule(n_max, None, None, n) for n in ngrams or []]
    rules += [TreeRule(n, n_max) for n in trees or []]
    prompts_ids = {r["id"]: r["ids"][:r["n_prompt"]] for r in records.read(here / "tokens.jsonl")}
    results = measure(model, cache, rules, prompts=prompts_ids)
    report = {"grafted": str(grafted), "head": head and str(head), "prompts": str(prompts),
              "answers": len(cache.answers), "tokens": len(cache.next), "rules": [asdict(r) for r in results]}
    if with_runtime:
        tokenized = {r["id"]: r for r in records.read(here / "tokens.jsonl")}
        walked = [tokenized[a["id"]] for a in cache.answers]
        with tempfile.TemporaryDirectory(dir=here) as tmp:
            gguf = runtime_gguf(bin_dir, model, base, Path(tmp))
            fixed, texts = runtime(bin_dir, gguf, walked, 0.0, threads, fixed=n_max)
            report["runtime"] = [fixed] + [runtime(bin_dir, gguf, walked, p, threads)[0] for p in sorted({0.0, *p_mins})]
            report["runtime"] += [runtime(bin_dir, gguf, walked, 0.0, threads, f, n)[0]
                                  for n in ngrams or [] for f in (n_max, None)]
            tree_runs = [(n, runtime(bin_dir, gguf, walked, 0.0, threads, n_max, tree=n)) for n in trees or []]
        # The tool's walk of the very texts the runtime wrote with n_max drafts at every verify forward.
        own = measure(model, features.in_memory(model, texts), [DraftRule(n_max, None, None)])[0]
        report["runtime_texts"] = asdict(own)
        # And of the texts it wrote with each tree, beside its own counts.
        report["runtime_trees"] = [
            {"runtime": ours, "tool": asdict(measure(model, features.in_memory(model, t), [TreeRule(n, n_max)])[0])}
            for n, (ours, t) in tree_runs]
    if as_json:
        print(json.dumps(report))
        return
    print(f"{grafted} on {len(cache.answers)} answers of {prompts} ({len(cache.next)} tokens)\n")
    print("| draft rule | base forwards | verify forwards | accepted per base forward | per verify forward "
          "| drafted per base forward | every row: accepted | drafted |\n"
          "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        every = " | ".join("-" if x is None else f"{x:.3f}" for x in (r.all_accepted, r.all_drafted))
        print(f"| {r.rule} | {r.forwards} | {r.verify_forwards} | {r.accepted_per_forward:.3f} "
              f"| {r.accepted_per_verify_forward:.3f} | {r.drafted_per_forward:.3f} | {every} |")
    if "runtime_texts" in report:
        r = report["runtime_texts"]
        print(f"| `accept` on the runtime's own texts, {r['rule']} | {r['forwards']} | {r['verify_forwards']} "
              f"| {r['accepted_per_forward']:.3f} | {r['accepted_per_verify_forward']:.3f} "
              f"| {r['drafted_per_forward']:.3f} | | |")
    for r in report.get("runtime", []) + [t["runtime"] for t in report.get("runtime_trees", [])]:
        print(f"| runtime (Q8_0), {r['rule']}, p >= {r['p_min']:g}: same text {r['same_text']}/{r['answers']}, "
              f"shared prefix {r['shared_prefix']:.1f} "
              f"| {r['forwards']} | {r['verify_forwards']} | {r['accepted_per_forward']:.3f} "
              f"| {r['accepted_per_verify_forward']:.3f} | {r['drafted_per_forward']:.3f} | | |")


def runtime_gguf(bin_dir: Path, model: HAMburger, base: Path, tmp: Path) -> Path:
    """The measured model as the runtime loads it: its original layout
    converted as the teacher is (`data.teacher_gguf`, Q8_0), so the runtime
    verifies with the very base weights that answered the prompts."""
    write_checkpoint(model, base, tmp)
    return data.teacher_gguf(bin_dir, tmp, tmp)


def runtime(bin_dir: Path, gguf: Path, answers: list[dict], p_min: float, threads: int,
            fixed: int | None = None, ngram: int | None = None,
            tree: int = 0) -> tuple[dict, list[tuple[str, list[int], int]]]:
    """The runtime's self-verified greedy decoding (`hamburger-cli
    --spec-type draft-mtp`, or with `ngram` `ngram-simple,draft-mtp` of that
    n-gram size; with `fixed`, exactly that many drafts at every
    verify forward, the ungated rule of that n_max, which `measure` walks
    alike, and with `tree` a tree of that many drafts (`--spec-draft-tree`,
    `TreeRule`'s); else the runtime's own gate, which prices drafts by the times it
    measures and so follows the machine, not `gate.py`) of each answer's prompt ids, as many tokens as
    the answer has before the end-of-turn token `tokenize` ends it with: its
    drafts, accepted drafts and verify forwards summed (the CLI's timings),
    its base forwards (one per committed token not accepted as a draft), how
    many outputs equal the answers, and the mean length of the prefix they
    share (greedy outputs part at near-ties: a forward of several rows sums
    in another order than one of one row); and the texts it wrote (`id`,
    prompt and output ids, prompt length), for `measure` to walk."""
    drafted = accepted = verifies = forwards = same = shared = 0
    texts = []
    for a in answers:
        ids, n_prompt = a["ids"], a["n_prompt"]
        answer = ids[n_prompt:-1]
        cmd = [str(bin_dir / "hamburger-cli"), "-m", str(gguf), "--prompt-ids", ",".join(map(str, ids[:n_prompt])),
               "-n", str(len(answer)), "--temp", "0", "--json", "-t", str(threads), "--spec-draft-p-min", str(p_min)]
        cmd += ["--spec-type", "ngram-simple,draft-mtp", "--spec-ngram-simple-size-n", str(ngram)] if ngram \
            else ["--spec-type", "draft-mtp"]
        if fixed is not None:
            cmd += ["--spec-draft-n-min", str(fixed), "--spec-draft-n-max", str(fixed)]
        if tree:
            cmd += ["--spec-draft-tree", str(tree)]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(f"accept: {cmd[0]} failed: {out.stderr.strip().splitlines()[-1:]}")
        v = json.loads(out.stdout.strip().splitlines()[-1])
        t, got = v["timings"], v["output_ids"]
        texts.append((a["id"], ids[:n_prompt] + got, n_prompt))
        drafted, accepted, verifies = drafted + t["draft_n"], accepted + t["draft_n_accepted"], verifies + t["verify_forwards"]
        forwards += len(got) - 1 - t["draft_n_accepted"]
        k = next((i for i, (x, y) in enumerate(zip(got, answer)) if x != y), min(len(got), len(answer)))
        same += k == len(answer)
        shared += k
    n = max(len(answers), 1)
    rule = (f"n_max {fixed}" if fixed is not None else "gate") + (f", ngram-simple n {ngram} first" if ngram else "")
    rule = f"tree of {tree}, {rule}" if tree else rule
    return {"rule": rule, "p_min": p_min, "answers": len(answers),
            "same_text": same, "shared_prefix": shared / n,
            "forwards": forwards, "verify_forwards": verifies, "accepted_per_forward": accepted / max(forwards, 1),
            "accepted_per_verify_forward": accepted / max(verifies, 1),
            "drafted_per_forward": drafted / max(forwards, 1)}, texts
