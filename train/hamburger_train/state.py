"""What the stages load and keep in a work directory: the segmented answers
(`segments.jsonl`, as `Answer`s) and the training state under `train/`
(`state.pt`: grafted weights, optimizer, step, history and the settings a
resumed run keeps; `history.json`; `snapshots/step-N.pt`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from . import records, scores
from .model import HAMburger


@dataclass
class Answer:
    """One segmented answer of `segments.jsonl`: its prompt and answer token
    ids (`ids`, the first `n_prompt` the prompt's), its macro steps' lengths,
    and when `segment` kept them the base's most likely tokens at each answer
    token (`top`: [n, TOP] ids and log-probabilities, most likely first) and
    the soft targets made of them (`soft`: those ids and their probabilities
    renormalised over them)."""

    id: str
    split: str
    ids: torch.Tensor
    n_prompt: int
    steps: list[int]
    top: tuple[torch.Tensor, torch.Tensor] | None
    soft: tuple[torch.Tensor, torch.Tensor] | None

    @staticmethod
    def of(row: dict) -> Answer:
        """The answer of one `segments.jsonl` record."""
        top = soft = None
        if scores.has_top(row):
            top = scores.top(row)
            soft = (top[0], torch.softmax(top[1], -1))
        return Answer(row["id"], row["split"], torch.tensor(row["ids"]), row["n_prompt"], row["steps"], top, soft)


def load_segments(work: Path, *splits: str) -> list[list[Answer]]:
    """The segmented answers of each of `splits` (those of two macro steps or
    more), from one read of `segments.jsonl` (hundreds of MB after a GPU
    window: a read is tens of seconds)."""
    rows = records.read(work / "segments.jsonl")
    return [[Answer.of(r) for r in rows if r["split"] == s and len(r["steps"]) >= 2] for s in splits]


def train_dir(work: Path) -> Path:
    """Where `train` keeps its state, curve and snapshots."""
    return work / "train"


def state_path(work: Path) -> Path:
    """The training state `train` resumes from and the later stages read."""
    return train_dir(work) / "state.pt"


def snapshot_path(work: Path, step: int) -> Path:
    """The grafted weights as they were after optimizer step `step`."""
    return train_dir(work) / "snapshots" / f"step-{step}.pt"


def save_state(path: Path, model: HAMburger, opt: torch.optim.Optimizer, step: int, history: list,
               windows: bool, base_lr_scale: float) -> None:
    """Writes the training state atomically, with the settings a resumed run keeps."""
    write_state(path, {"grafted": model.trained_state(), "opt": opt.state_dict(), "step": step, "history": history,
                       "tuned_layers": model.tuned_layers, "lora_rank": model.lora_rank, "windows": windows,
                       "base_lr_scale": base_lr_scale})


def write_state(path: Path, state: dict) -> None:
    """Writes a training state (`save_state`'s dict) atomically: a `.part` renamed into place."""
    tmp = path.with_suffix(".part")
    torch.save(state, tmp)
    tmp.replace(path)


def write_history(work: Path, history: list) -> None:
    """Writes the run's history (the training state's, one entry per log) as `history.json`."""
    (train_dir(work) / "history.json").write_text(json.dumps(history))


def load_trained(work: Path, base: Path, stage: str, snapshot: int | None = None) -> tuple[dict, HAMburger]:
    """`work`'s training state (`save_state`'s dict, or the snapshot of step
    `snapshot`) and its model on the base, for the stages that read a run
    (`stage` names the one that asks, in the error when there is none)."""
    path = state_path(work) if snapshot is None else snapshot_path(work, snapshot)
    if not path.exists():
        raise SystemExit(f"{stage}: {path} does not exist: run train first")
    st = torch.load(path, weights_only=False, map_location=torch.get_default_device())
    model = HAMburger.from_checkpoint(base, st.get("tuned_layers", 0), st.get("lora_rank", 0))
    model.load_original(st["grafted"], grafted_only=True)
    return st, model
