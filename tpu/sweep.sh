#!/usr/bin/env bash
# Run several configs (or one `bmrl sweep` file) one after another on every host of a TPU VM.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: tpu/sweep.sh --name NAME --zone ZONE (--sweep FILE | --config FILE [--config FILE ...]) [options] [--] [KEY=VALUE ...]

Either run a bmrl sweep file (`bmrl sweep FILE`: a grid/zip over config keys and seeds, one directory
per run, summary table) on every host, or run `bmrl COMMAND --config FILE` for each config in turn,
each into OUT_ROOT/<config name>. Every run uses all hosts (tpu/run.sh), so runs go one at a time.

Required (flag or environment variable):
  --name NAME        TPU VM name                                  (TPU_NAME)
  --zone ZONE        its zone                                     (ZONE)
  --sweep FILE       a sweep file inside ~/bmrl, e.g. configs/sweep_budgets.yaml
  --config FILE      a config inside ~/bmrl (repeatable); used when --sweep is not given

Options:
  --command CMD      bmrl command for each --config (default: train)
  --out-root DIR     parent of each config's out_dir (default: runs/sweep-<UTC time>)
  --keep-going       continue with the next config after a failed one
  --detach           (--sweep only) start in the background and return
  --project PROJECT  Google Cloud project (PROJECT; default: gcloud's configured project)
  --dry-run          print the gcloud commands instead of running them
  -h, --help         show this help
  KEY=VALUE ...      dotted overrides applied to every run (see tpu/run.sh)

Examples:
  tpu/sweep.sh --name bmrl-v4 --zone us-central2-b --sweep configs/sweep_budgets.yaml
  tpu/sweep.sh --name bmrl-v4 --zone us-central2-b --config configs/qwen2_5_0_5b_sokoban.yaml \
      --config configs/llama3_2_1b_toolchain.yaml -- train.steps=50
EOF
}

die() { echo "sweep.sh: $*" >&2; echo >&2; usage >&2; exit 2; }

NAME="${TPU_NAME:-}"; ZONE="${ZONE:-}"; SWEEP=""; CONFIGS=(); COMMAND=train; OUT_ROOT=""
KEEP_GOING=0; PASS=(); OVERRIDES=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --name) NAME="${2:?--name needs a value}"; shift 2 ;;
    --zone) ZONE="${2:?--zone needs a value}"; shift 2 ;;
    --sweep) SWEEP="${2:?--sweep needs a value}"; shift 2 ;;
    --config) CONFIGS+=("${2:?--config needs a value}"); shift 2 ;;
    --command) COMMAND="${2:?--command needs a value}"; shift 2 ;;
    --out-root) OUT_ROOT="${2:?--out-root needs a value}"; shift 2 ;;
    --keep-going) KEEP_GOING=1; shift ;;
    --detach|--dry-run) PASS+=("$1"); shift ;;
    --project) PASS+=(--project "${2:?--project needs a value}"); shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; OVERRIDES+=("$@"); break ;;
    *=*) OVERRIDES+=("$1"); shift ;;
    *) die "unknown argument: $1" ;;
  esac
done
[[ -n "$NAME" ]] || die "missing --name (or TPU_NAME)"
[[ -n "$ZONE" ]] || die "missing --zone (or ZONE)"
if [[ -z "$SWEEP" && ${#CONFIGS[@]} -eq 0 ]]; then die "give --sweep FILE or at least one --config FILE"; fi
if [[ -n "$SWEEP" && ${#CONFIGS[@]} -gt 0 ]]; then die "give either --sweep or --config, not both"; fi

RUN="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/run.sh"
base=(--name "$NAME" --zone "$ZONE" "${PASS[@]+"${PASS[@]}"}")

if [[ -n "$SWEEP" ]]; then
  exec bash "$RUN" "${base[@]}" --command sweep --config "$SWEEP" -- "${OVERRIDES[@]+"${OVERRIDES[@]}"}"
fi
for p in "${PASS[@]+"${PASS[@]}"}"; do
  if [[ "$p" == --detach ]]; then die "--detach works with --sweep only (configs here run one after another)"; fi
done

[[ -n "$OUT_ROOT" ]] || OUT_ROOT="runs/sweep-$(date -u +%Y%m%d-%H%M%S)"
failed=()
for cfg in "${CONFIGS[@]}"; do
  stem="$(basename "${cfg%.*}")"
  echo "== $stem -> $OUT_ROOT/$stem"
  if ! bash "$RUN" "${base[@]}" --command "$COMMAND" --config "$cfg" --tag "$stem" -- \
      "out_dir=$OUT_ROOT/$stem" "${OVERRIDES[@]+"${OVERRIDES[@]}"}"; then
    failed+=("$stem")
    if [[ "$KEEP_GOING" == 0 ]]; then echo "sweep.sh: $stem failed; stopping (use --keep-going to continue)" >&2; exit 1; fi
  fi
done
if [[ ${#failed[@]} -gt 0 ]]; then echo "sweep.sh: failed: ${failed[*]}" >&2; exit 1; fi
echo "All ${#CONFIGS[@]} runs finished in ~/bmrl/$OUT_ROOT. Copy back: tpu/copy_back.sh --name $NAME --zone $ZONE --src bmrl/$OUT_ROOT --dest DIR"
