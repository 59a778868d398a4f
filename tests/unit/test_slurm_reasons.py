"""Why a SLURM job waits, from squeue's reason, and why it left the queue without a result,
from slurmstepd's lines in its log.

The logs are SLURM's own lines, as this project's one-node cluster wrote them (a job past its
time limit, a scancel, a requeue and then a time-limit warning), and the out-of-memory line in
the form public job logs show it."""

import subprocess

import pytest

from odc_bench.cli.slurm_logs import why_it_ended

TIMED_OUT = """\
submitit WARNING (2026-12-07 22:40:45,001) - Bypassing signal SIGCONT
slurmstepd-localhost: error: *** STEP 503.0 ON localhost CANCELLED AT 2026-12-07T22:42:06 DUE TO TIME LIMIT ***
slurmstepd-localhost: error: *** JOB 503 ON localhost CANCELLED AT 2026-12-07T22:42:06 DUE TO TIME LIMIT ***
srun: got SIGCONT
srun: forcing job termination
srun: error: localhost: task 1: Killed
"""
SCANCELLED = """\
srun: Job step aborted: Waiting up to 7 seconds for job step to finish.
slurmstepd-localhost: error: *** STEP 511.0 ON localhost CANCELLED AT 2026-12-07T22:43:11 ***
slurmstepd-localhost: error: *** JOB 511 ON localhost CANCELLED AT 2026-12-07T22:43:11 ***
srun: error: localhost: task 0: Terminated
"""
REQUEUED = """\
slurmstepd-localhost: error: *** JOB 500 ON localhost CANCELLED AT 2026-12-07T22:36:29 DUE TO JOB REQUEUE ***
slurmstepd-localhost: error: *** STEP 500.0 ON localhost CANCELLED AT 2026-12-07T22:36:29 DUE TO JOB REQUEUE ***
submitit WARNING (2026-12-07 22:38:06,213) - Caught signal SIGUSR2 on localhost: this job is timed-out.
"""
OUT_OF_MEMORY = ("slurmstepd: error: Detected 1 oom-kill event(s) in StepId=706.0. Some of your processes may have "
                 "been killed by the cgroup out-of-memory handler.\nsrun: error: c-8-42: task 0: Out Of Memory\n")


@pytest.mark.parametrize(("log", "said"), [
    (TIMED_OUT, "SLURM cancelled it at its time limit: raise hydra.launcher.timeout_min"),
    (SCANCELLED, "it was cancelled (scancel)"),
    (OUT_OF_MEMORY, "SLURM killed a task out of memory: raise hydra.launcher.mem_gb"),
    (REQUEUED + TIMED_OUT, "SLURM cancelled it at its time limit"),  # the last attempt's end counts
    (TIMED_OUT.replace("TIME LIMIT", "PREEMPTION"), "SLURM preempted it"),
    (TIMED_OUT.replace("TIME LIMIT", "SOMETHING NEW"), "SLURM cancelled it (something new)"),
])
def test_slurms_own_line_says_why_the_job_ended(log, said):
    assert why_it_ended(log).startswith(said)


@pytest.mark.parametrize("log", ["", REQUEUED, "Traceback (most recent call last):\nKeyError: 'x'\n"])
def test_a_log_without_slurms_reason_says_nothing(log):
    assert why_it_ended(log) == ""


def test_submitits_refusal_to_requeue_is_said_in_the_launchers_settings():
    """submitit raises UncompletedJobError from its time-limit handler, into the run, once the job
    has used its requeues (or max_num_timeout=0): the run's row said it in submitit's words only."""
    from submitit.core.utils import UncompletedJobError

    from odc_bench.run.slurm_task import in_words

    said = in_words(UncompletedJobError("Job not requeued because: timed-out too many times."))
    assert said.startswith("SLURM warned that the job's time limit was near"), said
    assert "(UncompletedJobError: Job not requeued because: timed-out too many times.)" in said, said
    assert said.endswith("raise timeout_min, or set checkpoint.every and raise max_num_timeout"), said
    assert in_words(KeyError("x")) == "KeyError: 'x'"
    # The last stop's CI: the warning and the time-out at one check, SLURM's SIGTERM killing the requeue.
    killed = subprocess.CalledProcessError(-15, ["scontrol", "requeue", "494"])
    assert in_words(killed) == ("SLURM ended the job (its time limit, or a cancel) while submitit requeued it at "
                                "SLURM's warning (CalledProcessError: Command '['scontrol', 'requeue', '494']' died "
                                "with <Signals.SIGTERM: 15>.); run the sweep again to resume from the newest "
                                "checkpoint")


@pytest.mark.parametrize(("reason", "nodes", "said"), [
    # squeue's reason for cpus_per_task=64 on this cluster's one 2-CPU node: the node count fits.
    ("PartitionConfig", "1", "it asks for more than partition debug offers, so SLURM will not start it: compare "
                             "hydra.launcher.cpus_per_task x tasks_per_node, mem_gb, gpus_per_node and timeout_min "
                             "with sinfo -p debug -o '%D %c %m %G %l' (SLURM: PartitionConfig)"),
    ("PartitionConfig", "2", "needs 2 nodes, partition debug has 1 (SLURM: PartitionConfig)"),
    ("Resources", "1", "needs 1 node, partition debug has 1 (SLURM: Resources)"),
    ("BeginTime", "1", "SLURM: BeginTime"),
])
def test_a_pending_jobs_reason_says_what_to_change(monkeypatch, reason, nodes, said):
    from odc_bench.cli import slurm

    monkeypatch.setattr(slurm, "_partition_nodes", lambda partition: 1)
    assert slurm.pending_reason(reason, "debug", nodes) == said
