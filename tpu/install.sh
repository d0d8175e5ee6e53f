#!/usr/bin/env bash
# Install bmrl (from this checkout or a git URL) into a virtual environment on every worker of a TPU VM.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: tpu/install.sh --name NAME --zone ZONE [options]

Install bmrl on every worker of a TPU VM (`gcloud compute tpus tpu-vm scp/ssh --worker=all`):
Python 3.11 and a virtual environment in ~/bmrl-venv (through uv), `jax[tpu]`, and bmrl itself
(editable, in ~/bmrl). Run it again after changing the code: it re-uploads and re-installs.

Required (flag or environment variable):
  --name NAME        TPU VM name                                  (TPU_NAME)
  --zone ZONE        its zone                                     (ZONE)

Options:
  --git URL          clone bmrl from URL on each worker instead of uploading this checkout (BMRL_GIT)
  --ref REF          branch, tag or commit to check out with --git (default: the default branch)
  --model DIR        also upload a local Hugging Face model directory to ~/models/<basename of DIR>
                     on every worker (for configs that take model.path=...)
  --jax SPEC         the JAX requirement (JAX_SPEC; default "jax[tpu]"; e.g. "jax[cuda12]" on GPU VMs)
  --python VERSION   Python for the venv (default 3.11; bmrl needs 3.11 or 3.12)
  --project PROJECT  Google Cloud project (PROJECT; default: gcloud's configured project)
  --dry-run          print the gcloud commands instead of running them
  -h, --help         show this help

Example:
  tpu/install.sh --name bmrl-v4 --zone us-central2-b --model ~/models/Qwen2.5-0.5B-Instruct
EOF
}

die() { echo "install.sh: $*" >&2; echo >&2; usage >&2; exit 2; }

NAME="${TPU_NAME:-}"; ZONE="${ZONE:-}"; GIT_URL="${BMRL_GIT:-}"; REF=""; MODEL_DIR=""
JAX_SPEC="${JAX_SPEC:-jax[tpu]}"; PYTHON_VERSION=3.11; PROJECT="${PROJECT:-}"; DRY_RUN=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --name) NAME="${2:?--name needs a value}"; shift 2 ;;
    --zone) ZONE="${2:?--zone needs a value}"; shift 2 ;;
    --git) GIT_URL="${2:?--git needs a value}"; shift 2 ;;
    --ref) REF="${2:?--ref needs a value}"; shift 2 ;;
    --model) MODEL_DIR="${2:?--model needs a value}"; shift 2 ;;
    --jax) JAX_SPEC="${2:?--jax needs a value}"; shift 2 ;;
    --python) PYTHON_VERSION="${2:?--python needs a value}"; shift 2 ;;
    --project) PROJECT="${2:?--project needs a value}"; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument: $1" ;;
  esac
done
[[ -n "$NAME" ]] || die "missing --name (or TPU_NAME)"
[[ -n "$ZONE" ]] || die "missing --zone (or ZONE)"
if [[ -n "$REF" && -z "$GIT_URL" ]]; then die "--ref needs --git URL"; fi
if [[ -n "$MODEL_DIR" && ! -f "$MODEL_DIR/config.json" ]]; then
  die "--model $MODEL_DIR is not a Hugging Face directory (no config.json)"
fi

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
common=(--zone="$ZONE")
if [[ -n "$PROJECT" ]]; then common+=(--project="$PROJECT"); fi

run() {
  if [[ "$DRY_RUN" == 1 ]]; then printf '%q ' "$@"; echo; else "$@"; fi
}
if [[ "$DRY_RUN" == 0 ]]; then
  command -v gcloud >/dev/null || { echo "install.sh: gcloud is not installed (https://cloud.google.com/sdk/docs/install)" >&2; exit 1; }
fi

# 1. The code: a tarball of this checkout (no runs/, venvs or .git), or a clone on each worker.
if [[ -z "$GIT_URL" ]]; then
  if [[ "$DRY_RUN" == 1 ]]; then TARBALL=/tmp/bmrl.tgz; else TARBALL="$(mktemp -d)/bmrl.tgz"; fi
  run tar -czf "$TARBALL" -C "$REPO_ROOT" --exclude=./runs --exclude=./.git --exclude='*.egg-info' \
    --exclude='__pycache__' --exclude=./.venv --exclude=./venv .
  run gcloud compute tpus tpu-vm scp "$TARBALL" "$NAME:bmrl.tgz" --worker=all "${common[@]}"
  FETCH='rm -rf ~/bmrl && mkdir -p ~/bmrl && tar -xzf ~/bmrl.tgz -C ~/bmrl'
else
  FETCH="rm -rf ~/bmrl && git clone $(printf '%q' "$GIT_URL") ~/bmrl"
  if [[ -n "$REF" ]]; then FETCH+=" && git -C ~/bmrl checkout $(printf '%q' "$REF")"; fi
fi

# 2. Python, the venv, JAX for the accelerator, bmrl (editable) on every worker.
REMOTE="set -euo pipefail
$FETCH
if ! command -v uv >/dev/null && [ ! -x ~/.local/bin/uv ]; then curl -LsSf https://astral.sh/uv/install.sh | sh; fi
export PATH=\$HOME/.local/bin:\$PATH
uv venv --python $(printf '%q' "$PYTHON_VERSION") --allow-existing ~/bmrl-venv
uv pip install --python ~/bmrl-venv/bin/python $(printf '%q' "$JAX_SPEC")
uv pip install --python ~/bmrl-venv/bin/python -e ~/bmrl
mkdir -p ~/bmrl-logs ~/models
~/bmrl-venv/bin/python -c 'import jax; print(\"devices:\", jax.device_count(), \"local:\", jax.local_device_count())' || true"
run gcloud compute tpus tpu-vm ssh "$NAME" --worker=all "${common[@]}" --command="$REMOTE"

# 3. Optionally the model weights, to the same path on every worker.
if [[ -n "$MODEL_DIR" ]]; then
  run gcloud compute tpus tpu-vm scp --recurse "$MODEL_DIR" "$NAME:models/" --worker=all "${common[@]}"
  echo "Model uploaded to ~/models/$(basename "$MODEL_DIR") on every worker; pass model.path=~/models/$(basename "$MODEL_DIR") to tpu/run.sh"
fi
echo "Installed bmrl on every worker of $NAME. Next: tpu/run.sh --name $NAME --zone $ZONE --config configs/..."
