"""Answers kept across machines: a verifier's greedy answers stored in the
repository (`train/answers/`), so that the CPU hours spent answering outlive
the machine that spent them.

Answering is the dear part of a draft run on the CPU (80-190 answer tokens/s
on two cores, by prompt length: hours for a few thousand prompts), and a work
directory lives only as long as its machine. A corpus is one gzipped
JSON-lines file: a header line

    {"corpus": "hamburger-answers", "teacher": SHA, "tokenizer": SHA, "max_tokens": N}

(the answering base's weights and its tokenizer as `features.meta_of`
fingerprints them, and the token budget of every answer), then one line per
answer:

    {"id": ..., "asked": KEY, "response": ..., "finish_reason": ...}

where KEY is `asked_key` of the chat that was answered. `seed` copies the
corpus's answers to the prompts a work directory is about to answer (the
same id and the same chat) into its `responses.jsonl`, so that they are not
answered again; `save` adds a work directory's own answers (not ShareGPT's
references) to a corpus, written anew atomically; `from_ids` makes a corpus's
answers of token ids (a draft window's, on a machine without this runtime),
and `merge` adds one corpus to another. A corpus of another
teacher, tokenizer or budget, or a file that is not a whole corpus, is
refused in one line naming it.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path

from . import records
from .data import messages_of, response_record

KIND = "hamburger-answers"
"""The header's `corpus` value: what marks a file as a corpus of answers."""


def asked_key(row: dict) -> str:
    """A short SHA-1 of the chat a prompt row asks: an answer is reused only
    for the very chat it answered (a standard-library prompt's id can name
    another docstring under another Python)."""
    text = json.dumps(messages_of(row), sort_keys=True, ensure_ascii=False)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def header_of(meta: dict, max_tokens: int) -> dict:
    """The header of a corpus of the teacher `meta` (`features.meta_of`) answering within `max_tokens`."""
    return {"corpus": KIND, "teacher": meta["base"], "tokenizer": meta["tokenizer"], "max_tokens": max_tokens}


@dataclass(frozen=True)
class Corpus:
    """A corpus as read: its file, header and answers."""

    path: Path
    header: dict
    answers: list[dict]


def read(path: Path) -> Corpus:
    """A corpus's header and answers; a file that is missing, not gzip, cut
    short, or without the header is refused in one line naming it."""
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            lines = f.read().split("\n")  # not splitlines(): an answer may hold U+2028 and the like
        header, answers = json.loads(lines[0]), [json.loads(line) for line in lines[1:] if line.strip()]
        if not isinstance(header, dict) or header.get("corpus") != KIND:
            raise ValueError(f"its first line is not a {KIND} header")
        if not all(isinstance(a, dict) and {"id", "asked", "response"} <= a.keys() for a in answers):
            raise ValueError("an answer line lacks its id, asked or response")
    except FileNotFoundError:
        raise SystemExit(f"answers: {path} does not exist") from None
    except (OSError, EOFError, zlib.error, UnicodeDecodeError, IndexError, ValueError) as e:
        raise SystemExit(f"answers: {path} is not a whole answers corpus ({e}): restore it from git") from None
    return Corpus(path, header, answers)


def check_header(path: Path, have: dict, want: dict, whose: str = "this run's") -> None:
    """Refuses (one line naming `path`) a corpus whose teacher, tokenizer or
    budget is not `want`'s (`whose`: where `want` is from, as the line says it)."""
    for key, what in (("teacher", "base"), ("tokenizer", "tokenizer"), ("max_tokens", "--max-tokens")):
        if have.get(key) != want[key]:
            raise SystemExit(f"answers: {path} was answered with another {what} ({key} {have.get(key)}, "
                             f"{whose} {want[key]}): its answers are not this teacher's")


