#!/usr/bin/env bash
# Runs the long study grids from one pinned commit, niced and resumable, so that later changes to main cannot
# change a run halfway. Rerunning the same command after any stop resumes every unfinished run from its
# checkpoint and reuses the finished ones (stalesgd.studies: a sweep resumes).
#
#   experiments/run_pinned.sh COMMIT GRID [GRID ...]     run (or resume) the grids
#   experiments/run_pinned.sh save GRID [GRID ...]       keep what finished, in the repository
#
# `save` copies each finished run's record (config.json, dataset.json, metrics.jsonl, summary.json; no checkpoints) to
# results/<grid's directory>/runs/, and once the whole grid has finished writes its report there with this checkout's
# code (the report's code, not the runs'); it then rewrites what it saved with this checkout's
# experiments/relative_result_paths.py, so that results/ names no absolute path of this machine. An unfinished run
# that has written a checkpoint is kept too, with its newest checkpoint only (1-18 MB for the CIFAR-10 grids),
# replacing the one an earlier `save` kept; not its schedule.npz (16 MB for a 140-epoch CIFAR-10 run), which a run
# computes from its config and seed and writes again when it resumes without it. A later run of the grid, on this
# machine or a fresh one, first copies what was kept back into any run directory it lacks: finished runs are read back
# instead of trained again, unfinished ones resume from the kept checkpoint. So a session that ends with `save` and a
# commit loses nothing but the updates since each unfinished run's newest checkpoint (config.checkpoint_every_seconds,
# 5 minutes). While a grid is unfinished, `save` also writes its progress report (`stalesgd-reproduce --progress`:
# every run's test error so far, marked unfinished) to results/<grid's directory>/progress/.
#
# GRID (each one stalesgd-reproduce command, its seeds and variants fixed here before the first run):
#   zhang_e20        Zhang et al. on CIFAR-10 at E = 20: hardsync, 15- and 30-softsync alpha0/sigma, seeds 0-2
#   zhang_e140       the seed papers' claims at the full 140 epochs on CIFAR-10, evaluated every epoch: hardsync and
#                    30-softsync alpha0/sigma, then the single learner and 1-softsync at mu lambda = 120, then
#                    15-softsync alpha0/sigma, seeds 0-2 (about 34 h of 2 cores for the first four, 43 h in all)
#   dcs3gd_e10       DC-S3GD on CIFAR-10 at E = 10 with warm-up: S = 0, S3GD and DC-S3GD at S = 1 and 4, seeds 0-2
#   mu_lambda_mnist  Rudra's mu x lambda rule on MNIST: the baseline and mu lambda = 120, 480, 3840, seeds 0-2
#   dcasgd_mnist     Zheng et al.'s ordering on MNIST: SGD, ASGD, DC-ASGD-c, DC-ASGD-a at M = 4 and 8, seeds 0-2
#   streaming_digits streaming DiLoCo on the embedded digits: DiLoCo and 12 (P, tau, alpha), seeds 0-2
#   delayed_digits   the one-round-delayed outer step against DiLoCo at M = 2, 4, 8 on the digits, seeds 0-2
#   eager_digits     eager updates on the delayed outer step against DiLoCo at M = 2, 4, 8 on the digits, seeds 0-2
#   zhang_mnist_confirm  Zhang et al.'s MNIST grid again, on seeds 3-5 that no earlier run used, its claims unchanged
#                    (confirmatory: the first grid's rule was fixed after its runs began)
#   demo_confirm     the demo's grid again on seeds 3-5, its claims unchanged (confirmatory, as above)
#   kale_pilot       the pilot of kale_outer_steps_digits: DiLoCo, the one-round-delayed step and eager at M = 2, 4, 8,
#                    outer rate in {0.1, 0.2, 0.35, 0.5, 0.7}, seeds 100-101, on a validation split (90 runs)
#   kale_digits      its decision grid at the rates kale_pilot chose (run kale_pilot first), seeds 0-2
#   streaming_pilot  the pilot of streaming_diloco_digits_piloted (DiLoCo and 12 streaming variants, 130 runs)
#   streaming_piloted  its decision grid at the rates streaming_pilot chose, seeds 0-2
#   liu_toy_notebook Liu et al.'s toy with the notebook's heavy-ball outer momentum (the grid of liu_toy, which ran
#                    Nesterov), seeds 0-2
#   liu_toy          Liu et al.'s toy: DiLoCo, async local SGD, async + delayed Nesterov + dynamic H, DiLoCo at each
#                    async variant's simulated time, seeds 0-2
#
# The code runs from a git worktree of COMMIT under $PINNED_ROOT (default runs/pinned/code-COMMIT), with the
# repository's .venv (make test creates it); runs go to $PINNED_ROOT/<grid>. Where the clone is laid anew between
# sessions but the machine is kept, set PINNED_ROOT outside the clone: the runs and their checkpoints stay there,
# and a worktree whose repository went away is made again from this clone. Environment:
#   CIFAR10_NPZ  directory of cifar10_{train,test}.npz (docs/data.md), default /tmp/cifar10_npz
#   MNIST_NPZ    directory of mnist_{train,test}.npz, default /tmp/mnist_npz
#   PARALLEL     concurrent runs per grid (default 1); NICE  niceness (default 19)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
usage="usage: $0 COMMIT GRID [GRID ...] | $0 save GRID [GRID ...]"
action="${1:?$usage}"
shift
[ "$#" -gt 0 ] || { echo "$usage" >&2; exit 2; }
root="${PINNED_ROOT:-$repo/runs/pinned}"
python="$repo/.venv/bin/python"
cifar10="${CIFAR10_NPZ:-/tmp/cifar10_npz}"
mnist="${MNIST_NPZ:-/tmp/mnist_npz}"
parallel="${PARALLEL:-1}"
RECORD_FILES="config.json dataset.json metrics.jsonl summary.json"
[ -x "$python" ] || { echo "$python is missing: run make test (or make .venv/.stalesgd-installed) first" >&2; exit 2; }

