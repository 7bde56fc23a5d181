#!/usr/bin/env python3
"""llama-server's own test suite (llama.cpp's `tools/server/tests/unit/`)
against a server binary, with a local GGUF instead of the suite's hub models.

The suite comes from the PyPI source distribution of llama-cpp-python
(`LLAMA_CPP_PYTHON`), which vendors llama.cpp; it is unpacked once into
~/.cache/hamburger, and its Python requirements go into .venv-llama-suite.
Every server the suite starts is started through this script's `wrap` mode
(the suite's `LLAMA_SERVER_BIN_PATH`), which drops the hub flags
(`--hf-repo`, `--hf-file`, `--offline`, `--model-url`) and passes
`--model GGUF` instead, and `-fa on` unless the test sets `-fa` (what
llama-server's `-fa auto` is on the CPU: `wrap` says why), with
`SOURCE_DATE_EPOCH` at the day llama-server's answers were recorded
(KIND/`recorded-on.txt`): llama.cpp gives Llama 3.x's templates the day's
date, so their prompts change every day. The suite's session fixture that downloads every
preset's model is turned off in the working copy: nothing leaves loopback.

    llama_server_suite.py run --server BIN --model GGUF [--junit FILE] [--check]
    llama_server_suite.py prepare

`prepare` only unpacks the suite and installs its environment, as `run`
does first (scripts/install-deps.sh runs it with the other installs).

runs SUITE_FILES; with `--check` it then compares the outcome with what
llama-server did on the same model and the same kind of CPU
(`server/tests/llama-suite/KIND/`, KIND from `cpu_kind`):
`expected-pass.txt` (the tests llama-server passes, recorded with
`--record` against llama-server) and `expected-fail.txt` (the tests it
fails, each with where: the line of the test file it failed at and the
exception, recorded with `--record-failures`), less `refused.txt` (what
hamburger-server refuses by design) and `not-yet.txt` (what it still
lacks), each test there with its reason. A test of expected-pass.txt must
pass; a test of expected-fail.txt must pass or fail where llama-server's
did: most of those check an answer's text against the suite's own tiny
model, after the checks of status and fields that both servers pass.

The answers themselves are compared too: a pytest plugin
(llama_suite_answers.py) records every answer's text per test, and each
test's texts must be llama-server's on the same model
(KIND/`llama-server-answers.json`, recorded with `--record-answers`
against llama-server, which also writes the day, `recorded-on.txt`), but for
`answers-differ.txt` (by design, each with why) and a couple of near-ties. It prints one cargo-style `test result:` line and
exits non-zero when a test did neither.
"""

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LISTS = ROOT / "server" / "tests" / "llama-suite"
LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "hamburger"
SUITE = CACHE / ("llama-server-tests-" + LLAMA_CPP_PYTHON.split("==")[1])
VENV = ROOT / ".venv-llama-suite"
# The suite's files that test what a text-generation server does; the others
# test embeddings, reranking, LoRA, multimodal input, the router, MCP and
# built-in tools, sleeping and slot files (see refused.txt for why).
SUITE_FILES = [
    "test_basic.py",
    "test_chat_completion.py",
    "test_compat_anthropic.py",
    "test_compat_gcp.py",
    "test_compat_oai_responses.py",
    "test_completion.py",
    "test_ctx_shift.py",
    "test_ignore_eos.py",
    "test_infill.py",
    "test_kv_keep_only_active.py",
    "test_metrics.py",
    "test_security.py",
    "test_stream.py",
    "test_template.py",
    "test_tokenize.py",
    "test_tool_call.py",
    "test_speculative.py",
]
# The draft model test_speculative.py downloads (stories15M-q4_0.gguf): the
# suite's model stands in for it, so the draft is the target itself.
DRAFT_MODEL = "stories15M-q4_0.gguf"
# Tests left out: their own code reaches past loopback (an image from the
# hub), or they need a model of another kind (a 7B reasoning model).
DESELECTED = [
    "unit/test_compat_anthropic.py::test_anthropic_vision_base64_with_multimodal_model",
    "unit/test_compat_anthropic.py::test_anthropic_thinking_with_reasoning_model",
] + [  # and test_tool_call.py's slow tests (llama.cpp's tests.sh runs them with SLOW_TESTS=1 only): one
    # server start per case for 3-8B models of the hub, 200 cases that llama-server fails on SmolLM2
    # but a few where its answer happens to parse (on this machine: 20 minutes)
    f"unit/test_tool_call.py::{t}" for t in ("test_completion_with_required_tool_real_model",
                                             "test_completion_without_tool_call_slow", "test_weather",
                                             "test_calc_result", "test_thoughts", "test_hello_world")
]
# The tests whose answers differ from llama-server's by design, each with
# why (a test id, or a pattern whose '*' stands for any text).
ANSWERS_DIFFER = LISTS / "answers-differ.txt"
# Answers that may part from llama-server's on the same kind of CPU
# unexplained: a near-tie of two tokens (greedy) or of a draw and a
# cumulative probability (sampled) turns on the last bits of the logits,
# which can differ between the two engines. A regression (a sampler's
# order, its random numbers, a template) parts dozens.
NEAR_TIES_ALLOWED = 2
# The day llama-server's answers of a kind were recorded (YYYY-MM-DD), in its folder.
RECORDED_ON = "recorded-on.txt"
# Tests that check that the prompt holds the real today's date: their servers render today.
TODAY_TESTS = ("test_template.py::test_date_inside_prompt",)
HUB_FLAGS = {"--hf-repo": 1, "--hf-file": 1, "--model-url": 1, "--offline": 0, "-hf": 1, "-hff": 1}


