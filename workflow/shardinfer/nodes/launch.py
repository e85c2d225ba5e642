"""The engine's node ranks beyond the first: started, watched and stopped by the shard job (rank 0).

Each rank is `python -m shardinfer.nodes.vllm_worker <spec>` (vLLM's headless workers, no engine of
their own), started as an `srun` step on its node inside a Slurm job (`--overlap`: beside the job's own
step when they share a node), or as a process on this host otherwise (`shardinfer.nodes.placement`).
Its output goes to the shard log.

- **A rank lost is one line, in bounded time.** A watchdog thread polls each rank's process (the
  srun client follows its step: a node that dies or a task killed ends it); when one ends while the
  engine runs, it signals this process (LOST_SIGNAL), which the shard job turns into a clean stop
  (`shardinfer.shard.stop`): the windows already predicted are committed, and the job fails with one
  line naming the rank and its node, never waiting in a collective for a rank that is gone. If the
  job has not ended GRACE_S later, the watchdog ends it. vLLM's engine may see the loss first (a
  collective fails) and the shard job start it again (`shardinfer.engines.vllm.feeder`): the ranks it
  would replace are given RESTART_WAIT_S to show they ended, so a lost rank is reported, not restarted.
- **No rank outlives the job.** The shard job stops its ranks when it exits (SIGTERM, then SIGKILL
  after STOP_S; a finished engine leaves vLLM's headless workers waiting for ever). Each rank also
  reads its stdin, a pipe from rank 0, and stops at its end: rank 0 killed outright (SIGKILL) closes it.
  On Slurm, the job's end also ends every step, and `scancel` signals them all.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass

from shardinfer.nodes.placement import Placement
from shardinfer.nodes.share import RankShare

log = logging.getLogger(__name__)

LOST_SIGNAL = signal.SIGUSR2
GRACE_S = 60.0  # after a rank is lost: the most the shard job may take to commit and stop
STOP_S = 15.0  # a rank asked to stop: then it is killed
POLL_S = 0.2
RESTART_WAIT_S = 5.0  # before an engine's ranks are replaced: the time a rank that died has to show it
WORKER_MODULE = "shardinfer.nodes.vllm_worker"
_lost: list[str] = []  # why the engine lost a rank (LOST_SIGNAL's reason), once one is lost


def lost_rank() -> str:
    """What LOST_SIGNAL stands for, for the shard job's one line."""
    return _lost[0] if _lost else "the loss of one of the engine's node ranks"


def how_it_ended(code: int) -> str:
    """A process's end: `killed by SIGKILL` (local), `exit status 137 (SIGKILL)` (srun's task), ..."""
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    if 128 < code < 128 + signal.NSIG:
        return f"exit status {code} ({signal.Signals(code - 128).name})"
    return f"exit status {code}"


@dataclass
class Rank:
    number: int
    host: str
    process: subprocess.Popen


def worker_spec(share: RankShare, arguments: dict) -> str:
    """The worker's command-line argument: its share of its host and vLLM's engine arguments."""
    return json.dumps({"share": asdict(share), "arguments": arguments})


def srun_command(placement: Placement, rank: int, threads: int) -> list[str]:
    """One task on the rank's node, as a step of the shard's own job (`--overlap`: its CPUs and GPUs
    may be the job's own step's, where they share a node)."""
    return ["srun", f"--jobid={placement.job}", "--overlap", "--nodes=1", "--ntasks=1",
            f"--nodelist={placement.hosts[rank]}", f"--cpus-per-task={threads}", f"--job-name=shardinfer-rank{rank}"]


def srun_environment(env: dict) -> dict:
    """The shard step's environment without its SLURM_* settings (its task count, its GPUs), which
    srun would take for the new step's; the job ID stays."""
    kept = {"SLURM_JOB_ID", "SLURM_CONF"}
    return {key: value for key, value in env.items()
            if key in kept or not key.startswith(("SLURM_", "SRUN_", "SBATCH_"))}