results_dir() {  # where a grid's report and finished runs are kept in the repository
  case "$1" in
    zhang_e20) echo "$repo/results/zhang_cifar10_e20_3seeds" ;;
    zhang_e140) echo "$repo/results/zhang_cifar10_e140_3seeds" ;;
    dcs3gd_e10) echo "$repo/results/dcs3gd_cifar10_e10_3seeds" ;;
    mu_lambda_mnist) echo "$repo/results/rudra_mu_lambda_mnist_3seeds" ;;
    dcasgd_mnist) echo "$repo/results/dcasgd_mnist_3seeds" ;;
    streaming_digits) echo "$repo/results/streaming_diloco_digits_3seeds" ;;
    delayed_digits) echo "$repo/results/delayed_outer_step_digits_3seeds" ;;
    eager_digits) echo "$repo/results/eager_outer_step_digits_3seeds" ;;
    liu_toy) echo "$repo/results/liu_toy_3seeds" ;;
    liu_toy_notebook) echo "$repo/results/liu_toy_notebook_3seeds" ;;
    zhang_mnist_confirm) echo "$repo/results/zhang_mnist_seeds3to5" ;;
    kale_pilot) echo "$repo/results/kale_outer_steps_digits_pilot" ;;
    kale_digits) echo "$repo/results/kale_outer_steps_digits_3seeds" ;;
    streaming_pilot) echo "$repo/results/streaming_diloco_digits_piloted_pilot" ;;
    streaming_piloted) echo "$repo/results/streaming_diloco_digits_piloted_3seeds" ;;
    demo_confirm) echo "$repo/results/demo_seeds3to5" ;;
  esac
}

earlier_grid() {  # a finished report drawn beside a grid's progress report (stalesgd-reproduce --compare_with)
  case "$1" in
    zhang_e140) echo "--compare_with=results/zhang_cifar10_e20_3seeds" ;;  # relative: the report names it as given
  esac
}