def fail(msg: str) -> "None":
    print(f"llama_server_suite.py: {msg}", file=sys.stderr)
    sys.exit(1)


def unpack_suite() -> Path:
    """The suite and the chat templates it reads, unpacked once from the sdist."""
    if (SUITE / "tools/server/tests/utils.py").exists():
        return SUITE
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as dl:
        # Its source alone: the build tools pip reads its metadata with come as wheels.
        name = LLAMA_CPP_PYTHON.split("==")[0]
        pip = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", name, "-d", dl]
        if subprocess.run(pip + [LLAMA_CPP_PYTHON]).returncode != 0:
            fail(f"pip could not download {LLAMA_CPP_PYTHON} (the suite's source)")
        sdist = next(Path(dl).glob("*.tar.gz"), None) or fail(f"pip saved no .tar.gz for {LLAMA_CPP_PYTHON}")
        out = Path(dl) / "suite"
        with tarfile.open(sdist) as tar:
            for m in tar.getmembers():
                parts = m.name.split("/vendor/llama.cpp/", 1)
                if len(parts) == 2 and parts[1].startswith(("tools/server/tests/", "models/templates/")):
                    # Plain files and folders below `out` only (what tarfile's
                    # "data" filter checks; Debian 12's Python 3.11.2 predates it).
                    if not (m.isfile() or m.isdir()) or m.name.startswith("/") or ".." in Path(parts[1]).parts:
                        continue
                    m.name = parts[1]
                    tar.extract(m, out, set_attrs=False)
        if not (out / "tools/server/tests/utils.py").exists():
            fail(f"{sdist.name} has no vendor/llama.cpp/tools/server/tests/utils.py")
        # The session fixture downloads every preset's hub model: off.
        conftest = out / "tools/server/tests/conftest.py"
        text = conftest.read_text()
        if "ServerPreset.load_all()" not in text:
            fail(f"{conftest}: the suite no longer calls ServerPreset.load_all(); update this script")
        conftest.write_text(text.replace("ServerPreset.load_all()", "pass  # models are local (llama_server_suite.py)"))
        if SUITE.exists():
            shutil.rmtree(SUITE)
        shutil.move(str(out), SUITE)
    return SUITE


def venv_python() -> Path:
    """.venv-llama-suite with the suite's requirements.txt."""
    py = VENV / "bin" / "python"
    if subprocess.run([py, "-c", "import pytest, openai, requests, wget, prometheus_client, filelock"],
                      capture_output=True).returncode if py.exists() else 1:
        subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
        req = SUITE / "tools/server/tests/requirements.txt"
        if subprocess.run([py, "-m", "pip", "install", "--quiet", "-r", req]).returncode != 0:
            fail(f"pip could not install {req} into {VENV}")
    return py


