"""The languages of ``/run_code``: per language, its source file, compile and run commands, and
the image that has its toolchain.

The commands are SandboxFusion's (``sandbox/runners/major.py``) where it has the language
(``g++ -std=c++17``, ``javac`` + ``java -ea Main``, ``go build``, ``rustc``, ``node``), run in the
sandbox's work dir. python and bash run on ``tangram-python``; the compiled languages and Node on
``tangram-compilers`` (Debian's g++, default-jdk-headless, golang-go, nodejs and rustc, built by
``scripts/ensure-compilers-image.sh`` the first time a request or a test needs it).
"""

from __future__ import annotations

import asyncio
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tangram.exec.aoe.config import COMPILERS_IMAGE, PYTHON_IMAGE
from tangram.exec.runtime.errors import LiveError

#: Go builds into a cache of its own; /tmp is the sandbox's writable scratch.
_GO_ENV = "GOCACHE=/tmp/.gocache HOME=/tmp GO111MODULE=off GOFLAGS=-buildvcs=false"

#: The script that builds the compilers image, when running from a source checkout.
BUILD_SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "ensure-compilers-image.sh"
#: The longest the image's build may take (seconds).
BUILD_TIMEOUT_S = 1800


@dataclass(frozen=True)
class Language:
    """How one language's program is written, compiled and run in the sandbox."""

    source: str
    run: str
    compile: str | None = None
    #: The image with its toolchain; None: the service's ``/run_code`` image (python, bash).
    image: str | None = None


LANGUAGES: dict[str, Language] = {
    "python": Language("main.py", "python3 main.py"),
    "bash": Language("main.sh", "/bin/bash main.sh"),
    "c": Language("main.c", "./main", "gcc -std=c11 -O2 main.c -o main -lm", COMPILERS_IMAGE),
    "cpp": Language(
        "main.cpp", "./main", "g++ -std=c++17 -O2 main.cpp -o main -lm -lpthread", COMPILERS_IMAGE
    ),
    "java": Language(
        "Main.java",
        "java -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -cp . -ea Main",
        "javac -J-XX:+UseSerialGC -J-XX:TieredStopAtLevel=1 -cp . Main.java",
        COMPILERS_IMAGE,
    ),
    "go": Language("main.go", "./main", f"{_GO_ENV} go build -o main main.go", COMPILERS_IMAGE),
    "nodejs": Language("main.js", "node main.js", None, COMPILERS_IMAGE),
    "rust": Language("main.rs", "./main", "rustc -O main.rs -o main", COMPILERS_IMAGE),
}

#: Other names clients use for the same languages.
ALIASES: dict[str, str] = {
    "js": "nodejs",
    "javascript": "nodejs",
    "node": "nodejs",
    "c++": "cpp",
    "golang": "go",
    "python3": "python",
    "sh": "bash",
}


def resolve(name: str) -> str | None:
    """The language's canonical name, None when it is not supported."""
    name = ALIASES.get(name, name)
    return name if name in LANGUAGES else None


class ImageBuilds:
    """Builds a missing toolchain image once (concurrent requests wait for the same build)."""

    def __init__(self, script: Path = BUILD_SCRIPT) -> None:
        self.script = script
        self._lock = threading.Lock()
        self._ready: set[str] = set()
        #: One thread of its own: the requests waiting for a build (up to 30 minutes) wait in
        #: its queue, not on threads of the loop's default executor, which they filled (one
        #: blocked on the lock each) and so stalled what else the service runs there (a
        #: large body's parsing, the trace's writing, the executors' shutdown).
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="tangram-image-build")

    async def ensure(self, client: Any, image: str) -> None:
        """Return once ``image`` is in the engine; ``LiveError`` when it cannot be built."""
        if image in self._ready:
            return
        await asyncio.get_running_loop().run_in_executor(self._pool, self._ensure, client, image)

    def _ensure(self, client: Any, image: str) -> None:
        """``_build`` under the lock; any failure of it (the engine's error, the build's
        time-out, a script that cannot be run) is a ``LiveError``, which ``/run_code``
        answers as a ``SandboxError`` (it was a plain 500 without SandboxFusion's shape)."""
        with self._lock:
            try:
                self._build(client, image)
            except LiveError:
                raise
            except subprocess.TimeoutExpired as exc:
                raise LiveError(
                    f"building {image} did not finish in {exc.timeout:g} s; nothing ran"
                ) from None
            except Exception as exc:  # noqa: BLE001 - the engine's or the script's failure
                raise LiveError(
                    f"image {image!r} could not be checked or built "
                    f"({type(exc).__name__}: {str(exc)[-300:]}); nothing ran"
                ) from None

    def _build(self, client: Any, image: str) -> None:
        from tangram.exec.aoe.images import has_image

        if image in self._ready or has_image(client, image):
            self._ready.add(image)
            return
        if image != COMPILERS_IMAGE or not self.script.exists():
            raise LiveError(f"image {image!r} is not in the engine and cannot be built here")
        done = subprocess.run(
            [str(self.script)], capture_output=True, text=True, check=False, timeout=BUILD_TIMEOUT_S
        )
        if done.returncode != 0 or not has_image(client, image):
            raise LiveError(
                f"building {image} failed (exit {done.returncode}): {done.stderr.strip()[-500:]}"
            )
        self._ready.add(image)


__all__ = ["ALIASES", "LANGUAGES", "PYTHON_IMAGE", "ImageBuilds", "Language", "resolve"]
