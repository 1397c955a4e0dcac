"""`tangram bench robustness` refuses family lists and seeds it would misreport, naming the
flag (stop 26's hunt)."""

import pytest

from tangram.bench.robustness import run_bench
from tangram.cli import main


@pytest.mark.parametrize(
    ("families", "problem"),
    [
        ("cpu,cpu", "family 'cpu' given more than once"),
        (",", "no family given"),
        ("cpu,chess", "unknown family 'chess'"),
    ],
)
def test_a_bad_family_list_is_refused_naming_the_flag(capsys, families, problem):
    args = ["bench", "robustness", "--families", families, "--instances", "1", "--quiet"]
    assert main(args) == 2
    assert f"--families {families!r}: {problem}" in capsys.readouterr().err


def test_run_bench_refuses_a_repeated_family_before_any_replay():
    with pytest.raises(ValueError, match="family 'gpu' given more than once"):
        run_bench(instances=1, families=["gpu", "cpu", "gpu"])


def test_a_negative_seed_is_refused_naming_the_flag(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "robustness", "--seed", "-5", "--instances", "1", "--quiet"])
    assert "argument --seed: must be >= 0, got -5" in capsys.readouterr().err


def test_an_output_that_cannot_be_a_directory_is_refused_before_any_replay(tmp_path, capsys):
    # --out naming a file failed with a FileExistsError traceback once the whole benchmark
    # had run (when an instance was written; with none, the bad path passed unnoticed).
    taken = tmp_path / "taken"
    taken.write_text("")
    args = ["bench", "robustness", "--instances", "1", "--families", "cpu", "--quiet"]
    assert main([*args, "--out", str(taken / "worst")]) == 2
    err = capsys.readouterr().err
    assert f"--out {taken / 'worst'}: {taken} exists and is not a directory" in err
