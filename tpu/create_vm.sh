#!/usr/bin/env bash
# Create a Cloud TPU VM (a single host such as v4-8 / v5litepod-8, or a multi-host slice such as v5p-16).
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: tpu/create_vm.sh --name NAME --zone ZONE --type ACCELERATOR_TYPE [options]

Create a Cloud TPU VM with `gcloud compute tpus tpu-vm create`.

Required (flag or environment variable):
  --name NAME        TPU VM name                              (TPU_NAME)
  --zone ZONE        e.g. us-central2-b (v4), us-west4-a (v5e), us-east5-a (v5p)   (ZONE)
  --type TYPE        accelerator type: v4-8, v5litepod-8, v5p-8, v5p-16, ...      (ACCELERATOR_TYPE)

Options:
  --version VERSION  TPU software version (RUNTIME_VERSION); default by type:
                     v4* tpu-ubuntu2204-base, v5litepod* v2-alpha-tpuv5-lite, v5p* v2-alpha-tpuv5,
                     v6e* v2-alpha-tpuv6e
  --project PROJECT  Google Cloud project (PROJECT; default: gcloud's configured project)
  --spot             create a Spot VM (cheaper, can be preempted)
  --dry-run          print the gcloud command instead of running it
  -h, --help         show this help

Example:
  tpu/create_vm.sh --name bmrl-v4 --zone us-central2-b --type v4-8
EOF
}

die() { echo "create_vm.sh: $*" >&2; echo >&2; usage >&2; exit 2; }

NAME="${TPU_NAME:-}"; ZONE="${ZONE:-}"; TYPE="${ACCELERATOR_TYPE:-}"
VERSION="${RUNTIME_VERSION:-}"; PROJECT="${PROJECT:-}"; SPOT=0; DRY_RUN=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --name) NAME="${2:?--name needs a value}"; shift 2 ;;
    --zone) ZONE="${2:?--zone needs a value}"; shift 2 ;;
    --type) TYPE="${2:?--type needs a value}"; shift 2 ;;
    --version) VERSION="${2:?--version needs a value}"; shift 2 ;;
    --project) PROJECT="${2:?--project needs a value}"; shift 2 ;;
    --spot) SPOT=1; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument: $1" ;;
  esac
done
[[ -n "$NAME" ]] || die "missing --name (or TPU_NAME)"
[[ -n "$ZONE" ]] || die "missing --zone (or ZONE)"
[[ -n "$TYPE" ]] || die "missing --type (or ACCELERATOR_TYPE), e.g. v4-8"

if [[ -z "$VERSION" ]]; then
  case "$TYPE" in
    v4-*) VERSION=tpu-ubuntu2204-base ;;
    v5litepod-*|v5e-*) VERSION=v2-alpha-tpuv5-lite ;;
    v5p-*) VERSION=v2-alpha-tpuv5 ;;
    v6e-*) VERSION=v2-alpha-tpuv6e ;;
    *) die "no default --version for accelerator type '$TYPE'; pass --version" ;;
  esac
fi

cmd=(gcloud compute tpus tpu-vm create "$NAME" --zone="$ZONE" --accelerator-type="$TYPE" --version="$VERSION")
if [[ -n "$PROJECT" ]]; then cmd+=(--project="$PROJECT"); fi
if [[ "$SPOT" == 1 ]]; then cmd+=(--spot); fi

if [[ "$DRY_RUN" == 1 ]]; then
  printf '%q ' "${cmd[@]}"; echo
  exit 0
fi
command -v gcloud >/dev/null || { echo "create_vm.sh: gcloud is not installed (https://cloud.google.com/sdk/docs/install)" >&2; exit 1; }
"${cmd[@]}"
echo "Created $NAME ($TYPE) in $ZONE. Next: tpu/install.sh --name $NAME --zone $ZONE"
