"""The package's tests: models made by the project's own binaries (the
release build of `cargo test --release`), files the tests take from PyPI
packages cached as the Rust tests cache them, and one cargo-style result line
for scripts/test.sh's totals."""

import os
import pathlib
import subprocess
import sys
import tarfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = ROOT / "target" / "release"

#: The llama-cpp-python release whose README's scripts must run here.
LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"


def cache_dir():
    """`$HAMBURGER_CACHE`, else `$XDG_CACHE_HOME/hamburger`, else `~/.cache/hamburger`."""
    if os.environ.get("HAMBURGER_CACHE"):
        return pathlib.Path(os.environ["HAMBURGER_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "hamburger"


def run(*args):
    """Runs one of the project's binaries; its standard output."""
    return subprocess.run([str(BIN / args[0]), *map(str, args[1:])], check=True, capture_output=True, text=True).stdout


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory):
    """The tiny fixture (the original implementation's golden outputs) in F32."""
    out = tmp_path_factory.mktemp("tiny") / "tiny-f32.gguf"
    run("hamburger-convert", ROOT / "tests/fixtures/tiny-hamburger", "--outfile", out, "--outtype", "f32")
    return out


@pytest.fixture(scope="session")
def smollm2_gguf(tmp_path_factory):
    """The shipped SmolLM2-HAMburger at Q8_0, put together as the quickstart does."""
    grafted = ROOT / "models/smollm2-hamburger/grafted.safetensors"
    ckpt = run("hamburger-testmodel", "smollm2", "--grafted", grafted).strip()
    out = tmp_path_factory.mktemp("smollm2") / "smollm2-hamburger-q8_0.gguf"
    run("hamburger-convert", ckpt, "--outfile", out, "--outtype", "q8_0", "--confidence", "0.9")
    return out


@pytest.fixture(scope="session")
def tiny(tiny_gguf):
    """The tiny model as the golden cases ran: an F32 cache, two threads."""
    from hamburger import Llama

    with Llama(str(tiny_gguf), n_ctx=512, type_k="f32", n_threads=2, verbose=False) as llm:
        yield llm


@pytest.fixture(scope="session")
def smollm2(smollm2_gguf):
    """SmolLM2-HAMburger with llama-cpp-python's defaults but the context."""
    from hamburger import Llama

    with Llama(str(smollm2_gguf), n_ctx=2048, n_threads=2, verbose=False) as llm:
        yield llm


@pytest.fixture(scope="session")
def llama_cpp_python_readme():
    """llama-cpp-python's README, from its source distribution on PyPI."""
    spec = LLAMA_CPP_PYTHON.replace("==", "-")
    readme = cache_dir() / f"readme-{spec}.md"
    if not readme.exists():
        dl = cache_dir() / f"download-{spec}"
        dl.mkdir(parents=True, exist_ok=True)
        name = LLAMA_CPP_PYTHON.split("==")[0]
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", name,
                        "-d", str(dl), LLAMA_CPP_PYTHON], check=True)
        sdist = next(dl.glob("*.tar.gz"))
        with tarfile.open(sdist) as tar:
            member = next(m for m in tar.getmembers() if m.name.count("/") == 1 and m.name.endswith("/README.md"))
            text = tar.extractfile(member).read()
        readme.write_bytes(text)
    return readme.read_text(encoding="utf-8")


def pytest_terminal_summary(terminalreporter):
    """The cargo-style line scripts/test.sh totals."""
    stats = terminalreporter.stats
    passed = len(stats.get("passed", []))
    failed = len(stats.get("failed", [])) + len(stats.get("error", []))
    status = "ok" if failed == 0 else "FAILED"
    terminalreporter.write_line(f"test result: {status}. {passed} passed; {failed} failed (the Python package)")