def seed(resp_path: Path, corpus: Corpus, rows: list[dict], meta: dict, max_tokens: int) -> int:
    """Appends to `resp_path` the corpus's answer to every row of `rows`
    not answered there yet whose id and chat it holds; returns how many."""
    check_header(corpus.path, corpus.header, header_of(meta, max_tokens))
    by_id = {a["id"]: a for a in corpus.answers}
    done = records.done_ids(resp_path)
    n = 0
    with open(resp_path, "a") as f:
        for r in rows:
            a = by_id.get(r["id"])
            if r["id"] in done or a is None or a["asked"] != asked_key(r):
                continue
            f.write(json.dumps(response_record(r, a["response"], a.get("finish_reason"), max_tokens)) + "\n")
            n += 1
    print(f"answers: {n} of {len(rows)} prompts answered from {corpus.path}", file=sys.stderr)
    return n


def save(work: Path, corpus: Path, max_tokens: int) -> None:
    """Adds the base's answers in `work/responses.jsonl` made within
    `max_tokens` (`draft`'s teacher: `work/verifier/meta.json`) to `corpus`,
    made when missing, keeping the answers it has."""
    meta_path = work / "verifier" / "meta.json"
    if not meta_path.exists():
        raise SystemExit(f"answers: {meta_path} does not exist: only a draft work directory's answers are kept")
    want = header_of(json.loads(meta_path.read_text()), max_tokens)
    old = read(corpus) if corpus.exists() else Corpus(corpus, want, [])
    check_header(corpus, old.header, want)
    kept = old.answers
    have = {a["id"] for a in kept}
    new = []
    for r in records.read(work / "responses.jsonl"):
        if r.get("finish_reason") != "reference" and r.get("max_tokens") == max_tokens and r["id"] not in have:
            have.add(r["id"])  # one answer an id, though a prompt list may name one twice
            new.append({"id": r["id"], "asked": asked_key(r), "response": r["response"],
                        "finish_reason": r["finish_reason"]})
    write(corpus, want, kept + new)
    print(f"answers: {len(new)} added to {corpus} ({len(kept) + len(new)} in all)", file=sys.stderr)


def write(path: Path, header: dict, answers: list[dict]) -> None:
    """Writes a corpus anew, atomically (a `.part` file renamed), with gzip's
    time stamp 0: the same answers give the same bytes, so git stores no
    change for nothing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    with open(tmp, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
        for line in [header, *answers]:
            gz.write((json.dumps(line, ensure_ascii=False) + "\n").encode())
    os.replace(tmp, path)


def merge(src: Path, into: Path) -> None:
    """Adds the answers of corpus `src` (a draft window's
    `verifier-answers.jsonl.gz`) that `into` lacks to `into`, made when
    missing; both must be of the same teacher, tokenizer and budget."""
    new = read(src)
    old = read(into) if into.exists() else Corpus(into, new.header, [])
    check_header(src, new.header, old.header, f"{into}'s")
    have = {a["id"] for a in old.answers}
    added = []
    for a in new.answers:
        if a["id"] not in have:
            have.add(a["id"])  # one answer an id, as `save` keeps
            added.append(a)
    write(into, old.header, old.answers + added)
    print(f"answers: {len(added)} of {src}'s {len(new.answers)} added to {into} "
          f"({len(old.answers) + len(added)} in all)", file=sys.stderr)


def from_ids(rows: list[dict], asked: dict[str, str], tokenizer: Path, max_tokens: int) -> list[dict]:
    """Corpus answers of answered rows (`generate`'s: `id`, `ids`, `n_prompt`,
    each answer ended by an end token, after `max_tokens` tokens at most)
    whose chats' keys `asked` holds: the answer decoded as the runtime's
    server returns it (without the end token), `finish_reason` "length"
    where the budget cut it, "stop" where the base ended it."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer))
    out = []
    for r in rows:
        if r["id"] not in asked:
            continue
        answer = r["ids"][r["n_prompt"]:]
        out.append({"id": r["id"], "asked": asked[r["id"]], "response": tok.decode(answer[:-1]),
                    "finish_reason": "length" if len(answer) > max_tokens else "stop"})
    return out
