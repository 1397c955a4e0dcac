"""The commands and the Python client snippet the user-facing docs show still work as written.

A doc that names a flag, a subcommand or a client method the code no longer has sends a new
user into an argparse error or an AttributeError on the first try. Every ``tangram ...`` line of
a ``bash`` block in README.md and docs/*.md is parsed by the real command line's parser (parsing
only: nothing is run, no Docker, GPU or Ray needed), and the README's Python snippet is run
against a service on loopback whose CPU executor is a fake (no containers).
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from tangram.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
DOCS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
#: A fenced block: its language and its text.
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def bash_commands(path: Path) -> list[str]:
    """The ``tangram`` command lines of the file's ``bash`` blocks, continuations joined and
    ``|``-separated alternatives of one word (``bench scheduler|sim``) expanded."""
    found: list[str] = []
    for lang, block in FENCE.findall(path.read_text(encoding="utf-8")):
        if lang != "bash":
            continue
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            # An environment assignment before the command (TANGRAM_TOKEN=... tangram serve).
            while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
                words = words[1:]
            if not words or words[0] != "tangram":
                continue
            found.extend(expand(words[1:]))
    return found


def expand(words: list[str]) -> list[str]:
    """One command per alternative of the first word written ``a|b|c`` (none: the command)."""
    for i, word in enumerate(words):
        if "|" in word and not word.startswith("-") and "=" not in word:
            return [shlex.join([*words[:i], alt, *words[i + 1 :]]) for alt in word.split("|")]
    return [shlex.join(words)]


CASES = [
    pytest.param(command, id=f"{path.name}: {command[:60]}")
    for path in DOCS
    for command in bash_commands(path)
]


def test_the_docs_show_commands() -> None:
    # The extraction itself must find the README's quick start (a broken pattern would pass
    # every case below vacuously).
    readme = bash_commands(ROOT / "README.md")
    assert "sim" in readme and any(c.startswith("bench robustness") for c in readme)
    assert len(CASES) >= 30


@pytest.mark.parametrize("command", CASES)
def test_every_documented_command_parses(command: str) -> None:
    argv = shlex.split(command)
    if argv == ["--help"]:
        return  # argparse prints the help and exits 0: nothing of ours to check
    try:
        build_parser().parse_args(argv)
    except SystemExit as exit_:  # argparse's refusal: the doc names a flag or value it lacks
        pytest.fail(f"`tangram {command}` does not parse (exit {exit_.code})")


def readme_python_snippet() -> str:
    """The README's one ``python`` block (live use from an RL framework's rollout worker)."""
    blocks = [
        text for lang, text in FENCE.findall((ROOT / "README.md").read_text()) if lang == "python"
    ]
    assert len(blocks) == 1, "the README's Python snippets changed: update this test"
    return blocks[0]


def test_the_readme_python_snippet_runs_against_a_service() -> None:
    from tangram.exec.service import ServeOptions, ServiceThread
    from tests.live.test_service_ids import fake_cpu_runtime

    snippet = readme_python_snippet()
    assert '"http://127.0.0.1:8765"' in snippet
    with ServiceThread(fake_cpu_runtime, ServeOptions(port=0)) as service:
        code = snippet.replace('"http://127.0.0.1:8765"', repr(service.url))
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(code, "README.md snippet", "exec"), {})  # noqa: S102 - our own doc
    # The fake executor echoes the trajectory and the command instead of running it.
    assert printed.getvalue().startswith("result traj-0|echo cores=$TANGRAM_CORES Timings(")


def test_each_documented_serve_command_names_its_models_once() -> None:
    # tangram serve refuses a --model name given twice (service_cli.served_services; one named
    # as an example service, reward or teacher, replaces it).
    commands = [
        shlex.split(text.replace("\n", " "))
        for path in DOCS
        for text in re.findall(r"`(tangram serve [^`]*)`", path.read_text(encoding="utf-8"))
        + [f"tangram {c}" for c in bash_commands(path) if c.startswith("serve")]
    ]
    named = [
        [words[i + 1].split("=", 1)[0] for i, w in enumerate(words[:-1]) if w == "--model"]
        for words in commands
    ]
    assert any(named), "no documented --model found: the pattern broke"
    assert [names for names in named if len(set(names)) != len(names)] == []