def wrap(argv: list[str]) -> None:
    """Runs $SUITE_SERVER with the suite's arguments, the hub flags replaced
    by --model $SUITE_MODEL, and `-fa on` where the test sets no `-fa`:
    llama-server's `-fa auto` fuses attention on the CPU, and its recorded
    answers come from that kernel; hamburger-server's auto computes
    attention as separate products there (it decodes faster,
    docs/performance.md), which sums in another order and turns the suite
    model's near-ties into other words. So both run the same kernel.
    $SUITE_DATE_EPOCH (`recorded_epoch`) becomes the server's
    SOURCE_DATE_EPOCH, the day its templates render, but in TODAY_TESTS
    (pytest names the test that starts the server in $PYTEST_CURRENT_TEST)."""
    server, model = os.environ["SUITE_SERVER"], os.environ["SUITE_MODEL"]
    test = os.environ.get("PYTEST_CURRENT_TEST", "")
    if os.environ.get("SUITE_DATE_EPOCH") and not any(t in test for t in TODAY_TESTS):
        os.environ["SOURCE_DATE_EPOCH"] = os.environ["SUITE_DATE_EPOCH"]
    args, i = [], 0
    while i < len(argv):
        if argv[i] in HUB_FLAGS:
            i += 1 + HUB_FLAGS[argv[i]]
            continue
        args.append(argv[i])
        i += 1
    if "--model" not in args and "-m" not in args:
        args += ["--model", model]
    if not {"-fa", "--flash-attn"} & set(args):
        args += ["-fa", "on"]
    os.execv(server, [server] + args)


def where_failed(text: str) -> str:
    """Where a failure's traceback left the test file, and what was raised:
    `unit/test_x.py:LINE Exception` (the last frame in a test file, the
    exception of the last frame)."""
    frames = re.findall(r"^(unit/test_\w+\.py):(\d+):", text, re.M)
    raised = re.findall(r"^[\w/.]+\.py:\d+: (\w+)\s*$", text, re.M)
    place = f"{frames[-1][0]}:{frames[-1][1]}" if frames else "?"
    return f"{place} {raised[-1] if raised else '?'}"


def outcomes(junit: Path) -> dict[str, tuple[str, str]]:
    """test id (file::name[params]) -> (passed / failed / skipped, where it failed)."""
    result = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = case.get("classname", "").split(".")[-1] + ".py::" + case.get("name", "")
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        if failure is not None:
            result[name] = ("failed", where_failed(failure.text or ""))
        elif case.find("skipped") is not None:
            result[name] = ("skipped", "")
        else:
            result[name] = ("passed", "")
    return result


def cpu_kind() -> str:
    """The kind of CPU a recording of llama-server is valid on: ggml's kernels
    are built for the machine (-march=native: llama.cpp's default, and
    .cargo/config.toml's), its AVX-512 kernels sum in another order than its
    AVX2 ones, and the last bits of the logits decide near-ties. Seeded
    prompts share their near-ties across dozens of tests, so one kind's
    answers and outcomes differ from the other's in many tests at once
    (SmolLM2's "I believe the meaning of life is" takes another word at
    character 18). AVX512-FP16 (Sapphire Rapids and later Xeons) is a kind
    of its own: there ggml's F16 vector kernels (the flash attention over
    the F16 KV cache) add and multiply in half precision, and llama-server's
    answers differ from a Zen 4's in 10 of 120 tests. "avx512fp16",
    "avx512", "avx2", or the machine's architecture."""
    flags: set[str] = set()
    try:
        line = next((l for l in Path("/proc/cpuinfo").read_text().splitlines() if l.startswith("flags")), "")
        flags = set(line.partition(":")[2].split())
    except OSError:
        pass
    for kind, flag in (("avx512fp16", "avx512_fp16"), ("avx512", "avx512f"), ("avx2", "avx2")):
        if flag in flags:
            return kind
    return platform.machine()


def recorded() -> Path:
    """The folder of llama-server's outcomes and answers on this kind of CPU."""
    kind = cpu_kind()
    folder = LISTS / kind
    if not (folder / "expected-pass.txt").exists():
        fail(f"{folder}: no recording of llama-server on this kind of CPU ({kind}); record one as docs/server.md says")
    return folder


def recorded_epoch(folder: Path) -> str:
    """Noon (UTC) of the day `folder`'s answers were recorded, in seconds
    since 1970: what the servers under test render as today (Llama 3.x's
    templates print the date, and llama-server rendered that day's)."""
    path = folder / RECORDED_ON
    try:
        day = datetime.date.fromisoformat(path.read_text().strip())
    except (OSError, ValueError) as e:
        fail(f"{path}: expected the day llama-server's answers were recorded, YYYY-MM-DD ({e})")
    noon = datetime.datetime.combine(day, datetime.time(12), datetime.timezone.utc)
    return str(int(noon.timestamp()))


