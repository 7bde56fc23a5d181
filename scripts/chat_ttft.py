#!/usr/bin/env python3
"""Time to first token, turn by turn, of a chat against OpenAI-compatible
servers (hamburger-server, llama-server), with prompt-prefix reuse
(`cache_prompt: true`) and without.

The chat is scripted: each of the TURNS user turns carries about 200 tokens
of text and each earlier assistant turn is a fixed answer of about 30
tokens, so every configuration sees exactly the same prompts (turn 8 sends
about 1.7 k tokens) and only the last turn's answer is generated, greedily.
A turn's time to first token is the time from sending the request to the
first streamed content chunk. Each configuration runs REPEATS chats; within
a repeat the configurations' chats advance turn by turn in turns (turn 1 of
A, B, C, then turn 2 of each ...), so that a machine whose load drifts weighs
on all of them alike; the table gives the medians. So give each
configuration a server of its own (with one slot, the other chats' turns
would take the cells a chat means to reuse). Every chat's system prompt
carries its own number (the same number of tokens in all), so no chat starts
from another's cells. Standard library only.

    python3 scripts/chat_ttft.py \\
        --config 'ours reuse=http://127.0.0.1:8080' \\
        --config 'ours no reuse=http://127.0.0.1:8082,nocache' \\
        --config 'llama-server=http://127.0.0.1:8081' [--turns 8] [--repeats 3] [--max-tokens 32]
"""

import argparse
import statistics

from streamed_chat import stream_chat

# About 200 tokens of plain text per turn (SmolLM2's tokenizer), different each turn.
PARAGRAPH = (
    "Here is part {n} of my notes on the history of bridges. Early bridges were made of logs or stones "
    "laid across streams, and later builders learned to shape arches that carried loads by compression. "
    "The Romans built long aqueducts and bridges with carefully cut stones, many of which still stand. "
    "In the eighteenth and nineteenth centuries iron and then steel allowed longer spans, suspension "
    "bridges hung their decks from cables, and trusses spread forces through triangles of beams. "
    "Modern bridges use prestressed concrete, cable stays and careful computer analysis of wind and "
    "traffic. Engineers must think about the ground under each pier, the rivers that scour it, the "
    "expansion of materials in heat and cold, and the maintenance the structure will need for a "
    "century. Please read part {n} and answer briefly: what is the single most important idea in it?"
)

# The scripted assistant answer to part n (about 30 tokens), kept in the history.
ANSWER = (
    "The most important idea in part {n} is that a bridge must carry its loads safely to the ground "
    "for a long time, so materials, foundations and upkeep matter as much as the span."
)


def turn(url, messages, max_tokens, cache_prompt):
    """Streams one greedy chat answer; returns (ms to the first content chunk,
    the server's prompt token count, the tokens it reused from its cache)."""
    first, prompt_tokens, _, cached = stream_chat(url, messages, max_tokens, cache_prompt, timeout=600)
    if first is None:
        raise SystemExit(f"{url}: no content chunk came back")
    return first, prompt_tokens, cached


def system_message(chat_id):
    """The chat's system prompt: its own number, the same number of tokens in every chat."""
    return {"role": "system", "content": f"You are a concise assistant. Chat {chat_id:04d}."}


def parse_config(text):
    """'NAME=URL[,nocache]' -> (name, url, cache_prompt)."""
    name, _, rest = text.partition("=")
    url, _, flag = rest.partition(",")
    if not name or not url or flag not in ("", "nocache"):
        raise argparse.ArgumentTypeError(f"--config {text!r}: expected NAME=URL or NAME=URL,nocache")
    return name, url, flag != "nocache"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=parse_config, action="append", required=True,
                    help="NAME=URL, or NAME=URL,nocache for cache_prompt false; repeatable")
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args()
    # A warm-up turn per server (weights paged in, first-call costs paid), not timed.
    for i, url in enumerate(dict.fromkeys(url for _, url, _ in args.config)):
        turn(url, [{"role": "user", "content": f"Warm-up {i}."}], 4, False)
    runs = {name: [] for name, _, _ in args.config}
    chat_id = 1000
    for rep in range(args.repeats):
        # One chat per configuration, advanced turn by turn in turns (A B C A B C ...).
        chats = []
        for name, url, cache_prompt in args.config:
            chat_id += 1
            chats.append((name, url, cache_prompt, [system_message(chat_id)], []))
        for n in range(1, args.turns + 1):
            for name, url, cache_prompt, messages, res in chats:
                messages.append({"role": "user", "content": PARAGRAPH.format(n=n)})
                res.append(turn(url, messages, args.max_tokens, cache_prompt))
                messages.append({"role": "assistant", "content": ANSWER.format(n=n)})
        for name, _, _, _, res in chats:
            runs[name].append(res)
            print(f"# repeat {rep + 1}, {name}: TTFT ms per turn "
                  + " ".join(f"{ms:.0f}" for ms, _, _ in res)
                  + f"; turn {args.turns}: {res[-1][1]} prompt tokens, {res[-1][2]} reused", flush=True)
    names = [name for name, _, _ in args.config]
    medians = {n: [statistics.median(r[t][0] for r in runs[n]) for t in range(args.turns)] for n in names}
    base = names[0]
    print("| turn | prompt tokens | " + " | ".join(f"TTFT {n} (ms)" for n in names) + " | "
          + " | ".join(f"{n} / {base}" for n in names[1:]) + " |")
    print("|---:" * (2 + len(names) + len(names) - 1) + "|")
    for t in range(args.turns):
        tokens = runs[base][0][t][1]
        cells = [f"{medians[n][t]:.0f}" for n in names]
        ratios = [f"{medians[n][t] / medians[base][t]:.2f}x" for n in names[1:]]
        print(f"| {t + 1} | {tokens} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")


if __name__ == "__main__":
    main()
