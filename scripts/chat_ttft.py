#!/usr/bin/env python3
"""Time to first token, turn by turn, of a chat against an OpenAI-compatible
server (hamburger-server or llama-server), with prompt-prefix reuse on
(`cache_prompt: true`) and off.

Each of the TURNS user turns carries about 200 tokens of text; the history
grows by that and by the answer (max_tokens) every turn, so turn 8 sends
about 1.5 k tokens of history. The answers are streamed and the time to the
first content chunk is printed per turn. Standard library only.

    python3 scripts/chat_ttft.py http://127.0.0.1:8080 [--turns 8] [--max-tokens 32]
"""

import argparse
import json
import time
import urllib.request

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


def first_token_ms(url, messages, max_tokens, cache_prompt):
    """Streams one chat answer; returns (ms to the first content chunk, the answer's text)."""
    body = {
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "cache_prompt": cache_prompt,
    }
    req = urllib.request.Request(
        url.rstrip("/") + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    start = time.perf_counter()
    first = None
    text = []
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: "):])
            for choice in chunk.get("choices", []):
                piece = choice.get("delta", {}).get("content")
                if piece:
                    if first is None:
                        first = (time.perf_counter() - start) * 1e3
                    text.append(piece)
    return (first if first is not None else (time.perf_counter() - start) * 1e3), "".join(text)


def chat(url, turns, max_tokens, cache_prompt):
    """Runs one chat of `turns` turns; returns the time to first token of each."""
    # The two chats' system prompts differ, so that one does not start from the other's cells.
    run = "with" if cache_prompt else "without"
    messages = [{"role": "system", "content": f"You are a concise assistant ({run} prompt reuse)."}]
    times = []
    for n in range(1, turns + 1):
        messages.append({"role": "user", "content": PARAGRAPH.format(n=n)})
        ms, answer = first_token_ms(url, messages, max_tokens, cache_prompt)
        messages.append({"role": "assistant", "content": answer})
        times.append(ms)
    return times


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("url", help="the server, e.g. http://127.0.0.1:8080")
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args()
    off = chat(args.url, args.turns, args.max_tokens, False)
    on = chat(args.url, args.turns, args.max_tokens, True)
    print("| turn | TTFT, reuse off (ms) | TTFT, reuse on (ms) | ratio |")
    print("|---:|---:|---:|---:|")
    for i, (a, b) in enumerate(zip(off, on), 1):
        print(f"| {i} | {a:.0f} | {b:.0f} | {a / b:.1f}x |")


if __name__ == "__main__":
    main()