def read_list(path: Path) -> dict[str, str]:
    """Test ids of a list file, each with the rest of its line (the reason)."""
    out = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            test, _, why = line.partition("  ")
            out[test.strip()] = why.strip()
    return out


def run(a: argparse.Namespace) -> int:
    # Known before the suite runs: a kind with nothing to compare with is refused at once.
    recording = recorded() if a.check else None
    # Checked against a recording: the servers render its day, as llama-server did.
    day = recorded_epoch(recording) if recording is not None else None
    suite = unpack_suite()
    py = venv_python()
    tests = suite / "tools/server/tests"
    junit = Path(a.junit).resolve() if a.junit else Path(tempfile.mkdtemp()) / "suite.xml"
    answers_file = Path(a.record_answers).resolve() if a.record_answers else junit.with_suffix(".answers.json")
    env = {**os.environ, "LLAMA_SERVER_BIN_PATH": str(Path(__file__).resolve()),
           "SUITE_SERVER": str(Path(a.server).resolve()), "SUITE_MODEL": str(Path(a.model).resolve()),
           "HF_HUB_OFFLINE": "1", "PORT": str(a.port), "SUITE_ANSWERS": str(answers_file),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "scripts"), os.environ.get("PYTHONPATH", "")])}
    if day is not None:
        env["SUITE_DATE_EPOCH"] = day
    # test_speculative.py's draft model, which its own code would download
    # from the hub into tests/tmp: the same local model stands in.
    draft = tests / "tmp" / DRAFT_MODEL
    draft.parent.mkdir(exist_ok=True)
    draft.unlink(missing_ok=True)
    draft.symlink_to(Path(a.model).resolve())
    files = [f"unit/{f}" for f in (a.files or SUITE_FILES)]
    deselect = [arg for t in DESELECTED if t.split("::")[0] in files for arg in ("--deselect", t)]
    cmd = [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "llama_suite_answers", f"--junitxml={junit}", *files, *deselect, *a.pytest]
    subprocess.run(cmd, cwd=tests, env=env, stdout=None if a.verbose else subprocess.DEVNULL)
    if not junit.exists():
        fail("pytest wrote no report")
    got = outcomes(junit)
    passed = sorted(t for t, (o, _) in got.items() if o == "passed")
    print(f"{len(passed)} of {len(got)} tests passed")
    if a.record:
        Path(a.record).write_text("".join(t + "\n" for t in passed))
        print(f"wrote {a.record}")
    if a.record_answers:
        # llama-server rendered today's date (Llama 3.x's templates print it): a check renders this day.
        written = Path(a.record_answers).resolve().parent / RECORDED_ON
        written.write_text(datetime.date.today().isoformat() + "\n")
        print(f"wrote {written}")
    if a.record_failures:
        failed = sorted(f"{t}  {where}" for t, (o, where) in got.items() if o == "failed")
        Path(a.record_failures).write_text("".join(f + "\n" for f in failed))
        print(f"wrote {a.record_failures}")
    if recording is None:
        return 0
    expected = read_list(recording / "expected-pass.txt")
    failing = read_list(recording / "expected-fail.txt")
    excused = {**read_list(LISTS / "refused.txt"), **read_list(LISTS / "not-yet.txt")}
    outcome = lambda t: got.get(t, ("not run", ""))
    missing = [t for t in expected if t not in excused and outcome(t)[0] != "passed"]
    for t in missing:
        print(f"expected to pass (llama-server does): {t}: {' '.join(outcome(t))}")
    unlike = [t for t, where in failing.items() if t not in excused and outcome(t)[0] != "passed" and outcome(t)[1] != where]
    for t in unlike:
        print(f"expected to fail where llama-server fails ({failing[t]}): {t}: {' '.join(outcome(t))}")
    for t in excused:
        if outcome(t)[0] == "passed":
            print(f"now passes, drop it from refused.txt / not-yet.txt: {t}")
    alike = len([t for t in failing if t not in excused and outcome(t)[0] == "failed" and t not in unlike])
    n_ok = len([t for t in expected if t not in excused]) - len(missing)
    bad = len(missing) + len(unlike) + compare_answers(recording / "llama-server-answers.json", answers_file, excused, set(got))
    # (The totals of scripts/test.sh count "N passed" and "N failed": the tests
    # that fail where llama-server fails are said otherwise.)
    print(f"test result: {'ok' if not bad else 'FAILED'}. {n_ok} passed; {bad} failed; {alike} as llama-server, where it fails (llama-server's suite)")
    return 1 if bad else 0


