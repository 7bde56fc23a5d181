"""The 18 golden cases of the tiny fixture through the package: the same
text, tokens and macro steps as hamburger-cli's (which the golden file's
original implementation decides)."""

import json

import pytest

from conftest import ROOT, run

CASES = json.loads((ROOT / "tests/fixtures/tiny-hamburger/golden.json").read_text())["cases"]


def test_there_are_18_golden_cases():
    assert len(CASES) == 18


@pytest.mark.parametrize("index", range(len(CASES)))
def test_golden_case_decodes_as_hamburger_cli(tiny, tiny_gguf, index):
    case = CASES[index]
    n, confidence = case["max_new_tokens"], case["confidence"]
    ids = ",".join(map(str, case["prompt_ids"]))
    cli = json.loads(run("hamburger-cli", "-m", tiny_gguf, "-t", "2", "--prompt-ids", ids, "-n", n,
                         "--confidence", confidence, "--temp", "0", "--cache-type", "f32", "--json"))
    steps = cli["macro_steps"]
    tokens = [t for step in steps for t in step]
    out = tiny.create_completion(case["prompt_ids"], max_tokens=n, temperature=0, confidence=confidence)
    assert out["choices"][0]["text"] == tiny.detokenize(tokens).decode("utf-8", errors="replace")
    assert out["usage"]["completion_tokens"] == len(tokens)
    assert out["timings"]["macro_steps"] == len(steps)
    assert out["timings"]["kv_entries"] == len(case["prompt_ids"]) + len(steps) - 1
