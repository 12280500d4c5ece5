"""Launch one process per rank, supervise them, keep their logs: `clorch.launch`.

Also re-exported from `clorch.distributed` (`clorch.distributed.launch`).

Usage::

    from clorch.distributed import launch

    def train(ctx):                      # in an importable module, e.g. my_pkg/train.py
        ...                              # the process group is initialized
        return {"loss": 0.1}             # JSON -> job_status(job)["results"][rank]

    job = launch("my_pkg.train:train", nproc_per_node=2, args={"epochs": 3}, timeout=3600)
    status = job.wait()                  # or await_job(job)
    print(status["state"], job.logs(0)["stdout"])

From a shell: ``python -m clorch.launch --nproc-per-node 2 my_pkg.train:train``.

**The ranks.** Every rank is a fresh interpreter
(``python -m clorch.launch.child``; no fork of the launcher's torch state),
started in its own session. It gets RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, GROUP_RANK (the node), MASTER_ADDR, MASTER_PORT,
CLORCH_RESTART_COUNT, PYTHONUNBUFFERED=1, the multicast-off variables
(NCCL_NVLS_ENABLE=0, ...), on GPUs CUDA_VISIBLE_DEVICES holding its one device,
and with more than one local rank OMP_NUM_THREADS=1 unless already set. It
joins the group (`clorch.distributed.process_group(backend)`), calls
``main(ctx)`` with ctx = {"rank", "local_rank", "world_size", "backend",
"process_group" (torch.distributed.group.WORLD), "args"} and leaves the group
when main returns or raises. ``backend=None`` starts plain processes: no group,
no torch import. ``master_port=None`` picks a free port for every start.

**Logs** (kept after every ending) go to ``log_dir`` (default: a fresh
``clorch-job-*`` directory under the system temp dir, ``job.log_dir``):
``rank_{r}.stdout`` / ``rank_{r}.stderr`` (written directly by the rank,
unbuffered, so the last line before a crash is there), ``rank_{r}.error.json``
(type, message, traceback of the exception that ended the rank, like torchrun's
error file), ``rank_{r}.result.json`` (main's return value), ``args.json`` and
``job.json``: the record (config, command, pids, ports, status) that
``Job.open(log_dir)`` reads from any process.

**Failure modes.**
* Fail-fast: when a rank exits non-zero, the others get SIGTERM and, after
  ``grace_period`` seconds (default 10), SIGKILL. The status names the rank that
  failed first (``failed_rank``) and carries its error and traceback.
* Exit codes, per rank in ``status["exit_codes"]``: main's ``sys.exit(n)`` keeps
  n; an exception gives 1; death by a signal gives ``-signum`` (as
  ``subprocess``) and ``status["signals"]`` names it ("SIGSEGV", "SIGKILL" for
  the OOM killer).
* ``timeout`` (seconds, for the whole job) ends a hung job: state "timed_out".
* ``max_restarts`` > 0: a failed job restarts as a whole group (fresh port,
  CLORCH_RESTART_COUNT = 1, 2, ...); ``status["attempts"]`` records each start.
* No orphans: a rank's children live in its process group and are killed with
  it, after any ending. A descendant that leaves the rank's group or session
  (``start_new_session``, ``process_group=0``, a double-forked daemon) is
  caught too: the launching process makes itself a child subreaper
  (PR_SET_CHILD_SUBREAPER, Linux), so such orphans are reparented to it, and
  when a job ends it SIGKILLs and reaps every one carrying that job's marker
  (CLORCH_LAUNCHER_PID and CLORCH_JOB_ID, inherited from the rank). Its own
  other children and other jobs' processes are left alone. Each rank asks for
  SIGKILL when its launcher dies (PR_SET_PDEATHSIG), so even a launcher killed
  by SIGKILL leaves no rank running (escaped descendants do survive that).
* ``Job.open(log_dir).stop()`` from another process on the launcher's host
  signals the ranks' groups itself: SIGTERM, SIGKILL after ``grace_period``;
  when the launcher is gone it records the end itself instead of waiting.
* The launcher on SIGINT or SIGTERM forwards the signal to every rank's group,
  escalates to SIGKILL after the grace period (state "stopped"), and then acts
  on the signal as it would have (KeyboardInterrupt; termination).

**Exit-code policy of ``python -m clorch.launch``**: 0 when the job succeeded;
the first failing rank's exit code when it exited with one (1 for an
exception, n for ``sys.exit(n)``); 128 + signum when that rank was killed by a
signal; 124 on "timed_out" (as timeout(1)); 143 when the job was stopped
(`stop_job` from another process, or SIGTERM to the launcher, which then dies
by SIGTERM itself); 130 on SIGINT (Ctrl-C: KeyboardInterrupt after the ranks
were told); 2 for invalid arguments.

**Multi-node.** Run one launcher per node with the same ``nnodes``,
``master_addr`` (node 0's address), ``master_port`` and its own ``node_rank``;
rank = node_rank * nproc_per_node + local_rank. The ranks meet over
torch.distributed's TCP rendezvous (NCCL on GPUs). Each launcher supervises
its own node only; when a node fails, the other nodes' ranks fail at their next
collective and their launchers fail fast in turn.

**SLURM.** Inside an allocation (SLURM_NNODES, SLURM_NODEID,
SLURM_JOB_NODELIST set) and with nnodes/node_rank left at their defaults, the
launcher takes nnodes and node_rank from SLURM, master_addr from the first
host of SLURM_JOB_NODELIST (when left at "127.0.0.1") and master_port
10000 + SLURM_JOB_ID % 50000 (when left at None). Start one launcher per node::

    #SBATCH --nodes=2 --ntasks-per-node=1 --gpus-per-node=8
    srun python -m clorch.launch my_pkg.train:train

**torchrun.** Workers written with ``clorch.distributed.process_group()`` also run
unchanged under ``torchrun --nproc-per-node N worker.py``, which sets the same
variables.
"""

from clorch.launch.job import Job
from clorch.launch.launcher import await_job, job_logs, job_status, launch, stop_job

__all__ = ["launch", "Job", "job_status", "await_job", "job_logs", "stop_job"]
