"""llama-cpp-python's README scripts run with only the import changed (and
the model's path): the completion, chat, JSON, JSON-schema and function
calling examples, from the README of its source distribution on PyPI."""

import ast
import contextlib
import io
import json
import re

import jsonschema
import pytest


def scripts(readme):
    """The README's Python blocks that build a Llama from a path and use
    nothing else of llama_cpp's (its multimodal chat handlers and Python
    draft models are refused by design)."""
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    return [
        b
        for b in blocks
        if "from llama_cpp import Llama\n" in b
        and "model_path=" in b
        and "chat_handler" not in b
        and "from llama_cpp." not in b
    ]


def run_script(source, model):
    """Runs `source` with the import changed and the path replaced: what it
    printed, and the value of its last expression."""
    source = source.replace("from llama_cpp import Llama", "from hamburger import Llama")
    source = re.sub(r'model_path="[^"]*"', f"model_path={str(model)!r}", source)
    tree = ast.parse(source)
    last = tree.body.pop() if isinstance(tree.body[-1], ast.Expr) else None
    scope = {}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(tree, "<readme>", "exec"), scope)
        value = eval(compile(ast.Expression(last.value), "<readme>", "eval"), scope) if last else None
    return printed.getvalue(), value


def test_the_readme_has_the_scripts_this_test_runs(llama_cpp_python_readme):
    found = scripts(llama_cpp_python_readme)
    assert len(found) == 5, [s.splitlines()[:3] for s in found]


@pytest.mark.parametrize("index", range(5))
def test_readme_script_runs_with_the_import_changed(llama_cpp_python_readme, smollm2_gguf, index):
    source = scripts(llama_cpp_python_readme)[index]
    printed, value = run_script(source, smollm2_gguf)
    if "output = llm(" in source:
        output = ast.literal_eval(printed.strip())
        assert output["object"] == "text_completion"
        # echo=True: the prompt comes back before the completion; stop=["Q:", "\n"].
        text = output["choices"][0]["text"]
        assert text.startswith("Q: Name the planets in the solar system? A: ") and "\n" not in text
        assert output["model"] == str(smollm2_gguf)
        return
    assert value["object"] == "chat.completion"
    message = value["choices"][0]["message"]
    # Sampled at the script's temperature without a token budget: a JSON
    # answer can run into the end of the context (n_ctx 512); one that
    # stopped by itself is whole.
    whole = value["choices"][0]["finish_reason"] != "length"
    if "tools=" in source:
        call = message["tool_calls"][0]["function"]
        assert call["name"] == "UserDetail"
        assert set(json.loads(call["arguments"])) == {"name", "age"}
    elif '"schema"' in source and whole:
        schema = {"type": "object", "properties": {"team_name": {"type": "string"}}, "required": ["team_name"]}
        jsonschema.validate(json.loads(message["content"]), schema)
    elif "json_object" in source and whole:
        assert isinstance(json.loads(message["content"]), dict)
    else:
        assert isinstance(message["content"], str)


def test_our_readme_python_runs(smollm2_gguf, tmp_path, monkeypatch):
    """The project README's Python: five lines of use, then the quantization
    sweep over the Q4 files it tells how to make."""
    from conftest import ROOT, run

    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    assert len(blocks) == 2
    models = tmp_path / "models"
    models.mkdir()
    (models / "smollm2-hamburger-q8_0.gguf").symlink_to(smollm2_gguf)
    for mix in ["Q4_0", "Q4_K_M"]:
        run("hamburger-quantize", "--allow-requantize", smollm2_gguf, models / f"smollm2-hamburger-{mix.lower()}.gguf",
            mix)
    monkeypatch.chdir(tmp_path)
    printed, _ = run_script(blocks[0], smollm2_gguf)
    assert float(printed.split()[-1]) >= 1.0 and len(printed) > 20
    printed, _ = run_script(blocks[1], smollm2_gguf)
    rows = printed.strip().splitlines()
    assert [r.split(":")[0] for r in rows] == ["q8_0", "q4_k_m", "q4_0"]
    assert all("tokens/step" in r and float(r.split("base log-prob ")[1].split("/")[0]) < 0 for r in rows)
