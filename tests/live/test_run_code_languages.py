"""``/run_code`` per language, as SandboxFusion answers: for python, bash, C, C++, Java, Go,
Node and Rust, a correct program, a wrong answer (an assertion that fails), a compile error, a
run-time error, a time-out, a memory-limit breach and output over the service's cap each get
SandboxFusion's statuses. Compiled languages run on ``tangram-compilers`` (built here the first
time, ~1 min, then cached by the engine), from a warm pool.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.live.cpu_service import cpu_only_service

pytestmark = pytest.mark.docker

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "ensure-compilers-image.sh"

#: Per language: correct (prints 42), wrong (an assertion fails), compile error, run-time error,
#: endless loop, memory hog (touches ~1 GiB), flood (3 MiB on stdout).
PROGRAMS: dict[str, dict[str, str]] = {
    "python": {
        "correct": "print(6 * 7)",
        "wrong": "assert 6 * 7 == 41, 'wrong answer'",
        "compile_error": "def f(:\n  pass",
        "runtime_error": "print(1 // 0)",
        "timeout": "while True: pass",
        "memory": "x = b'x' * (1 << 30)\nprint(len(x))",
        "flood": "import sys\nsys.stdout.write('x' * (3 << 20))",
    },
    "bash": {
        "correct": "echo $((6 * 7))",
        "wrong": "[ $((6 * 7)) -eq 41 ] || exit 1",
        "compile_error": "if then fi",
        "runtime_error": "set -e; cat /no/such/file",
        "timeout": "while :; do :; done",
        "memory": "a=x; while :; do a=$a$a; done",  # doubles until the OOM killer
        "flood": "head -c 3M /dev/zero | tr '\\0' x",
    },
    "c": {
        "correct": '#include <stdio.h>\nint main(void){printf("%d\\n", 6*7);return 0;}',
        "wrong": "#include <assert.h>\nint main(void){assert(6*7 == 41);return 0;}",
        "compile_error": "int main(void){ return undefined_name; }",
        "runtime_error": "int main(void){ volatile int *p = 0; return *p; }",
        "timeout": "int main(void){ for(;;){} }",
        "memory": "#include <stdlib.h>\n#include <string.h>\n"
        "int main(void){ char *p = malloc(1u<<30); memset(p, 1, 1u<<30); return p[7]; }",
        "flood": "#include <stdio.h>\nint main(void){ for(int i=0;i<(3<<20);i++) putchar('x'); }",
    },
    "cpp": {
        "correct": "#include <iostream>\nint main(){ std::cout << 6*7 << std::endl; }",
        "wrong": "#include <cassert>\nint main(){ assert(6*7 == 41); }",
        "compile_error": "int main(){ std::vector<int> v; }",
        "runtime_error": '#include <stdexcept>\nint main(){ throw std::runtime_error("boom"); }',
        "timeout": "int main(){ volatile bool go = true; while(go){} }",
        "memory": "#include <vector>\n#include <iostream>\n"
        "int main(){ std::vector<char> v(1u<<30, 1); std::cout << (int)v[9]; }",
        "flood": "#include <iostream>\n#include <string>\n"
        "int main(){ std::cout << std::string(3<<20, 'x'); }",
    },
    "java": {
        "correct": "public class Main { public static void main(String[] a) { "
        "System.out.println(6 * 7); } }",
        "wrong": "public class Main { public static void main(String[] a) { "
        'assert 6 * 7 == 41 : "wrong answer"; } }',
        "compile_error": "public class Main { public static void main(String[] a) { int x = ; } }",
        "runtime_error": "public class Main { public static void main(String[] a) { "
        'System.out.println(1 / Integer.parseInt("0")); } }',
        "timeout": "public class Main { public static void main(String[] a) { while (true) {} } }",
        "memory": "public class Main { public static void main(String[] a) { "
        "byte[][] k = new byte[64][]; for (int i = 0; i < 64; i++) { k[i] = new byte[16 << 20]; "
        "java.util.Arrays.fill(k[i], (byte) 1); } System.out.println(k.length); } }",
        "flood": "public class Main { public static void main(String[] a) { "
        'System.out.print("x".repeat(3 << 20)); } }',
    },
    "go": {
        "correct": 'package main\nimport "fmt"\nfunc main() { fmt.Println(6 * 7) }',
        "wrong": 'package main\nfunc main() { if 6*7 != 41 { panic("wrong answer") } }',
        "compile_error": "package main\nfunc main() { x := }",
        "runtime_error": 'package main\nfunc main() { var m map[string]int; m["a"] = 1 }',
        "timeout": "package main\nfunc main() { for {} }",
        "memory": 'package main\nimport "fmt"\nfunc main() { b := make([]byte, 1<<30)\n'
        "for i := range b { b[i] = 1 }\nfmt.Println(len(b)) }",
        "flood": 'package main\nimport ("os"; "strings")\n'
        'func main() { os.Stdout.WriteString(strings.Repeat("x", 3<<20)) }',
    },
    "nodejs": {
        "correct": "console.log(6 * 7)",
        "wrong": "require('assert').strictEqual(6 * 7, 41)",
        "compile_error": "function (",
        "runtime_error": "null.x",
        "timeout": "while (true) {}",
        "memory": "const b = Buffer.alloc(1 << 30, 1); console.log(b.length)",
        "flood": "process.stdout.write('x'.repeat(3 << 20))",
    },
    "rust": {
        "correct": 'fn main() { println!("{}", 6 * 7); }',
        "wrong": "fn main() { let x = 6 * 7; assert_eq!(x, 41); }",
        "compile_error": 'fn main() { let x: i32 = "no"; }',
        "runtime_error": "fn main() { let v: Vec<i32> = Vec::new(); "
        'let i = std::env::args().count() + 4; println!("{}", v[i]); }',
        "timeout": "fn main() { loop {} }",
        "memory": 'fn main() { let v = vec![1u8; 1 << 30]; println!("{}", v[5]); }',
        "flood": 'fn main() { print!("{}", "x".repeat(3 << 20)); }',
    },
}
COMPILED = {"c", "cpp", "java", "go", "rust"}


@pytest.fixture(scope="module")
def service(docker_client: Any) -> Iterator[Any]:
    """A CPU-only service with a warm pool, the compilers image built if missing."""
    built = subprocess.run([str(SCRIPT)], capture_output=True, text=True, check=False)
    assert built.returncode == 0, built.stderr
    yield from cpu_only_service(docker_client, warm_pool=2)


#: The compile step's limit in these tests. They test what each language's answer says, not
#: the compilers' speed: SandboxFusion's default 10 s was passed by a cold rustc on this
#: 2-core machine in one whole-suite run (compile TimeLimitExceeded, exit 124).
COMPILE_TIMEOUT_S = 120


def run(service: Any, language: str, case: str, **extra: Any) -> dict:
    body = {
        "code": PROGRAMS[language][case],
        "language": language,
        "compile_timeout": COMPILE_TIMEOUT_S,
        **extra,
    }
    r = httpx.post(f"{service.url}/run_code", json=body, timeout=180)
    assert r.status_code == 200, r.text[:500]
    return r.json()


def expect(doc: dict, status: str, compile_status: str | None, run_status: str | None) -> None:
    """The answer's top status and its compile and run results' statuses (None: absent)."""
    assert doc["status"] == status, doc
    comp, ran = doc["compile_result"], doc["run_result"]
    assert (comp["status"] if comp else None) == compile_status, doc
    assert (ran["status"] if ran else None) == run_status, doc


LANGS = sorted(PROGRAMS)


@pytest.mark.parametrize("language", LANGS)
def test_a_correct_program_succeeds(service: Any, language: str) -> None:
    doc = run(service, language, "correct")
    expect(doc, "Success", "Finished" if language in COMPILED else None, "Finished")
    assert doc["run_result"]["stdout"].strip() == "42" and doc["run_result"]["return_code"] == 0


@pytest.mark.parametrize("language", LANGS)
def test_a_wrong_answer_fails_with_its_exit(service: Any, language: str) -> None:
    doc = run(service, language, "wrong")
    expect(doc, "Failed", "Finished" if language in COMPILED else None, "Finished")
    assert doc["run_result"]["return_code"] not in (0, None), doc


@pytest.mark.parametrize("language", LANGS)
def test_a_compile_error_fails_before_anything_runs(service: Any, language: str) -> None:
    doc = run(service, language, "compile_error")
    if language in COMPILED:  # SandboxFusion: compile_result Finished, non-zero; no run
        expect(doc, "Failed", "Finished", None)
        assert doc["compile_result"]["return_code"] != 0 and doc["compile_result"]["stderr"]
    else:  # an interpreter reports the syntax error when it runs
        expect(doc, "Failed", None, "Finished")
        assert doc["run_result"]["return_code"] != 0 and doc["run_result"]["stderr"]


@pytest.mark.parametrize("language", LANGS)
def test_a_runtime_error_fails_with_its_exit(service: Any, language: str) -> None:
    doc = run(service, language, "runtime_error")
    expect(doc, "Failed", "Finished" if language in COMPILED else None, "Finished")
    assert doc["run_result"]["return_code"] not in (0, None), doc


@pytest.mark.parametrize("language", LANGS)
def test_a_time_out_is_time_limit_exceeded(service: Any, language: str) -> None:
    doc = run(service, language, "timeout", run_timeout=1)
    expect(doc, "Failed", "Finished" if language in COMPILED else None, "TimeLimitExceeded")
    assert doc["run_result"]["return_code"] is None  # as SandboxFusion's


@pytest.mark.parametrize("language", LANGS)
def test_a_memory_limit_breach_fails(service: Any, language: str) -> None:
    doc = run(service, language, "memory", memory_limit_MB=400)
    expect(doc, "Failed", "Finished" if language in COMPILED else None, "Finished")
    assert doc["run_result"]["return_code"] not in (0, None), doc


@pytest.mark.parametrize("language", LANGS)
def test_output_over_the_cap_is_the_programs_error(service: Any, language: str) -> None:
    doc = run(service, language, "flood")
    expect(doc, "Failed", "Finished" if language in COMPILED else None, "Error")
    assert "output too large" in doc["message"], doc["message"]


def test_stdin_and_files_reach_a_compiled_program(service: Any) -> None:
    import base64

    code = (
        '#include <stdio.h>\nint main(void){ int a, b; FILE *f = fopen("in/b.txt", "r");'
        ' scanf("%d", &a); fscanf(f, "%d", &b); FILE *o = fopen("out.txt", "w");'
        ' fprintf(o, "%d", a * b); printf("%d\\n", a + b); return 0; }'
    )
    body = {
        "code": code,
        "language": "c",
        "stdin": "6",
        "files": {"in/b.txt": base64.b64encode(b"7").decode()},
        "fetch_files": ["out.txt"],
    }
    doc = httpx.post(f"{service.url}/run_code", json=body, timeout=180).json()
    expect(doc, "Success", "Finished", "Finished")
    assert doc["run_result"]["stdout"] == "13\n"
    assert base64.b64decode(doc["files"]["out.txt"]) == b"42"


def test_a_jar_among_the_files_is_on_javas_class_path(service: Any) -> None:
    """SandboxFusion puts each ``.jar`` of ``files`` on javac's and java's class path
    (``run_java``); here the class path was '.' alone, so a program using a library sent as a
    jar failed to compile ("package lib does not exist")."""
    import base64
    import io
    import zipfile

    lib = 'package lib; public class Greet { public static String hi() { return "hi"; } }'
    main = (
        "public class Main { public static void main(String[] a) "
        "{ System.out.println(lib.Greet.hi()); } }"
    )
    built = httpx.post(  # javac builds lib/Greet.class from the source Main uses
        f"{service.url}/run_code",
        json={
            "code": main,
            "language": "java",
            "files": {"lib/Greet.java": base64.b64encode(lib.encode()).decode()},
            "fetch_files": ["lib/Greet.class"],
        },
        timeout=180,
    ).json()
    assert "lib/Greet.class" in built["files"], built
    jar = io.BytesIO()
    with zipfile.ZipFile(jar, "w") as z:
        z.writestr("lib/Greet.class", base64.b64decode(built["files"]["lib/Greet.class"]))
    body = {
        "code": main,
        "language": "java",
        "files": {"deps/greet.jar": base64.b64encode(jar.getvalue()).decode()},
    }
    doc = httpx.post(f"{service.url}/run_code", json=body, timeout=180).json()
    assert doc["status"] == "Success", doc["compile_result"]
    assert doc["run_result"]["stdout"] == "hi\n"


def test_the_warm_pool_served_runs_and_shows_in_metrics(service: Any) -> None:
    for _ in range(3):
        assert run(service, "python", "correct")["status"] == "Success"
    text = httpx.get(f"{service.url}/metrics", timeout=30).text
    hits = [
        ln
        for ln in text.splitlines()
        if ln.startswith('tangram_warm_pool_events_total{event="hits"}')
    ]
    assert hits and float(hits[0].split()[-1]) >= 1, text[-2000:]
    assert 'tangram_warm_pool_parked{key="tangram-python/0.5GB"}' in text