def where_parted(ours: str, theirs: str) -> str:
    """The two texts around the first character where they part."""
    k = next((i for i, (x, y) in enumerate(zip(ours, theirs)) if x != y), min(len(ours), len(theirs)))
    return f"at character {k}: ours {ours[max(0, k - 20):k + 30]!r}, llama-server's {theirs[max(0, k - 20):k + 30]!r}"


def compare_answers(llama_answers: Path, answers_file: Path, excused: dict[str, str], ran: set[str]) -> int:
    """Compares each test's answer texts with llama-server's on the same model
    (`llama_answers`, as a multiset: parallel requests finish in any order),
    of the tests that `ran`, but for the tests of ANSWERS_DIFFER and
    `excused`; prints each test whose answers part and returns 1 when more
    than NEAR_TIES_ALLOWED do."""
    theirs = json.loads(llama_answers.read_text())
    ours = json.loads(answers_file.read_text()) if answers_file.exists() else {}
    differ = read_list(ANSWERS_DIFFER)
    # A pattern's '*' stands for any text; its brackets are the test ids' own.
    patterns = [re.compile(".*".join(map(re.escape, p.split("*")))) for p in differ]
    known = lambda t: t in excused or any(p.fullmatch(t) for p in patterns)
    compared = [t for t in sorted(set(theirs) | set(ours)) if t in ran and not known(t)]
    parted = [t for t in compared if Counter(ours.get(t, [])) != Counter(theirs.get(t, []))]
    for t in parted:
        a, b = Counter(ours.get(t, [])), Counter(theirs.get(t, []))
        only_ours, only_theirs = list((a - b).elements()), list((b - a).elements())
        if only_ours and only_theirs:
            what = where_parted(only_ours[0], only_theirs[0])
        else:
            what = f"{len(only_ours)} answers of ours, {len(only_theirs)} of llama-server's unmatched"
        print(f"answer unlike llama-server's: {t}: {what}")
    ok = len(parted) <= NEAR_TIES_ALLOWED
    print(f"answers: {len(compared) - len(parted)} of {len(compared)} tests answer llama-server's text "
          f"({len(parted)} part, {NEAR_TIES_ALLOWED} near-ties allowed; {len(differ)} differ by design: {ANSWERS_DIFFER.name})")
    return 0 if ok else 1


def main() -> None:
    if os.environ.get("SUITE_SERVER") and (len(sys.argv) < 2 or sys.argv[1] != "run"):
        wrap(sys.argv[1:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("prepare", help="unpack the suite and install its environment, and run nothing")
    r = sub.add_parser("run", help="run the suite against --server")
    r.add_argument("--server", required=True, help="the server binary (hamburger-server or llama-server)")
    r.add_argument("--model", required=True, help="the GGUF every server of the suite loads")
    r.add_argument("--junit", help="where pytest's JUnit XML report goes")
    r.add_argument("--port", type=int, default=8080, help="port of the suite's servers")
    r.add_argument("--files", nargs="*", help="suite files to run (default: SUITE_FILES)")
    r.add_argument("--record", help="write the passing tests' ids here (for expected-pass.txt)")
    r.add_argument("--record-failures", help="write the failing tests' ids and where they failed here (for expected-fail.txt)")
    r.add_argument("--record-answers", help="write every test's answer texts here (for llama-server-answers.json)")
    r.add_argument("--check", action="store_true", help="compare with llama-server's outcomes and answers on this kind of CPU")
    r.add_argument("--verbose", action="store_true", help="show pytest's output")
    r.add_argument("pytest", nargs="*", help="after --: pytest's own arguments")
    a = p.parse_args()
    if a.cmd == "prepare":
        unpack_suite()
        venv_python()
        return
    for path, what in ((a.server, "--server"), (a.model, "--model")):
        if not Path(path).is_file():
            fail(f"{what} {path}: no such file")
    sys.exit(run(a))


if __name__ == "__main__":
    main()
