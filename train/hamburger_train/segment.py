"""`segment`: the paper's segmentation of each answer into macro steps.

The base scores every answer (`hamburger-eval score`: our tokenizer and chat
template, libllama on the base-only GGUF): the entropy of its next-token
distribution at each answer token (`scored.jsonl`, resumable). The answers
are then cut into macro steps by the original implementation's "decreasing"
family of strategies: a step starts at a token and goes on, up to
`max_steps` tokens, while each following token's entropy is at most `ratio`
times the largest entropy in the step so far (or below `min_entropy`, which
the original's `decreasing_v2` adds). So a step is one token the base is
unsure of followed by tokens it is much surer of: what the micro-step decoder
can predict. The paper's plain "decreasing" (ratio 0.3 against the first
token, no floor) is `--ratio 0.3 --min-entropy 0`. The same pass keeps the
base's `TOP` most likely tokens at every answer token, the soft targets of
`train`. Output: `segments.jsonl` (id, split, ids, n_prompt, steps and the
top tokens in either of `scores`' forms),
rewritten from `scored.jsonl` each run, so another strategy costs no scoring.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from . import records, scores
from .progress import Progress

TOP = 8  # the base's most likely tokens kept per answer token: the soft targets `train` distils


def decreasing(values: list[float], max_steps: int, ratio: float, min_entropy: float) -> list[int]:
    """Step lengths (summing to len(values)): a token joins the current step
    while the step has room and its entropy is below `min_entropy` or at
    most `ratio` times the step's largest entropy so far."""
    steps: list[int] = []
    count, top = 0, -1.0
    for e in values:
        if count and count < max_steps and (e < min_entropy or e <= ratio * top):
            count += 1
            top = max(top, e)
        else:
            if count:
                steps.append(count)
            count, top = 1, e
    if count:
        steps.append(count)
    assert sum(steps) == len(values)
    return steps


def base_only_gguf(bin_dir: Path, base: Path, work: Path) -> Path:
    """The base checkpoint as a plain llama GGUF (Q8_0), the scorer libllama runs."""
    gguf = work / "base-q8_0.gguf"
    if not gguf.exists():
        subprocess.run([str(bin_dir / "hamburger-convert"), str(base), "--outfile", str(gguf), "--outtype", "q8_0",
                        "--base-only"], check=True, capture_output=True)
    return gguf


def score(work: Path, bin_dir: Path, teacher: Path, scorer: Path, threads: int) -> None:
    """Scores every answer of `work/responses.jsonl` not yet in
    `work/scored.jsonl` (`hamburger-eval score`: the `teacher` GGUF's
    tokenizer and chat template, the base-only `scorer` GGUF's entropies and
    `TOP` most likely tokens at every answer token)."""
    through_eval(work, work / "scored.jsonl", "segment: scoring",
                 ["score", "-m", str(teacher), "--baseline", str(scorer), "-t", str(threads), "--top", str(TOP)],
                 ("id", "split", "ids", "n_prompt", "entropy", "top"), bin_dir)


def tokenize(work: Path, bin_dir: Path, teacher: Path) -> None:
    """Every answer of `work/responses.jsonl` not yet in `work/tokens.jsonl`
    as `score` makes its ids (`hamburger-eval tokenize`: the `teacher`
    GGUF's tokenizer and chat template, the answer ended by the end-of-turn
    token) but unscored: `draft`'s answers, whose scores its features pass
    computes in the same forward."""
    through_eval(work, work / "tokens.jsonl", "tokenize", ["tokenize", "-m", str(teacher)],
                 ("id", "split", "ids", "n_prompt"), bin_dir)


def through_eval(work: Path, out_path: Path, label: str, args: list[str], fields: tuple[str, ...],
                 bin_dir: Path) -> None:
    """Passes every answer of `work/responses.jsonl` whose id `out_path` does
    not hold yet through `hamburger-eval ARGS`, appending each record it
    writes (its `fields`) as it comes: a stopped run keeps what it wrote."""
    done = records.done_ids(out_path)
    rows = records.read(work / "responses.jsonl")
    todo = [r for r in rows if r["id"] not in done]
    if not todo:
        return
    prog = Progress(label, len(rows), "tokens", initial=len(done))
    n = len(done)
    with tempfile.TemporaryFile("w+") as inp, open(out_path, "a") as out:
        inp.write("".join(json.dumps({k: r[k] for k in ("id", "split", "prompt", "messages", "response") if k in r})
                          + "\n" for r in todo))
        inp.seek(0)
        proc = subprocess.Popen([str(bin_dir / "hamburger-eval"), *args], stdin=inp, stdout=subprocess.PIPE, text=True)
        try:
            for line in proc.stdout:
                v = json.loads(line)
                out.write(json.dumps({k: v[k] for k in fields}) + "\n")
                out.flush()
                n += 1
                prog.update(n, len(v["ids"]) - v["n_prompt"])
        except BaseException:  # stopped: hamburger-eval goes too (what it wrote so far is kept)
            proc.kill()
            raise
        if proc.wait() != 0:
            raise RuntimeError(f"hamburger-eval {args[0]} exited with {proc.returncode}")
    prog.update(n, force=True)


def run(work: Path, bin_dir: Path, base: Path, threads: int, ratio: float, min_entropy: float) -> None:
    """Scores every answer not yet in `scored.jsonl`, then writes `segments.jsonl`."""
    from .data import teacher_gguf
    scored_path = work / "scored.jsonl"
    done = records.done_ids(scored_path)
    if any(r["id"] not in done for r in records.read(work / "responses.jsonl")):
        score(work, bin_dir, teacher_gguf(bin_dir, base, work), base_only_gguf(bin_dir, base, work), threads)
    write_segments(work, json.loads((base / "hamburger.json").read_text())["max_steps"], ratio, min_entropy)


def write_segments(work: Path, max_steps: int, ratio: float, min_entropy: float) -> None:
    """`segments.jsonl` from every scored answer of `work/scored.jsonl` (`decreasing`)."""
    tokens = steps_total = 0
    tmp = work / "segments.part"
    with open(tmp, "w") as out:
        for v in records.read(work / "scored.jsonl"):
            entropy = scores.entropy(v)
            steps = decreasing(entropy, max_steps, ratio, min_entropy)
            tokens, steps_total = tokens + len(entropy), steps_total + len(steps)
            row = {"id": v["id"], "split": v["split"], "ids": v["ids"], "n_prompt": v["n_prompt"], "steps": steps}
            row |= {k: v[k] for k in scores.TOP_FIELDS if k in v}  # as they came, in either form
            out.write(json.dumps(row) + "\n")
    tmp.replace(work / "segments.jsonl")
    print(f"segment: {tokens} answer tokens in {steps_total} macro steps "
          f"({tokens / max(steps_total, 1):.2f} tokens per step; ratio {ratio}, min entropy {min_entropy})",
          file=sys.stderr)
