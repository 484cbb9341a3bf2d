# Sourced by launch/slurm.sbatch and launch/study_array.sbatch (bash): run a program so that a preempted run
# goes back into SLURM's queue and resumes.
#
# The scripts ask for `#SBATCH --signal=B:TERM@120` (SIGTERM to the batch shell 120 s before the time limit) and
# `#SBATCH --requeue`. run_requeueing_on_preemption starts the program in the background and passes a SIGTERM
# (that one, or a preemption's) on to it; every stalesgd program then saves a checkpoint and exits with status
# 75 (stalesgd.training.PREEMPTED_EXIT_STATUS: preempted, not finished). On 75 the job is requeued
# (`scontrol requeue`), and the same command resumes the run from its checkpoint; any other status is passed
# through unchanged, so a finished or failed run is never requeued.

PREEMPTED_EXIT_STATUS=75

run_requeueing_on_preemption() {
  "$@" &
  local child=$!
  trap 'echo "requeue_on_preemption: SIGTERM: passing it to the run (pid $child)" >&2; kill -TERM "$child" 2>/dev/null || true' TERM
  local status
  while true; do
    set +e
    wait "$child"
    status=$?
    set -e
    # wait returns early when the trap runs; wait again until the program itself has exited.
    kill -0 "$child" 2>/dev/null || break
  done
  trap - TERM
  if (( status == PREEMPTED_EXIT_STATUS )); then
    echo "requeue_on_preemption: the run was preempted (exit status $status, checkpointed): requeueing job ${SLURM_JOB_ID:?}" >&2
    scontrol requeue "$SLURM_JOB_ID"
  fi
  return "$status"
}