grid_flags() {
  case "$1" in
    zhang_e20) echo "--study=zhang_cifar10 --data_source=npz --data_dir=$cifar10 --schedule_epochs=20 --eval_every=1 \
--seeds=3 --variants=hardsync,15_softsync_a0_sigma,30_softsync_a0_sigma" ;;
    zhang_e140) echo "--study=zhang_cifar10_e140 --data_source=npz --data_dir=$cifar10 --eval_every=1 --seeds=3 \
--variants=hardsync,30_softsync_a0_sigma,baseline_lambda_1_mu_128,1_softsync_mu_lambda_120_mu_4,15_softsync_a0_sigma" ;;
    dcs3gd_e10) echo "--study=dcs3gd_cifar10 --data_source=npz --data_dir=$cifar10 --schedule_epochs=10 \
--eval_every=0.5 --seeds=3 --variants=all_reduce_sgd_s_0,s3gd_s_1,dc_s3gd_layer_wise_s_1,s3gd_s_4,dc_s3gd_layer_wise_s_4" ;;
    mu_lambda_mnist) echo "--study=rudra_mu_lambda_mnist --data_source=npz --data_dir=$mnist --seeds=3 \
--variants=baseline_lambda_1_mu_128,1_softsync_mu_lambda_120_mu_4,1_softsync_mu_lambda_480_mu_16,1_softsync_mu_lambda_3840_mu_128" ;;
    dcasgd_mnist) echo "--study=dcasgd_mnist --data_source=npz --data_dir=$mnist --seeds=3" ;;
    streaming_digits) echo "--study=streaming_diloco_digits --seeds=3" ;;
    delayed_digits) echo "--study=delayed_outer_step_digits --seeds=3" ;;
    eager_digits) echo "--study=eager_outer_step_digits --seeds=3" ;;
    liu_toy | liu_toy_notebook) echo "--study=liu_toy_async_local_sgd --seeds=3" ;;
    zhang_mnist_confirm) echo "--study=zhang_mnist --data_source=npz --data_dir=$mnist --first_seed=3 --seeds=3" ;;
    demo_confirm) echo "--study=demo --first_seed=3 --seeds=3" ;;
    kale_pilot) echo "--study=kale_outer_steps_digits --pilot" ;;
    kale_digits) echo "--study=kale_outer_steps_digits --seeds=3 --pilot_dir=$root/kale_pilot" ;;
    streaming_pilot) echo "--study=streaming_diloco_digits_piloted --pilot" ;;
    streaming_piloted) echo "--study=streaming_diloco_digits_piloted --seeds=3 --pilot_dir=$root/streaming_pilot" ;;
    *) echo "unknown grid '$1'; allowed: zhang_e20 zhang_e140 dcs3gd_e10 mu_lambda_mnist dcasgd_mnist streaming_digits delayed_digits eager_digits liu_toy liu_toy_notebook zhang_mnist_confirm demo_confirm kale_pilot kale_digits streaming_pilot streaming_piloted" >&2
      return 2 ;;
  esac
}

finished() {  # a run directory whose summary says it finished, or that a study recorded as diverged
  [ -f "$1/diverged.json" ] || { [ -f "$1/summary.json" ] \
    && "$python" -c 'import json,sys; sys.exit(json.load(open(sys.argv[1]))["preempted"])' "$1/summary.json"; }
}

newest_checkpoint() {  # the newest complete checkpoint step of a run directory, or nothing
  find "$1/checkpoints" -mindepth 1 -maxdepth 1 -type d -regex '.*/[0-9]+' -exec test -e '{}/_CHECKPOINT_METADATA' \; \
    -printf '%f\n' 2>/dev/null | sort -n | tail -n 1
}

