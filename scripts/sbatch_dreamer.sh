#!/bin/bash
# Train on a SLURM cluster without Hydra launchers: submit, checkpoint before the
# time limit, requeue, resume.
#
#   sbatch scripts/sbatch_dreamer.sh experiment=dmc_cheetah_run_v1 seed=0
#   RUN_DIR=/scratch/me/cheetah0 sbatch scripts/sbatch_dreamer.sh experiment=dmc_cheetah_run_v1
#
# Arguments are `python -m dreamer` overrides. The run lives in $RUN_DIR (default
# outputs/sbatch/<job id>). SLURM sends USR1 to this script 120 s before the time
# limit (--signal=B:USR1@120; SIGTERM on preemption): it passes the signal to
# dreamer, which writes a checkpoint and exits 0, then requeues the job. The
# requeued job (same job id, same $RUN_DIR) finds the checkpoint and resumes.
# Edit the #SBATCH lines for your cluster. $PYTHON picks the interpreter.
#SBATCH --job-name=dreamer
#SBATCH --partition=gpu
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=8
#SBATCH --mem=64G
#SBATCH --time=04:00:00
#SBATCH --signal=B:USR1@120
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=slurm-%x-%j.out
set -euo pipefail

if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
    sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
fi
: "${SLURM_JOB_ID:?run this through sbatch (SLURM_JOB_ID is not set)}"
RUN_DIR=${RUN_DIR:-outputs/sbatch/${SLURM_JOB_ID}}
PYTHON=${PYTHON:-python}

args=("$@")
if compgen -G "$RUN_DIR/checkpoints/ckpt_*.pt" > /dev/null; then
    echo "resuming $RUN_DIR (restart ${SLURM_RESTART_COUNT:-?})"
    args+=("resume=$RUN_DIR")
fi

"$PYTHON" -m dreamer "hydra.run.dir=$RUN_DIR" logger.progress_bar=false "${args[@]}" &
pid=$!

checkpoint_and_requeue() {
    echo "stop signal: checkpointing and requeueing job $SLURM_JOB_ID"
    kill -USR1 "$pid" 2> /dev/null || true
    status=0
    wait "$pid" || status=$?
    if [[ $status -ne 0 ]]; then
        echo "dreamer exited with $status; not requeueing" >&2
        exit "$status"
    fi
    if compgen -G "$RUN_DIR/summary.json" > /dev/null; then
        exit 0  # it finished before the signal landed
    fi
    scontrol requeue "$SLURM_JOB_ID"
    exit 0
}
trap checkpoint_and_requeue USR1 TERM

wait "$pid"