class Launch:
    """The ranks of one engine, started together; `stop` ends them."""

    def __init__(self, placement: Placement, ranks: list[Rank]) -> None:
        self.placement, self.ranks = placement, ranks
        self.stopping, self.reported = threading.Event(), threading.Lock()
        threading.Thread(target=self.watch, daemon=True, name="shardinfer-rank-watchdog").start()

    def watch(self) -> None:
        while not self.stopping.wait(POLL_S):
            for rank in self.ranks:
                code = rank.process.poll()
                if code is not None and not self.stopping.is_set():
                    self.lose(rank, code)
                    return

    def report(self, rank: Rank, code: int) -> None:
        """Rank lost: this process told (LOST_SIGNAL), once."""
        with self.reported:
            if _lost:
                return
            how = how_it_ended(code)
            how = f"its srun step ended: {how}" if self.placement.scheduler == "slurm" else how
            _lost[:] = [f"the loss of the engine's rank {rank.number} on {self.placement.where(rank.number)} ({how})"]
        os.kill(os.getpid(), LOST_SIGNAL)

    def await_loss(self, seconds: float) -> None:
        """Before the ranks are replaced (vLLM's engine died, and the shard job starts it again): a rank
        that ended, or ends within `seconds` (its srun step may take that long to follow its task),
        is a rank lost, reported as the watchdog would, not a reason to start the engine again."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for rank in self.ranks:
                code = rank.process.poll()
                if code is not None:
                    self.report(rank, code)
                    return
            time.sleep(POLL_S)

    def lose(self, rank: Rank, code: int) -> None:
        """The watchdog's: the rank reported, and this process ended if it has not stopped GRACE_S later."""
        self.report(rank, code)
        if not self.stopping.wait(GRACE_S):
            log.error("%s; the shard job did not stop within %.0f s, so it is ended now", _lost[0], GRACE_S)
            self.stop()
            os._exit(1)

    def stop(self) -> None:
        """Each rank asked to stop (its stdin closed, SIGTERM), then killed after STOP_S."""
        self.stopping.set()
        for rank in self.ranks:
            if rank.process.poll() is None:
                self.signal(rank, signal.SIGTERM)
        deadline = time.monotonic() + STOP_S
        for rank in self.ranks:
            try:
                rank.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("rank %d on %s did not stop in %.0f s: killed", rank.number,
                            self.placement.where(rank.number), STOP_S)
                self.signal(rank, signal.SIGKILL)
                rank.process.wait()

    def signal(self, rank: Rank, number: int) -> None:
        """A local rank's whole process group (its vLLM workers too); srun forwards to its step."""
        if rank.process.stdin is not None and not rank.process.stdin.closed:
            rank.process.stdin.close()
        try:
            if self.placement.scheduler == "local":
                os.killpg(rank.process.pid, number)
            else:
                rank.process.send_signal(number)
        except ProcessLookupError:
            pass


_current: list[Launch] = []


def stop_ranks() -> None:
    """Stop the ranks this process started (at exit, and before an engine is started again)."""
    while _current:
        _current.pop().stop()


atexit.register(stop_ranks)


def start_ranks(placement: Placement, shares: list[RankShare], arguments: dict, master_port: int) -> Launch:
    """Start ranks 1.. of the engine, each with its share and vLLM's arguments for its node rank (those
    of an engine started before, stopped first, unless one of them was lost)."""
    for launched in _current:
        launched.await_loss(RESTART_WAIT_S)
    stop_ranks()
    _lost.clear()
    ranks = []
    env = dict(os.environ)
    for share in shares[1:]:
        spec = worker_spec(share, {**arguments, "node_rank": share.rank, "master_addr": placement.master_addr,
                                   "master_port": master_port})
        command = [sys.executable, "-m", WORKER_MODULE, spec]
        if placement.scheduler == "slurm":
            command, started = srun_command(placement, share.rank, share.threads) + command, srun_environment(env)
        else:
            started = env
        process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=sys.stderr.fileno(),
                                   stderr=sys.stderr.fileno(), env=started,
                                   start_new_session=placement.scheduler == "local")
        ranks.append(Rank(share.rank, placement.hosts[share.rank], process))
        log.info("started the engine's rank %d on %s (pid %d%s)", share.rank, placement.where(share.rank),
                 process.pid, ", an srun step" if placement.scheduler == "slurm" else "")
    launch = Launch(placement, ranks)
    _current.append(launch)
    return launch
