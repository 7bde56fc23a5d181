"""A pytest plugin for llama-server's suite (scripts/llama_server_suite.py
loads it): records the text of every answer the suite's servers give, per
test, into the JSON file named by $SUITE_ANSWERS, so that the answers of two
servers on the same model can be compared test by test.

An answer's text is its generated text (a stream's chunks joined), read as
each API carries it: /completion, OpenAI's chat and completions, the
Responses API and Anthropic's messages."""

import json
import os

answers: dict[str, list[str]] = {}
current: list[str] = [""]


def texts(body) -> list[str]:
    """The generated text in a JSON body or stream chunk, per API: OpenAI's
    choices (message / delta content, or text), the Responses API's output
    text and text deltas, Anthropic's text blocks and text deltas,
    /completion's `content` (a list of bodies for a list of prompts)."""
    if isinstance(body, list):
        return [t for b in body for t in texts(b)]
    if not isinstance(body, dict):
        return []
    if isinstance(body.get("choices"), list):
        found = []
        for c in body["choices"]:
            part = (c.get("delta") or c.get("message") or {}).get("content") if isinstance(c, dict) else None
            part = part if part is not None else (c.get("text") if isinstance(c, dict) else None)
            if isinstance(part, str):
                found.append(part)
        return found
    kind = body.get("type")
    if kind == "response.output_text.delta":
        return [body.get("delta", "")]
    if kind == "content_block_delta":
        return [body.get("delta", {}).get("text", "")]
    if isinstance(body.get("output"), list):
        return [p.get("text", "") for item in body["output"] if isinstance(item, dict)
                for p in item.get("content") or [] if isinstance(p, dict) and p.get("type") == "output_text"]
    if kind == "message" and isinstance(body.get("content"), list):
        return [b.get("text", "") for b in body["content"] if isinstance(b, dict) and b.get("type") == "text"]
    if isinstance(body.get("content"), str):
        return [body["content"]]
    return []


def record(test: str, text: str) -> None:
    answers.setdefault(test, []).append(text)


def pytest_sessionstart(session) -> None:
    import utils  # the suite's own module (its folder is the working directory)

    make_request, make_stream_request = utils.ServerProcess.make_request, utils.ServerProcess.make_stream_request

    def recorded_request(self, *args, **kwargs):
        res = make_request(self, *args, **kwargs)
        found = texts(res.body)
        if found:
            record(current[0], "".join(found))
        return res

    def recorded_stream(self, *args, **kwargs):
        # The test that started the stream: one it leaves unfinished ends
        # when the generator is collected, maybe during another test.
        test, pieces = current[0], []
        try:
            for chunk in make_stream_request(self, *args, **kwargs):
                pieces += texts(chunk)
                yield chunk
        finally:
            if pieces:
                record(test, "".join(pieces))

    utils.ServerProcess.make_request = recorded_request
    utils.ServerProcess.make_stream_request = recorded_stream


def pytest_runtest_setup(item) -> None:
    current[0] = item.nodeid.removeprefix("unit/")


def pytest_sessionfinish(session) -> None:
    path = os.environ.get("SUITE_ANSWERS")
    if path:
        with open(path, "w") as f:
            json.dump(answers, f, indent=0, ensure_ascii=False, sort_keys=True)
