#!/usr/bin/env bash
# The accelerator path, measured, in one go (under 8 minutes on one H100/H200-class GPU):
#   1. install the GPU build of the jax already installed here (jax[cuda13], else jax[cuda12]);
#   2. run the sharding, memory and model tests on the GPU (float32 matmuls at full precision);
#   3. bench/device.py: decode, rollout and one train step of a Qwen2.5-0.5B-shaped policy (random
#      weights, bfloat16, batch 256, 16 turns of 32 tokens): tokens/s, decode fraction of the
#      bandwidth roofline, learner MFU; its last line (JSON) is also written to bench/device.json.
# Run from anywhere inside the repository, with the project's Python environment active:
#   bash bench/device.sh [--no-install] [--no-tests] [-- extra bench/device.py arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python}"
install=1 tests=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --no-install) install=0 ;;
    --no-tests) tests=0 ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --) shift; break ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
start=$SECONDS

if [[ $install == 1 ]]; then
  version="$("$PY" -c 'import jax; print(jax.__version__)' 2>/dev/null || true)"
  pin="${version:+==$version}"
  # The driver's CUDA version decides the wheel: CUDA 13 drivers take jax[cuda13], older ones jax[cuda12].
  cuda="$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9]*\).*/\1/p' | head -1)"
  extras=(cuda13 cuda12)
  [[ -n "$cuda" && "$cuda" -lt 13 ]] && extras=(cuda12)
  ok=0
  for extra in "${extras[@]}"; do
    echo "== pip install jax[$extra]$pin"
    if "$PY" -m pip install -q -U "jax[$extra]$pin"; then ok=1; break; fi
  done
  [[ $ok == 1 ]] || { echo "could not install a GPU build of jax (tried ${extras[*]})" >&2; exit 1; }
fi
# What the benchmark and the tests import beyond jax (a machine that cannot install, e.g. one with no
# registry, must bring the missing ones: `pip download` them elsewhere, or copy their folders from a
# site-packages of the same Python into a folder on PYTHONPATH; omegaconf needs antlr4 beside it).
missing="$("$PY" - <<'PY'
import importlib.util as u
need = ["flax", "optax", "orbax.checkpoint", "transformers", "safetensors", "omegaconf", "yaml", "filelock", "pytest"]
print(" ".join(n for n in need if u.find_spec(n.split(".")[0]) is None or u.find_spec(n) is None))
PY
)"
[[ -z "$missing" ]] || { echo "missing Python packages: $missing (pip install them, or put them on PYTHONPATH)" >&2; exit 1; }
backend="$("$PY" -c 'import jax; print(jax.default_backend())')"
echo "== jax backend: $backend ($("$PY" -c 'import jax; print(jax.devices())'))"
[[ "$backend" == cpu ]] && { echo "no accelerator visible to jax; nothing to measure" >&2; exit 1; }

if [[ $tests == 1 ]]; then
  echo "== sharding, memory and model tests on $backend"
  # 4 workers share the one GPU: no worker may preallocate most of its memory (JAX's default 75%).
  XLA_PYTHON_CLIENT_PREALLOCATE=false JAX_DEFAULT_MATMUL_PRECISION=highest timeout 200 \
    "$PY" -m pytest -q -n 4 -p no:cacheprovider \
    tests/test_parallel.py tests/test_memory.py tests/model/test_decoder.py tests/model/families/test_parity.py \
    || echo "== tests failed (exit $?); the benchmark runs anyway"
fi

echo "== bench/device.py ($((SECONDS - start)) s so far)"
timeout 300 "$PY" bench/device.py "$@" | tee /tmp/bmrl_device.log
tail -n 1 /tmp/bmrl_device.log > bench/device.json
echo "== done in $((SECONDS - start)) s; figures in bench/device.json"
