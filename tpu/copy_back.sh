#!/usr/bin/env bash
# Copy run directories (reports, metrics, checkpoints, logs) from a TPU VM worker to a local
# directory or a Cloud Storage bucket.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: tpu/copy_back.sh --name NAME --zone ZONE --dest DIR|gs://BUCKET/PATH [options]

Copy results from a TPU VM worker (process 0 by default: the host that writes reports and
Hugging Face exports) to DEST: a local directory (`gcloud compute tpus tpu-vm scp --recurse`) or a
gs:// path (`gcloud storage rsync` run on the worker, with the VM's service account).

Required (flag or environment variable):
  --name NAME        TPU VM name                                            (TPU_NAME)
  --zone ZONE        its zone                                               (ZONE)
  --dest DEST        local directory or gs://bucket/path                    (DEST)

Options:
  --src PATH         remote path relative to the worker's home (default: bmrl/runs)
  --worker N         which worker to copy from (default: 0)
  --no-logs          skip ~/bmrl-logs (copied to DEST/bmrl-logs by default)
  --project PROJECT  Google Cloud project (PROJECT; default: gcloud's configured project)
  --dry-run          print the gcloud commands instead of running them
  -h, --help         show this help

Examples:
  tpu/copy_back.sh --name bmrl-v4 --zone us-central2-b --dest ./tpu-results
  tpu/copy_back.sh --name bmrl-v5p --zone us-east5-a --src bmrl/runs/qwen_sokoban --dest gs://my-bucket/bmrl
EOF
}

die() { echo "copy_back.sh: $*" >&2; echo >&2; usage >&2; exit 2; }

NAME="${TPU_NAME:-}"; ZONE="${ZONE:-}"; DEST="${DEST:-}"; SRC=bmrl/runs; WORKER=0; LOGS=1
PROJECT="${PROJECT:-}"; DRY_RUN=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --name) NAME="${2:?--name needs a value}"; shift 2 ;;
    --zone) ZONE="${2:?--zone needs a value}"; shift 2 ;;
    --dest) DEST="${2:?--dest needs a value}"; shift 2 ;;
    --src) SRC="${2:?--src needs a value}"; shift 2 ;;
    --worker) WORKER="${2:?--worker needs a value}"; shift 2 ;;
    --no-logs) LOGS=0; shift ;;
    --project) PROJECT="${2:?--project needs a value}"; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument: $1" ;;
  esac
done
[[ -n "$NAME" ]] || die "missing --name (or TPU_NAME)"
[[ -n "$ZONE" ]] || die "missing --zone (or ZONE)"
[[ -n "$DEST" ]] || die "missing --dest (or DEST): a local directory or gs://bucket/path"
[[ "$WORKER" =~ ^[0-9]+$ ]] || die "--worker must be a worker number (0, 1, ...), got '$WORKER'"

common=(--zone="$ZONE" --worker="$WORKER")
if [[ -n "$PROJECT" ]]; then common+=(--project="$PROJECT"); fi
run() {
  if [[ "$DRY_RUN" == 1 ]]; then printf '%q ' "$@"; echo; else "$@"; fi
}
if [[ "$DRY_RUN" == 0 ]]; then
  command -v gcloud >/dev/null || { echo "copy_back.sh: gcloud is not installed (https://cloud.google.com/sdk/docs/install)" >&2; exit 1; }
fi

SRC="${SRC#\~/}"
if [[ "$DEST" == gs://* ]]; then
  dest="${DEST%/}"
  remote="set -euo pipefail; gcloud storage rsync --recursive ~/$(printf '%q' "$SRC") $(printf '%q' "$dest/$(basename "$SRC")")"
  if [[ "$LOGS" == 1 ]]; then
    remote+="; if [ -d ~/bmrl-logs ]; then gcloud storage rsync --recursive ~/bmrl-logs $(printf '%q' "$dest/bmrl-logs"); fi"
  fi
  run gcloud compute tpus tpu-vm ssh "$NAME" "${common[@]}" --command="$remote"
else
  run mkdir -p "$DEST"
  run gcloud compute tpus tpu-vm scp --recurse "$NAME:$SRC" "$DEST/" "${common[@]}"
  if [[ "$LOGS" == 1 ]]; then
    run gcloud compute tpus tpu-vm scp --recurse "$NAME:bmrl-logs" "$DEST/" "${common[@]}"
  fi
fi
echo "Copied $NAME worker $WORKER:~/$SRC to $DEST"