if [ "$action" = save ]; then
  for grid in "$@"; do
    flags="$(grid_flags "$grid")"
    kept="$(results_dir "$grid")"
    complete=1
    while IFS= read -r run; do
      copy="$kept/runs/${run#"$root/$grid/"}"
      if finished "$run"; then
        rm -rf "$copy"
        mkdir -p "$copy"
        for name in $RECORD_FILES diverged.json; do
          [ -f "$run/$name" ] && cp "$run/$name" "$copy/"
        done
      else
        complete=0
        step="$(newest_checkpoint "$run")"
        if [ -n "$step" ]; then  # unfinished: its records so far and its newest checkpoint
          rm -rf "$copy"
          mkdir -p "$copy/checkpoints"
          for name in $RECORD_FILES; do
            [ -f "$run/$name" ] && cp "$run/$name" "$copy/"
          done
          cp -r "$run/checkpoints/$step" "$copy/checkpoints/"
          echo "$grid: unfinished ${run#"$root/$grid/"} kept at update $step"
        fi
      fi
    done < <(find "$root/$grid" -mindepth 2 -maxdepth 2 -type d -name 'seed_*' | sort)
    if [ "$complete" = 0 ]; then  # a progress report, marked unfinished (stalesgd.studies._progress)
      # shellcheck disable=SC2086  # the flags are words
      (cd "$repo" && "$python" -m stalesgd.cli.reproduce $flags $(earlier_grid "$grid") --workdir="$root/$grid" \
        --progress >/dev/null)
      rm -rf "$kept/progress"
      cp -r "$root/$grid/progress" "$kept/"
    fi
    if [ "$complete" = 1 ]; then
      # The report keeps its README's hand-kept Notes: give it the repository's, where they are written.
      [ -f "$kept/README.md" ] && cp "$kept/README.md" "$root/$grid/README.md"
      # shellcheck disable=SC2086  # the flags are words
      (cd "$repo" && "$python" -m stalesgd.cli.reproduce $flags --workdir="$root/$grid" --gather)
      find "$root/$grid" -maxdepth 1 -type f ! -name sessions.log -exec cp {} "$kept/" \;
      cp "$root/$grid/sessions.log" "$kept/"
    fi
    # The report, the progress report and hand-kept Notes with no absolute path of this machine: workdirs relative to
    # the study's directory, data directories as $DATA_DIR (the reports may come from code older than these rules).
    "$python" "$repo/experiments/relative_result_paths.py" "$kept"
    echo "$grid: finished runs kept in $kept/runs$([ "$complete" = 1 ] && echo ", report written")"
  done
  exit 0
fi

commit="$(git -C "$repo" rev-parse --verify "$action^{commit}")"
code="$root/code-${commit:0:12}"
if [ -d "$code" ] && [ "$(git -C "$code" rev-parse HEAD 2>/dev/null)" != "$commit" ]; then
  # made by another clone (laid anew since): its runs would record no commit; make it again from this clone
  rm -rf "$code"
  git -C "$repo" worktree prune
fi
if [ ! -d "$code" ]; then
  mkdir -p "$root"
  git -C "$repo" worktree add --detach "$code" "$commit"
fi

for grid in "$@"; do
  flags="$(grid_flags "$grid")"
  mkdir -p "$root/$grid"
  kept="$(results_dir "$grid")/runs"
  if [ -d "$kept" ]; then  # runs saved by an earlier session: finished ones read back, unfinished ones resumed
    (cd "$kept" && find . -mindepth 2 -maxdepth 2 -type d -name 'seed_*' | sort) | while IFS= read -r run; do
      [ -e "$root/$grid/$run" ] || { mkdir -p "$root/$grid/$run" && cp -r "$kept/$run"/. "$root/$grid/$run/"; }
    done
  fi
  echo "$(date -u +%FT%TZ) start $grid at $commit on $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)" \
    | tee -a "$root/$grid/sessions.log"
  # shellcheck disable=SC2086  # the flags are words
  (cd "$code" && nice -n "${NICE:-19}" "$python" -m stalesgd.cli.reproduce $flags --parallel="$parallel" \
    --workdir="$root/$grid")
  echo "$(date -u +%FT%TZ) end $grid" | tee -a "$root/$grid/sessions.log"
done
