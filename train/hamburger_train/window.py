"""`window`: a whole training run inside one window on a GPU machine.

Such a machine is lent for minutes at a time, has PyTorch but neither this
runtime nor a network, and takes what `pack` made here (the base's GGUF, its
side files, the modules to start from, the prompts as token ids, and the
answers of earlier windows). In one call, against one clock (`--minutes`):

1. the base checkpoint from the GGUF (`gguf.base_state`);
2. the base's greedy answers and their scores (`generate`), earlier
   windows' answers scored teacher-forced first, then new prompts answered,
   until `--answer-share` of the time is spent;
3. the answers cut into macro steps (`segment.write_segments`);
4. training from `--init` (the shipped modules, or the last window's) until
   the steps are done or the clock leaves only the export's time;
5. calibration on held-out answers, export.

What comes back (`--out`, within the device's return limits): the trained
`grafted.safetensors` split in parts under 16 MiB, every answer's ids
(`answers.jsonl.gz`, so the next window scores them instead of answering
again; an earlier window's answers the clock left unscored among them),
`history.json` and `window.json` (what was done, in how long). Each part is
written as soon as it exists, so a window cut short still returns its
answers, and the next window goes on from them.
"""

from __future__ import annotations

import gzip
import json
import shutil
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from . import calibrate, export, generate, gguf, records, segment, train
from .model import HAMburger
from .state import load_segments, train_dir

SIDE_FILES = export.SIDE_FILES
PART_BYTES = 15 * 1024 * 1024
"""The largest part a returned file is split into (the device returns files of at most 16 MiB)."""
EXPORT_RESERVE_S = 45.0
"""Seconds the clock keeps for calibration, export and the returned files after training."""


def read_gz_lines(path: Path) -> list[dict]:
    """The records of a gzipped JSON-lines file (none when it does not exist)."""
    if not path.exists():
        return []
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def base_checkpoint(pack: Path, work: Path) -> Path:
    """`work/base`: the pack's GGUF base with the grafted modules of its
    `init.safetensors` (the base's own layers stay the GGUF's: the teacher
    is the base alone), and the base's side files."""
    out = work / "base"
    if (out / "model.safetensors").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    sd = gguf.base_state(pack / "base.gguf")
    init = load_file(str(pack / "init.safetensors"))
    sd |= {k: v.float() for k, v in init.items() if not k.startswith("model.")}
    for f in SIDE_FILES:
        shutil.copyfile(pack / f, out / f)
    export.write_safetensors(sd, out / "model.safetensors")
    return out


def answer_ids(work: Path) -> list[dict]:
    """Every scored answer's ids (`id`, `split`, `answer`): what the next window scores instead of answering."""
    return [{"id": v["id"], "split": v["split"], "answer": v["ids"][v["n_prompt"]:]}
            for v in records.read(work / "scored.jsonl")]


