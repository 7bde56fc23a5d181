"""`hamburger-train`: builds a trained HAMburger on the CPU, in resumable stages.

    hamburger-train data     --work DIR   # prompts from the stdlib, answered by the base (hamburger-server)
    hamburger-train segment  --work DIR   # the base's entropies -> macro steps ("decreasing")
    hamburger-train train    --work DIR   # merger, micro-step decoder and stop head
    hamburger-train calibrate --work DIR  # the stop head fitted on held-out answers (Platt scaling)
    hamburger-train diagnose --work DIR   # teacher-forced: what each kind of token and confidence costs the base
    hamburger-train export   --work DIR --out DIR   # the original checkpoint layout
    hamburger-train all      --work DIR --out DIR   # every stage, each resuming where it stopped
    hamburger-train greedy   --out CKPT --ids 1,2,3 # the runtime's greedy decoding of a checkpoint (a check)

Every stage reads and writes the work directory and skips what is done, so a
command interrupted at any moment continues when run again.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="hamburger-train", description=__doc__.split("\n\n")[0])
    p.add_argument("stage", choices=["data", "segment", "train", "calibrate", "diagnose", "export", "all", "greedy"])
    p.add_argument("--work", type=Path, help="work directory (resumable state); every stage but greedy")
    p.add_argument("--base", type=Path, help="base checkpoint directory (default: hamburger-testmodel smollm2)")
    p.add_argument("--bin", type=Path, default=ROOT / "target/release", help="the project's binaries")
    p.add_argument("--out", type=Path, help="export: the checkpoint directory to write")
    p.add_argument("--prompts", type=int, default=1167, help="data: the first N prompts (run 1 answered 1167; run 2 2600 with --skip 1167)")
    p.add_argument("--skip", type=int, default=0, help="data: answer prompts from this index on (new data after an earlier run)")
    p.add_argument("--max-tokens", type=int, default=192, help="data: most tokens per answer")
    p.add_argument("--slots", type=int, default=4, help="data: concurrent requests (server -np)")
    p.add_argument("--ratio", type=float, default=0.5, help="segment: entropy ratio to the step's largest")
    p.add_argument("--min-entropy", type=float, default=0.2, help="segment: entropy (nats) that always joins a step")
    p.add_argument("-t", "--threads", type=int, default=2, help="CPU threads")
    p.add_argument("--steps", type=int, default=480, help="train: optimizer steps in all")
    p.add_argument("--batch", type=int, default=4, help="train: sequences per optimizer step")
    p.add_argument("--lr", type=float, default=3e-4, help="train: peak learning rate")
    p.add_argument("--seed", type=int, default=0, help="train: seed")
    p.add_argument("--tune-layers", type=int, default=3, help="train: base layers fine-tuned (the first N; 0: frozen base)")
    p.add_argument("--lora-rank", type=int, default=0, help="train: rank of low-rank adapters on the base layers not tuned (0: none)")
    p.add_argument("--plain-weight", type=float, default=0.0, help="train: weight of the plain-input distillation (one answer per step fed token by token; 0: none)")
    p.add_argument("--micro-windows", action="store_true", help="train: the micro decoder and stop head learn the "
                   "up to 3 tokens after every step's first, not only the step's own (the stop head then ends steps)")
    p.add_argument("--init", type=Path, help="train: start from this grafted.safetensors (e.g. the shipped model's)")
    p.add_argument("--snapshot", type=int, help="export: the snapshot of this step instead of the latest state")
    p.add_argument("--ids", type=str, help="greedy: prompt token ids, comma-separated")
    p.add_argument("-n", type=int, default=32, help="greedy: new tokens")
    p.add_argument("--confidence", type=str, help="greedy: stop-head confidence (default 0.8); diagnose: "
                   "confidences, comma-separated (default 0.5,0.6,0.7,0.8,0.9)")
    p.add_argument("--grafted", type=Path, help="diagnose: this grafted.safetensors instead of the work directory's training state")
    p.add_argument("--json", action="store_true", help="diagnose: print JSON instead of tables")
    a = p.parse_args(argv)

    if a.stage != "greedy" and a.work is None:
        p.error(f"{a.stage} needs --work")
    if a.stage == "greedy" and (a.out is None or a.ids is None):
        p.error("greedy needs --out CHECKPOINT and --ids")
    import torch
    torch.set_num_threads(a.threads)
    from . import calibrate, data, diagnose, segment, train, export
    try:
        confidences = [float(x) for x in (a.confidence or ("0.8" if a.stage == "greedy" else "0.5,0.6,0.7,0.8,0.9")).split(",")]
    except ValueError:
        p.error(f"--confidence: not a number or a comma-separated list of numbers: {a.confidence!r}")
    if a.stage == "greedy" and len(confidences) != 1:
        p.error("greedy takes one --confidence")
    base = a.base or (None if a.stage == "greedy" else data.base_checkpoint(a.bin))
    if a.stage in ("data", "all"):
        data.run(a.work, a.bin, base, a.prompts, a.max_tokens, a.slots, a.threads, a.skip)
    if a.stage in ("segment", "all"):
        segment.run(a.work, a.bin, base, a.threads, a.ratio, a.min_entropy)
    if a.stage in ("train", "all"):
        train.run(a.work, base, steps=a.steps, batch=a.batch, lr=a.lr, seed=a.seed, tuned_layers=a.tune_layers, init=a.init,
                  lora_rank=a.lora_rank, plain_weight=a.plain_weight, windows=a.micro_windows)
    if a.stage == "calibrate":
        calibrate.run(a.work, base)
    if a.stage == "diagnose":
        diagnose.run(a.work, base, a.grafted, confidences, a.json)
    if a.stage in ("export", "all"):
        if a.out is None:
            p.error("export needs --out")
        export.run(a.work, base, a.out, a.snapshot)
    if a.stage == "greedy":
        from .model import HAMburger, greedy
        model = HAMburger.from_checkpoint(a.out)
        print(json.dumps({"macro_steps": greedy(model, [int(x) for x in a.ids.split(",")], a.n, confidences[0])}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
