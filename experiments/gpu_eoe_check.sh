#!/usr/bin/env bash
# EOE on a real GPU: run the EOE tests against CUDA and the benchmark, and print the figures.
#
#   bash experiments/gpu_eoe_check.sh            # from the repository root, on a GPU machine
#   PYTHON=/path/to/python SIZES=small,large MODELS=hf-small REPS=5 bash experiments/gpu_eoe_check.sh
#
# Also runs the model-directory and sharded-cell tests on CUDA (tests/exec/test_eoe_hf.py: the
# 2-GPU ones skip on a 1-GPU machine, saying so) and the engine backend's
# (tests/exec/test_eoe_engine.py; the vLLM one where vLLM is installed), benchmarks
# directory-loaded models ($MODELS): whole on one GPU and, with 2+ GPUs, split by layers over 2,
# and the engine backend's restore (wake-up) against a plain pinned copy (eoe_engine_cuda.json).
#
# Needs: an NVIDIA GPU, a CUDA build of torch (torch==2.13.0 as pinned), pynvml, and for the
# tests pytest + hypothesis. Results go to $OUT (the device tool's output folder) or
# experiments/out/: eoe_env.txt, eoe_tests_cuda.txt, eoe_bench_cuda.json, eoe_bench_cuda.txt.
# The benchmark's target: restore at >= 80% of the plain pinned host-to-device copy bandwidth.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT_DIR="${OUT:-experiments/out}"
SIZES="${SIZES:-small,medium,large,xl-bf16}"
REPS="${REPS:-5}"
MODELS="${MODELS:-hf-small,hf-medium}"
TEST_TIMEOUT="${TEST_TIMEOUT:-300}"
BENCH_TIMEOUT="${BENCH_TIMEOUT:-400}"

# The first Python whose torch sees a GPU.
PY=""
for cand in "${PYTHON:-}" .venv/bin/python python3 python; do
  [ -n "$cand" ] || continue
  command -v "$cand" >/dev/null 2>&1 || [ -x "$cand" ] || continue
  if "$cand" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    PY="$cand"; break
  fi
done
if [ -z "$PY" ]; then
  echo "gpu_eoe_check: no Python with a CUDA-enabled torch found (tried \$PYTHON, .venv/bin/python, python3, python)." >&2
  echo "Install the CUDA build of torch==2.13.0 and pynvml, or set PYTHON=..." >&2
  exit 2
fi
mkdir -p "$OUT_DIR"

{
  echo "== environment"
  "$PY" - <<'PYEOF'
import torch
from tangram.exec.eoe.devices import nvml_gpus
print("python torch", torch.__version__, "cuda", torch.version.cuda)
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(f"cuda:{i} {p.name} {p.total_memory / 2**30:.1f} GiB")
for g in nvml_gpus():
    print(f"nvml:{g.index} {g.name} total {g.total_bytes / 2**30:.1f} GiB used {g.used_bytes / 2**30:.2f} GiB")
PYEOF
  nvidia-smi --query-gpu=index,name,memory.total,memory.used,pcie.link.gen.current,pcie.link.width.current --format=csv 2>/dev/null || true
} 2>&1 | tee "$OUT_DIR/eoe_env.txt"

status=0
echo "== EOE tests on CUDA (TANGRAM_EOE_BACKEND=cuda)"
if "$PY" -c 'import pytest, hypothesis' 2>/dev/null; then
  TANGRAM_EOE_BACKEND=cuda EOE_PROPERTY_EXAMPLES="${EOE_PROPERTY_EXAMPLES:-25}" \
    timeout "$TEST_TIMEOUT" "$PY" -m pytest -q -p no:cacheprovider -rs \
    tests/exec/test_eoe_cuda.py tests/exec/test_eoe_manager.py tests/exec/test_eoe_concurrency.py \
    tests/exec/test_eoe_registry.py tests/exec/test_eoe_hf.py tests/exec/test_eoe_engine.py \
    2>&1 | tee "$OUT_DIR/eoe_tests_cuda.txt"
  rc=${PIPESTATUS[0]}
  echo "tests exit code: $rc"
  [ "$rc" -eq 0 ] || status=1