def write_gz_lines(rows: list[dict], path: Path) -> None:
    """Writes JSON lines gzipped, atomically."""
    tmp = path.with_suffix(".part")
    with gzip.open(tmp, "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    tmp.replace(path)


def split_file(path: Path, out: Path) -> list[Path]:
    """`path` cut into `out/NAME.part-NN` files of at most `PART_BYTES` (joined again with `cat`)."""
    for old in out.glob(path.name + ".part-*"):
        old.unlink()
    parts, data = [], path.read_bytes()
    for i in range(0, max(len(data), 1), PART_BYTES):
        p = out / f"{path.name}.part-{i // PART_BYTES:02d}"
        p.write_bytes(data[i:i + PART_BYTES])
        parts.append(p)
    return parts


def check_pack(pack: Path) -> None:
    """A pack that lacks a file (a folder not staged, a piece missing) is a
    one-line error naming the file and what to do."""
    for name in ("base.gguf", "init.safetensors", "prompt-ids.jsonl.gz", *SIDE_FILES):
        if not (pack / name).is_file():
            pieces = sorted(pack.glob(name + ".piece-*"))
            what = f"{len(pieces)} of its pieces, not all" if pieces else "it is missing"
            raise SystemExit(f"window: {pack / name}: {what}; stage every folder of the pack (window.sh stage) "
                             "before window.sh run")


class Clock:
    """A window's clock, `minutes` from its making, and its summary, written
    anew to `path` at every `note`, so a window cut short says how far it got."""

    def __init__(self, minutes: float, path: Path):
        self.start = time.monotonic()
        self.end = self.start + minutes * 60
        self.path = path
        self.summary: dict = {"minutes": minutes, "device": str(torch.get_default_device())}

    def note(self, **kv) -> None:
        """Adds `kv` and the seconds elapsed to the summary, and writes it."""
        self.summary.update(kv, elapsed_s=round(time.monotonic() - self.start, 1))
        self.path.write_text(json.dumps(self.summary, indent=1) + "\n")


def start(pack: Path, work: Path, out: Path, minutes: float, summary: str) -> Clock:
    """A window's start: the pack checked whole, the folders made, the clock
    started with its summary in `out/summary`."""
    check_pack(pack)
    work.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    return Clock(minutes, out / summary)


def run(pack: Path, work: Path, out: Path, minutes: float, answer_share: float, max_tokens: int,
        answer_batch: int, train_args: dict, ratio: float, min_entropy: float) -> None:
    """The window's steps (the module's list), against a clock of `minutes`;
    training starts from `train_args["init"]`, by default the pack's `init.safetensors`."""
    clock = start(pack, work, out, minutes, "window.json")
    note = clock.note
    base = base_checkpoint(pack, work)
    note(base="built")
    prompts = read_gz_lines(pack / "prompt-ids.jsonl.gz")
    earlier = {r["id"]: r["answer"] for r in read_gz_lines(pack / "answers.jsonl.gz")}
    teacher = HAMburger.from_checkpoint(base)
    teacher.eval()
    known = [r for r in prompts if r["id"] in earlier]
    answering_ends = clock.start + answer_share * minutes * 60
    generate.run(work, teacher, known, max_tokens, answer_batch, forced=earlier, deadline=answering_ends)
    generate.run(work, teacher, prompts, max_tokens, answer_batch, deadline=answering_ends)
    del teacher
    answers = answer_ids(work)
    scored = {a["id"] for a in answers}
    # an earlier window's answers the clock left unscored go back too: nothing answered is lost
    carried = [{"id": r["id"], "split": r["split"], "answer": earlier[r["id"]]} for r in known if r["id"] not in scored]
    write_gz_lines(answers + carried, out / "answers.jsonl.gz")
    note(answered=len(answers), answer_tokens=sum(len(a["answer"]) for a in answers), carried=len(carried))
    segment.write_segments(work, json.loads((base / "hamburger.json").read_text())["max_steps"], ratio, min_entropy)
    train_args = train_args | {"init": train_args.get("init") or pack / "init.safetensors"}
    segments = load_segments(work, "train", "heldout")  # read once for training and calibration
    train.run(work, base, deadline=clock.end - EXPORT_RESERVE_S, segments=segments, **train_args)
    st = torch.load(train_dir(work) / "state.pt", weights_only=False, map_location="cpu")
    note(steps=st["step"], seen_tokens=st["history"][-1]["seen_tokens"] if st["history"] else 0)
    if calibrate.calibration_rows(segments[1]):
        calibrate.run(work, base, refit=False, held=segments[1])
    else:
        print("window: no held-out answers outside the evaluation prompts, so the stop head is not calibrated",
              file=sys.stderr)
    export.run(work, base, work / "export")
    note(parts=[p.name for p in split_file(work / "export" / "grafted.safetensors", out)])
    shutil.copyfile(train_dir(work) / "history.json", out / "history.json")
    note(done=True)

