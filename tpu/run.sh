#!/usr/bin/env bash
# Run a bmrl command with a config on every host of a TPU VM / pod slice, one JAX process per host.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: tpu/run.sh --name NAME --zone ZONE --config FILE [options] [--] [KEY=VALUE ...]

Run `bmrl COMMAND --config FILE KEY=VALUE ...` on every worker of a TPU VM at once
(`gcloud compute tpus tpu-vm ssh --worker=all`), with BMRL_DISTRIBUTED=auto so that
bmrl.distributed.initialize() starts jax.distributed from the TPU slice's own metadata (one process
per host; on a single-host VM it is a single process). Each host logs to ~/bmrl-logs/TAG-HOST.log.

Required (flag or environment variable):
  --name NAME        TPU VM name                                              (TPU_NAME)
  --zone ZONE        its zone                                                 (ZONE)
  --config FILE      config path inside the installed checkout (~/bmrl), e.g. configs/qwen2_5_0_5b_sokoban.yaml,
                     or an absolute path on the workers; a sweep file with --command sweep   (CONFIG)

Options:
  --command CMD      bmrl command: train (default), sft, eval, reproduce, sweep, config
  --tag TAG          log name (default: config name + UTC time)
  --env KEY=VALUE    extra environment variable on every worker (repeatable), e.g. LIBTPU_INIT_ARGS=...
  --no-distributed   do not start jax.distributed (BMRL_DISTRIBUTED=off): single-host VMs only
  --detach           start in the background (nohup) and return; follow with tpu/run.sh ... --tail
  --tail             print the last lines of the newest log on every worker, and stop
  --project PROJECT  Google Cloud project (PROJECT; default: gcloud's configured project)
  --dry-run          print the gcloud command instead of running it
  -h, --help         show this help
  KEY=VALUE ...      dotted config overrides; a value starting with ~/ means the worker's home,
                     e.g. model.path=~/models/Qwen2.5-0.5B-Instruct

Examples:
  tpu/run.sh --name bmrl-v4 --zone us-central2-b --config configs/qwen2_5_0_5b_sokoban.yaml \
      model.path=~/models/Qwen2.5-0.5B-Instruct out_dir=runs/qwen_sokoban
  tpu/run.sh --name bmrl-v5p --zone us-east5-a --command sweep --config configs/sweep_budgets.yaml --detach
EOF
}

die() { echo "run.sh: $*" >&2; echo >&2; usage >&2; exit 2; }

NAME="${TPU_NAME:-}"; ZONE="${ZONE:-}"; CONFIG="${CONFIG:-}"; COMMAND=train; TAG=""; PROJECT="${PROJECT:-}"
DISTRIBUTED=auto; DETACH=0; TAIL=0; DRY_RUN=0; EXTRA_ENV=(); OVERRIDES=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --name) NAME="${2:?--name needs a value}"; shift 2 ;;
    --zone) ZONE="${2:?--zone needs a value}"; shift 2 ;;
    --config) CONFIG="${2:?--config needs a value}"; shift 2 ;;
    --command) COMMAND="${2:?--command needs a value}"; shift 2 ;;
    --tag) TAG="${2:?--tag needs a value}"; shift 2 ;;
    --env) [[ "${2:-}" == *=* ]] || die "--env needs KEY=VALUE"; EXTRA_ENV+=("$2"); shift 2 ;;
    --no-distributed) DISTRIBUTED=off; shift ;;
    --detach) DETACH=1; shift ;;
    --tail) TAIL=1; shift ;;
    --project) PROJECT="${2:?--project needs a value}"; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; OVERRIDES+=("$@"); break ;;
    *=*) OVERRIDES+=("$1"); shift ;;
    *) die "unknown argument: $1" ;;
  esac
done
[[ -n "$NAME" ]] || die "missing --name (or TPU_NAME)"
[[ -n "$ZONE" ]] || die "missing --zone (or ZONE)"
case "$COMMAND" in
  train|sft|eval|reproduce|sweep|config) ;;
  *) die "unknown --command '$COMMAND'; choose train, sft, eval, reproduce, sweep or config" ;;
esac
[[ "$TAIL" == 1 || -n "$CONFIG" ]] || die "missing --config (or CONFIG)"
for o in "${OVERRIDES[@]+"${OVERRIDES[@]}"}"; do
  [[ "$o" == *=* ]] || die "override '$o' is not KEY=VALUE"
done

common=(--zone="$ZONE" --worker=all)
if [[ -n "$PROJECT" ]]; then common+=(--project="$PROJECT"); fi

# Quote for the remote shell; a value starting with ~/ becomes the worker's $HOME.
quote() {
  local q
  q="$(printf '%q' "$1")"
  q="${q/=\\~\//=\$HOME/}"
  [[ "$q" == \\~/* ]] && q="\$HOME/${q#\\~/}"
  printf '%s' "$q"
}

if [[ "$TAIL" == 1 ]]; then
  REMOTE='f=$(ls -t ~/bmrl-logs/*.log 2>/dev/null | head -n 1); if [ -n "$f" ]; then echo "== $(hostname) $f"; tail -n 20 "$f"; else echo "== $(hostname): no logs"; fi'
else
  [[ -n "$TAG" ]] || TAG="$(basename "${CONFIG%.*}")-$(date -u +%Y%m%d-%H%M%S)"
  if [[ "$COMMAND" == sweep ]]; then
    BMRL_ARGS="sweep $(quote "$CONFIG")"
  else
    BMRL_ARGS="$COMMAND --config $(quote "$CONFIG")"
  fi
  if [[ "$COMMAND" == train ]]; then BMRL_ARGS+=" --no-progress"; fi
  for o in "${OVERRIDES[@]+"${OVERRIDES[@]}"}"; do BMRL_ARGS+=" $(quote "$o")"; done
  ENV_LINE="export BMRL_DISTRIBUTED=$DISTRIBUTED"
  for e in "${EXTRA_ENV[@]+"${EXTRA_ENV[@]}"}"; do ENV_LINE+=" $(quote "$e")"; done
  LOG="~/bmrl-logs/$(quote "$TAG")-\$(hostname).log"
  if [[ "$DETACH" == 1 ]]; then
    LAUNCH="nohup ~/bmrl-venv/bin/bmrl $BMRL_ARGS > $LOG 2>&1 < /dev/null & echo \"\$(hostname): started, log $LOG\""
  else
    LAUNCH="~/bmrl-venv/bin/bmrl $BMRL_ARGS 2>&1 | tee $LOG"
  fi
  REMOTE="set -euo pipefail; cd ~/bmrl; mkdir -p ~/bmrl-logs; $ENV_LINE; $LAUNCH"
fi

cmd=(gcloud compute tpus tpu-vm ssh "$NAME" "${common[@]}" --command="$REMOTE")
if [[ "$DRY_RUN" == 1 ]]; then
  printf '%q ' "${cmd[@]}"; echo
  exit 0
fi
command -v gcloud >/dev/null || { echo "run.sh: gcloud is not installed (https://cloud.google.com/sdk/docs/install)" >&2; exit 1; }
"${cmd[@]}"