else
  echo "pytest/hypothesis missing for $PY: tests skipped" | tee "$OUT_DIR/eoe_tests_cuda.txt"
  status=1
fi

echo "== benchmark: tangram bench eoe --backend cuda --sizes $SIZES --models $MODELS --reps $REPS"
timeout "$BENCH_TIMEOUT" "$PY" -m tangram.cli bench eoe --backend cuda --sizes "$SIZES" --models "$MODELS" --reps "$REPS" --json \
  > "$OUT_DIR/eoe_bench_cuda.json"
rc=$?
if [ "$rc" -ne 0 ]; then
  echo "benchmark failed (exit $rc)"; status=1
else
  "$PY" - "$OUT_DIR/eoe_bench_cuda.json" <<'PYEOF' | tee "$OUT_DIR/eoe_bench_cuda.txt"
import json, sys
from tangram.report import format_table
doc = json.load(open(sys.argv[1]))
rows = [{
    "size": f["size"], "MiB": f["replica_bytes"] / 2**20,
    "copy GB/s": f["copy_gbps"], "restore GB/s": f["restore_gbps"],
    "restore % of copy": f["restore_pct_of_copy"],
    "restore ms": f["restore_s"] * 1e3, "evict ms": f["evict_s"] * 1e3,
    "hit ms": f["hit_s"] * 1e3, "miss ms": f["miss_s"] * 1e3, "exec ms": f["exec_s"] * 1e3,
} for f in doc["sizes"]]
print(f"device: {doc['device']}  torch {doc['torch']}  reps {doc['reps']}  batch {doc['batch']}x{doc['seq_len']}")
print(format_table(rows))
worst = min(f["restore_pct_of_copy"] for f in doc["sizes"])
big = [f for f in doc["sizes"] if f["replica_bytes"] >= 256 * 2**20]
print(f"restore / plain copy bandwidth: worst {worst:.1f}% over all sizes; "
      + (f"{min(f['restore_pct_of_copy'] for f in big):.1f}% over sizes >= 256 MiB" if big else "no size >= 256 MiB"))
print("target (>= 80% for large models):", "MET" if big and min(f["restore_pct_of_copy"] for f in big) >= 80 else "NOT MET")
if doc.get("models"):
    from tangram.exec.eoe.bench_hf import table
    print("\nmodel directories, whole and split by layers (medians):")
    print(format_table(table(doc["models"])))
PYEOF
fi
echo "== engine backend: restore (wake-up) vs plain pinned copy (python -m tangram.exec.eoe.bench_engine)"
timeout "$BENCH_TIMEOUT" "$PY" -m tangram.exec.eoe.bench_engine --backend cuda --model "${ENGINE_MODEL:-hf-medium}" \
  --reps "$REPS" > "$OUT_DIR/eoe_engine_cuda.json"
rc=$?
if [ "$rc" -ne 0 ]; then
  echo "engine benchmark failed (exit $rc)"; status=1
else
  "$PY" - "$OUT_DIR/eoe_engine_cuda.json" <<'PYEOF' | tee "$OUT_DIR/eoe_engine_cuda.txt"
import json, sys
from tangram.report import format_table
doc = json.load(open(sys.argv[1]))
print(format_table([{
    "engine": r["engine"], "MiB": r["weight_bytes"] / 2**20, "restore ms": r["restore_s"] * 1e3,
    "restore GB/s": r["restore_gbps"], "copy GB/s": r["copy_gbps"],
    "restore % of copy": r["restore_pct_of_copy"],
} for r in doc["engines"]]))
for kind, why in doc["skipped"].items():
    print(f"{kind}: skipped ({why})")
for r in doc["engines"]:
    print(f"{r['engine']}: target (restore >= 80% of a plain pinned copy):",
          "MET" if r["restore_pct_of_copy"] >= 80 else "NOT MET")
PYEOF
fi
exit $status
