"""One streamed, greedy chat answer from an OpenAI-compatible server
(hamburger-server, llama-server), timed to its first content chunk: what the
time-to-first-token benchmarks (chat_ttft.py, pool_bench.py) measure.
Standard library only."""

import json
import time
import urllib.request


def stream_chat(url, messages, max_tokens, cache_prompt=True, timeout=3600):
    """Streams one greedy chat answer; returns (ms to the first content
    chunk or None, the usage's prompt tokens, the server's `timings`
    prompt_n (the prompt tokens it computed) and cache_n (those it reused))."""
    body = {
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "cache_prompt": cache_prompt,
    }
    req = urllib.request.Request(
        url.rstrip("/") + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    start = time.perf_counter()
    first = prompt_tokens = prompt_n = cache_n = None
    with urllib.request.urlopen(req, timeout=timeout) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: "):])
            for choice in chunk.get("choices", []):
                if (choice.get("delta") or {}).get("content") and first is None:
                    first = (time.perf_counter() - start) * 1e3
            if chunk.get("usage"):
                prompt_tokens = chunk["usage"].get("prompt_tokens")
            if chunk.get("timings"):
                prompt_n, cache_n = chunk["timings"].get("prompt_n"), chunk["timings"].get("cache_n")
    return first, prompt_tokens, prompt_n, cache_n
