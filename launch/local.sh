#!/usr/bin/env bash
# Runs N JAX processes of one program on this machine (CPU, gloo collectives).
#
#   launch/local.sh N [program arguments...]
#
# Each process gets forced host CPU devices, and the flags
#   --coordinator_address=127.0.0.1:<free port> --num_processes=N --process_id=<i>
# before the program arguments. The program is `python -m stalesgd.cli.train`
# unless LAUNCH_MODULE names another module (or a .py script). The script waits
# for all processes; when one fails it stops the others and exits with the
# failed process's status (128+signal if it was killed), so a crash never leaves
# the rest blocked in a collective. Output lines are prefixed with [process i].
#
# Environment:
#   LAUNCH_MODULE              module or script to run (default stalesgd.cli.train)
#   LAUNCH_DEVICES_PER_PROCESS host devices per process (default 8/N; N must divide 8)
#   LAUNCH_PORT                coordinator port (default: a free one)
#   LAUNCH_KILL_GRACE          seconds between SIGTERM and SIGKILL for the others (default 5)
#   PYTHON                     interpreter (default .venv/bin/python if present, else python3)
#   JAX_PLATFORMS              default cpu
set -euo pipefail

usage() {
  echo "usage: $0 NUM_PROCESSES [program arguments...]" >&2
  exit 2
}

[[ $# -ge 1 ]] || usage
num_processes=$1
shift
if ! [[ "$num_processes" =~ ^[1-9][0-9]*$ ]]; then
  echo "local.sh: NUM_PROCESSES must be a positive integer, got '$num_processes'" >&2
  exit 2
fi

repository_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${PYTHON:-}
if [[ -z "$python" ]]; then
  if [[ -x "$repository_root/.venv/bin/python" ]]; then
    python="$repository_root/.venv/bin/python"
  else
    python=python3
  fi
fi

devices=${LAUNCH_DEVICES_PER_PROCESS:-}
if [[ -z "$devices" ]]; then
  if (( 8 % num_processes != 0 )); then
    echo "local.sh: NUM_PROCESSES=$num_processes does not divide 8 host devices; set LAUNCH_DEVICES_PER_PROCESS" >&2
    exit 2
  fi
  devices=$(( 8 / num_processes ))
elif ! [[ "$devices" =~ ^[1-9][0-9]*$ ]]; then
  echo "local.sh: LAUNCH_DEVICES_PER_PROCESS must be a positive integer, got '$devices'" >&2
  exit 2
fi

kill_grace=${LAUNCH_KILL_GRACE:-5}
if ! [[ "$kill_grace" =~ ^[0-9]+$ ]]; then
  echo "local.sh: LAUNCH_KILL_GRACE must be a whole number of seconds, got '$kill_grace'" >&2
  exit 2
fi

port=${LAUNCH_PORT:-$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
target=${LAUNCH_MODULE:-stalesgd.cli.train}
if [[ "$target" == *.py ]]; then
  program=("$python" "$target")
else
  program=("$python" -m "$target")
fi

export JAX_PLATFORMS=${JAX_PLATFORMS:-cpu}
export JAX_NUM_CPU_DEVICES=$devices
export JAX_CPU_COLLECTIVES_IMPLEMENTATION=gloo
export PYTHONUNBUFFERED=1
export PYTHONPATH="$repository_root${PYTHONPATH:+:$PYTHONPATH}"

pids=()
stopped_at=0
stop_all() {
  local signal=$1
  for pid in "${pids[@]}"; do
    kill "-$signal" -- "-$pid" 2>/dev/null || true
  done
}
# SIGTERM (a preemption notice) or Ctrl-C: pass SIGTERM on so every process saves a checkpoint and exits 75
# (preempted), then wait for them (SIGKILL after the grace period); the exit status is theirs.
on_stop_request() {
  echo "local.sh: stop requested; passing SIGTERM to every process (SIGKILL after ${kill_grace} s)" >&2
  stop_all TERM
  (( stopped_at > 0 )) || stopped_at=$(( SECONDS > 0 ? SECONDS : 1 ))
}
trap on_stop_request INT TERM

echo "local.sh: $num_processes x $devices host devices, coordinator 127.0.0.1:$port, running ${program[*]:1}" >&2
for (( process_id = 0; process_id < num_processes; process_id++ )); do
  # setsid: each process leads its own group, so stopping it stops its children too.
  setsid "${program[@]}" --coordinator_address="127.0.0.1:$port" --num_processes="$num_processes" \
      --process_id="$process_id" "$@" \
      > >(sed -u "s/^/[process $process_id] /") 2> >(sed -u "s/^/[process $process_id] /" >&2) &
  pids+=($!)
done

remaining=$num_processes
declare -A finished=()
status=0
killed=0
while (( remaining > 0 )); do
  # JAX traps SIGTERM (preemption notice) and so may the training loop, but a
  # process blocked in a collective never gets to act on it: escalate.
  if (( stopped_at > 0 && killed == 0 && SECONDS - stopped_at >= kill_grace )); then
    stop_all KILL
    killed=1
  fi
  for index in "${!pids[@]}"; do
    pid=${pids[$index]}
    [[ -n "${finished[$index]:-}" ]] && continue
    if ! kill -0 "$pid" 2>/dev/null; then
      set +e
      wait "$pid"
      exit_status=$?
      set -e
      finished[$index]=1
      remaining=$(( remaining - 1 ))
      if (( exit_status != 0 && status == 0 )); then
        status=$exit_status
        echo "local.sh: process $index exited with status $exit_status; stopping the others" >&2
        stop_all TERM
        stopped_at=$(( SECONDS > 0 ? SECONDS : 1 ))
      fi
    fi
  done
  (( remaining > 0 )) && sleep 0.2
done
exit "$status"
