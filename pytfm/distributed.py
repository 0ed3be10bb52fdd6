"""pytfm.distributed — data-parallel training on MPI: the same run on 1 process or on N.

    mpiexec -n 2 python examples/train_tiny.py      # two ranks train one global batch

Each of N ranks (processes, on one machine or several) holds the whole model. A step:

  1. every rank draws the global batch of the step (data.Batches.batch depends only on seed,
     split and step) and keeps its rows, shard_rows(B, rank, N): contiguous, sizes differing
     by at most one, their union exactly the batch one process would train on;
  2. forward and backward on those rows: the gradient of the mean loss over them;
  3. average_gradients: the gradient buffer scaled by the rank's share of the batch's targets,
     then summed over the ranks in place: the mean gradient of the global batch, the same bits
     on every rank;
  4. clipping and AdamW on every rank: the same gradients and parameters in, the same out (the
     kernels' results do not depend on the thread count either).

Identical parameters for any N. Every rank starts from rank 0's parameters (broadcast). MPI
does not promise that an all-reduce gives every rank the same bits when N > 2: an
implementation may add the N terms in a different order on each rank. With N = 2 each element
is one addition, a + b on one rank and b + a on the other, and IEEE addition commutes: one
in-place Allreduce. With N > 2 the sum is a Reduce_scatter (each element added up on exactly
one rank) and an Allgatherv (those bits copied to all): the two halves of a ring all-reduce, the
same bytes on the wire, identical by construction. check_identical() compares digests of a
buffer across ranks; train_tiny.py calls it before each checkpoint.

2 ranks at global batch B against 1 rank at batch B: the same batch, the same mean gradient up
to float32 rounding (the weight-gradient sums over the B·T rows are split in two partial sums).

Scalars (losses, flags) go through sum() and any(): an Allgather and a sum in rank order, so
every rank gets the same value (and so the same decision to stop).

Faults. Under N > 1 an exception that escapes on one rank (through guard() or to the top) prints
its traceback and one line naming the rank, then calls MPI_Abort, which ends every rank within
a second or so (the launcher prints that it did). A rank killed outright is seen by the launcher
(mpiexec), which ends the others. Neither hangs. A rank that stops without dying (a deadlock,
SIGSTOP, a machine that stops answering) is caught by the collective watchdog: every collective
of a World must complete within World.timeout seconds (default_timeout(): the environment
variable PYTFM_COLLECTIVE_TIMEOUT, else 600; train_tiny's --collective-timeout), else each rank
still waiting prints which rank did not arrive (and the collective and step of its last
arrival) and ends the job with MPI_Abort, within the timeout and about two seconds. How it
knows: a watchdog thread on each rank sends its peers a heartbeat every tick (timeout / 20,
between 0.05 and 1 s), and a rank that sends none for a second past the timeout (a stopped
process; the thread of a waiting one still runs) is the one named; where every rank answers,
those whose 16-byte note for this collective (its number and World.step, sent to the peers on
entering it, on a communicator of their own) never came. The wait includes the other
ranks' work between collectives (rank 0's reading of the text before on_root's broadcast, its
saving of a checkpoint): the timeout must exceed the longest of those. A checkpoint is only
written by rank 0, to a temporary file renamed over the old one (pytfm.checkpoint), so a kill
mid-write, an abort included, leaves the old file or the new one, whole.

Threads: when several ranks share a machine and neither PYTFM_NUM_THREADS nor OMP_NUM_THREADS
is set, each rank takes the cores it may run on divided by the ranks on that machine (at least
one): 1 for 2 ranks on 2 cores.

Without mpi4py (pip install "pytfm[mpi]": mpi4py and the mpich wheels) a process that no MPI
launcher started is a world of one rank and everything above is a no-op; one that a launcher
started says what to install.
"""

import atexit
import contextlib
import hashlib
import math
import os
import sys
import threading
import time
import traceback

import numpy as np

from ._core import set_num_threads

# seconds between a fatal message and MPI_Abort (abort): time for the launcher to forward it
ABORT_GRACE = 0.5

INSTALL = 'pip install "pytfm[mpi]"  (mpi4py and the mpich wheels from PyPI)'
TIMEOUT_VAR = "PYTFM_COLLECTIVE_TIMEOUT"
DEFAULT_TIMEOUT = 600.0  # seconds: far beyond a step, a save or an evaluation of train_tiny's
# what an MPI launcher puts in each rank's environment: MPICH's and Intel MPI's hydra (PMI_*),
# Open MPI (OMPI_*), PMIx launchers
_LAUNCHER_VARS = ("PMI_SIZE", "PMI_RANK", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK")

_world = None


def launched():
    """Whether an MPI launcher (mpiexec, mpirun) started this process: the name of the variable
    that says so, else None."""
    return next((v for v in _LAUNCHER_VARS if v in os.environ), None)


def init():
    """The World this process belongs to (the same object on every call): rank 0 of 1 when no
    MPI launcher started it, else MPI's COMM_WORLD, which needs mpi4py (ImportError saying
    what to install without it)."""
    global _world
    if _world is None:
        var = launched()
        if var is None:
            _world = World(None)
        else:
            try:
                from mpi4py import MPI
            except ImportError as e:
                raise ImportError(f"pytfm.distributed: an MPI launcher started this process "
                                  f"({var} is set) but mpi4py cannot be imported ({e}); "
                                  f"install it: {INSTALL}") from None
            _world = World(MPI.COMM_WORLD)
    return _world


def default_timeout():
    """The collective timeout in seconds: PYTFM_COLLECTIVE_TIMEOUT when set (a finite number
    > 0, else ValueError naming the variable), else DEFAULT_TIMEOUT."""
    text = os.environ.get(TIMEOUT_VAR, "").strip()
    if not text:
        return DEFAULT_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise ValueError(f"{TIMEOUT_VAR}={text!r}: must be a finite number of seconds > 0")
    return value


def shard_rows(batch, rank, size):
    """The rows [lo, hi) of a global batch of `batch` rows that rank `rank` of `size` trains:
    contiguous, in rank order, sizes differing by at most one; over all ranks exactly
    range(batch). Needs batch >= size (every rank at least one row)."""
    if not 0 <= rank < size:
        raise ValueError(f"rank must be in [0, {size}), got {rank}")
    if batch < size:
        raise ValueError(f"a global batch of {batch} rows cannot give each of {size} ranks a row")
    return rank * batch // size, (rank + 1) * batch // size


class AgreedExit(SystemExit):
    """An exit every rank takes together (a usage error rank 0 found): guard() lets it pass."""


class World:
    """The ranks of one data-parallel job: .rank, .size, .root (rank 0?), and the few
    collectives training needs, each watched: .timeout seconds at most (default_timeout()),
    else the job ends (see the module's "Faults"); .step, when the caller sets it, is the
    training step the watchdog's message names. World(None) is a single process: no MPI, every
    method the identity or a no-op."""

    def __init__(self, comm, timeout=None):
        self.comm = comm
        self.rank = comm.Get_rank() if comm is not None else 0
        self.size = comm.Get_size() if comm is not None else 1
        self.root = self.rank == 0
        self.threads = None  # the count set for this rank's kernels, if any
        self.timeout = default_timeout() if timeout is None else timeout
        self.step = None
        self._watchdog = None
        if self.size > 1:
            self._pick_threads()
            sys.excepthook = self._excepthook
            self._watchdog = _Watchdog(self)

    def _waiting(self, what):
        """The context of one collective, what (e.g. "the all-reduce of the gradients"),
        under the watchdog."""
        return self._watchdog.waiting(what) if self._watchdog else contextlib.nullcontext()

    def _pick_threads(self):
        if os.environ.get("PYTFM_NUM_THREADS", "").strip() or os.environ.get("OMP_NUM_THREADS"):
            return  # the user's choice
        from mpi4py import MPI

        local = self.comm.Split_type(MPI.COMM_TYPE_SHARED)
        here = local.Get_size()
        local.Free()
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
            else os.cpu_count() or 1
        self.threads = max(1, cores // here)
        set_num_threads(self.threads)

    # ---- faults ------------------------------------------------------------------------------

    def abort(self, message, status=1):
        """Print message (prefixed with this rank) to stderr and end every rank: MPI_Abort.
        In a single process: SystemExit(status)."""
        print(f"pytfm.distributed: rank {self.rank} of {self.size}: {message}", file=sys.stderr,
              flush=True)
        if self.comm is None:
            raise SystemExit(status)
        # The line is in the pipe to the launcher, not yet on its output: MPI_Abort has the
        # launcher kill every rank, and mpiexec may stop reading this rank's pipe before it has
        # forwarded the line (seen on a loaded 2-core machine). A short grace lets it arrive.
        time.sleep(ABORT_GRACE)
        self.comm.Abort(status)

    def _excepthook(self, kind, value, tb):
        traceback.print_exception(kind, value, tb)
        self.abort(f"{kind.__name__}: {value}; aborting all {self.size} ranks", 1)

    @contextlib.contextmanager
    def guard(self):
        """Run a block in which any exception on one rank ends every rank (abort) rather than
        leave the others waiting in a collective forever. An exit all ranks take together
        (AgreedExit) or SystemExit(0) passes; so does everything in a single process."""
        if self.size == 1:
            yield self
            return
        try:
            yield self
        except AgreedExit:
            raise
        except SystemExit as e:
            if e.code in (None, 0):
                raise
            self.abort(f"exited with status {e.code} while the others ran; aborting all "
                       f"{self.size} ranks")
        except BaseException as e:
            traceback.print_exc()
            self.abort(f"{type(e).__name__}: {e}; aborting all {self.size} ranks")

    def on_root(self, fn, *args):
        """fn(*args) on rank 0 alone (reading files, checking flags, printing) and its result,
        pickled, on every rank. A SystemExit there (a usage error) becomes every rank's, as
        AgreedExit with its code. In a single process: fn(*args), as it is."""
        if self.size == 1:
            return fn(*args)
        result = exit_code = None
        if self.root:
            try:
                result = fn(*args)
            except SystemExit as e:
                exit_code = e.code
            except BaseException as e:
                traceback.print_exc()
                self.abort(f"{type(e).__name__}: {e}; aborting all {self.size} ranks")
        with self._waiting("the broadcast of rank 0's result"):
            result, exit_code = self.comm.bcast((result, exit_code), root=0)
        if exit_code is not None:
            raise AgreedExit(exit_code)
        return result

    # ---- the data -----------------------------------------------------------------------------

    def shard(self, x, y):
        """This rank's rows of a global batch x, y (B, ...) and its share of the batch's
        targets (those >= 0), the weight of its mean loss and gradient in the global mean:
        (x rows, y rows, share). One rank: (x, y, 1.0)."""
        if self.size == 1:
            return x, y, 1.0
        lo, hi = shard_rows(len(x), self.rank, self.size)
        valid, mine = int(np.count_nonzero(y >= 0)), int(np.count_nonzero(y[lo:hi] >= 0))
        return x[lo:hi], y[lo:hi], (mine / valid if valid else 0.0)

    # ---- collectives --------------------------------------------------------------------------

    def broadcast(self, buffer):
        """Rank 0's contents of a NumPy array into the same array on every rank, in place."""
        if self.size > 1:
            with self._waiting("a broadcast from rank 0"):
                self.comm.Bcast(buffer, root=0)

    def sum(self, values):
        """The sum over ranks of a few float values (a list), the same float64 bits on every
        rank: gathered, then added in rank order. One rank: the values, as float64."""
        mine = np.asarray(values, dtype=np.float64).ravel()
        if self.size == 1:
            return mine
        everyone = np.empty((self.size, mine.size), np.float64)
        with self._waiting("a sum of scalars"):
            self.comm.Allgather(mine, everyone)
        return everyone.sum(axis=0)  # the rows in rank order, on every rank alike

    def any(self, flag):
        """Whether flag is true on any rank (every rank gets the same answer)."""
        return bool(self.sum([1.0 if flag else 0.0])[0] > 0) if self.size > 1 else bool(flag)

    def average_gradients(self, grads, share):
        """grads (a FlatDict: one buffer) := sum over ranks of share_r * grads_r, in place, the
        same bits on every rank. share is this rank's weight in the global mean (shard()); with
        equal shares and N a power of two the scaling is exact."""
        if share != 1.0:  # one rank's share is 1: nothing to scale
            grads.buffer *= np.float32(share)
        self.sum_in_place(grads.buffer)

    def sum_in_place(self, buffer):
        """buffer := the elementwise sum of every rank's buffer (float32, 1-D), identical bits
        on every rank (see the module's docstring)."""
        if self.size == 1:
            return
        from mpi4py import MPI

        # A GPU collective plugs in here: a CuPy array on the device would go to
        # cupy.cuda.nccl.NcclCommunicator.allReduce (a communicator built from an id that rank
        # 0 broadcasts over self.comm), which sums in a fixed ring order on every rank.
        if self.size == 2:
            with self._waiting("the all-reduce of the gradients"):
                self.comm.Allreduce(MPI.IN_PLACE, buffer, op=MPI.SUM)  # a + b == b + a
            return
        n = buffer.size
        counts = [(r + 1) * n // self.size - r * n // self.size for r in range(self.size)]
        starts = [r * n // self.size for r in range(self.size)]
        mine = np.empty(counts[self.rank], buffer.dtype)
        with self._waiting("the reduce-scatter of the gradients"):
            self.comm.Reduce_scatter(buffer, mine, counts, op=MPI.SUM)
        buffer[starts[self.rank]:starts[self.rank] + mine.size] = mine
        with self._waiting("the all-gather of the gradients"):
            self.comm.Allgatherv(MPI.IN_PLACE, [buffer, counts, starts, MPI.FLOAT])

    def check_identical(self, buffer, what="the parameters"):
        """Raise RuntimeError unless buffer holds the same bytes on every rank (digests
        compared; cheap next to a step)."""
        if self.size == 1:
            return
        digest = hashlib.blake2b(memoryview(np.ascontiguousarray(buffer)).cast("B"),
                                 digest_size=16).digest()
        with self._waiting("the comparison of the parameters"):
            digests = self.comm.allgather(digest)
        differ = [r for r, d in enumerate(digests) if d != digests[0]]
        if differ:
            raise RuntimeError(f"{what} differ between rank 0 and rank(s) "
                               f"{', '.join(map(str, differ))}")

    def barrier(self):
        if self.size > 1:
            with self._waiting("a barrier"):
                self.comm.Barrier()


class _Watchdog:
    """A World's collective watchdog (see the module's "Faults").

    Entering a collective, this rank sends each peer a note (its count of collectives entered,
    World.step) on a duplicate communicator, and drains the notes received so far (persistent
    sends and receives, one each per peer). A thread wakes every tick: it sends each peer a
    heartbeat and counts theirs, and once one wait has lasted World.timeout it watches the
    heartbeats for GRACE seconds more, then aborts the job naming the rank that stopped
    answering: a stopped process, or one whose Python never lets the thread run, sends none,
    while a rank that waits in a collective (this one or an earlier one, for the stopped rank)
    still does. Arrival notes alone cannot tell these apart: a rank stopped inside a collective
    has arrived, and its healthy peers may wait in different collectives. Where every rank
    answers, the ranks whose note for this collective never came are named (a rank alive but
    elsewhere). MPI's thread level "multiple", mpi4py's default, lets the thread call MPI;
    without it the message cannot name a rank. Per collective: one small send and one test per
    peer; per tick, one 8-byte message to each peer.

    Notes and heartbeats are synchronous sends (complete once the peer has received them), one
    of each in flight per peer at most: a plain small send completes as soon as it is copied
    into the MPI library's buffers, and those are few (MPICH gives each process 64 cells of
    shared memory for every peer on its machine together), so sends piling up at a stopped rank
    would soon leave this rank unable to send its live peers anything, heartbeats included, and
    be named as stopped itself."""

    TAG, BEAT_TAG = 25, 26
    GRACE = 1.0  # seconds of heartbeats watched after the timeout (at least 4 ticks)

    def __init__(self, world):
        from mpi4py import MPI

        self.world, self.comm = world, world.comm.Dup()
        self.threaded = MPI.Query_thread() == MPI.THREAD_MULTIPLE
        self.peers = [r for r in range(world.size) if r != world.rank]
        self.count = 0  # collectives entered
        self.heard = {r: (0, -1) for r in self.peers}  # peer -> (its count, its step) last heard
        self.inbox = {r: np.zeros(2, np.int64) for r in self.peers}
        self.receives = {r: self.comm.Recv_init(self.inbox[r], source=r, tag=self.TAG)
                         for r in self.peers}
        self.latest = np.zeros(2, np.int64)  # this rank's note: (self.count, World.step or -1)
        self.notes = {r: np.zeros(2, np.int64) for r in self.peers}  # each peer's send buffer
        self.sends = {r: self.comm.Ssend_init(self.notes[r], dest=r, tag=self.TAG)
                      for r in self.peers}
        self.noting = set()  # peers with a note in flight
        self.beats = {r: 0 for r in self.peers}  # heartbeats received from each peer
        self.beat_in = {r: np.zeros(1, np.int64) for r in self.peers}
        self.beat_receives = {r: self.comm.Recv_init(self.beat_in[r], source=r,
                                                     tag=self.BEAT_TAG) for r in self.peers}
        self.beat_out = np.zeros(1, np.int64)  # never written: every send may share it
        self.beat_sends = {r: self.comm.Ssend_init(self.beat_out, dest=r, tag=self.BEAT_TAG)
                           for r in self.peers}
        self.beating = set()  # peers with a heartbeat in flight
        for request in [*self.receives.values(), *self.beat_receives.values()]:
            request.Start()
        self.current = None  # (count, what, step, monotonic start) while in a collective
        self.lock = threading.Lock()
        self.closed = False
        self.tick = max(0.05, min(1.0, world.timeout / 20))
        self.thread = threading.Thread(target=self._watch, name="pytfm collective watchdog",
                                       daemon=True)
        self.thread.start()
        atexit.register(self.close)  # before mpi4py's MPI_Finalize, which runs after atexit's

    def close(self):
        """Stop the thread's MPI calls (at exit: none may follow MPI_Finalize)."""
        with self.lock:
            self.closed = True

    @contextlib.contextmanager
    def waiting(self, what):
        with self.lock:
            self.count += 1
            self._drain()
            step = self.world.step
            self.latest[:] = self.count, -1 if step is None else step
            self._notify()
            self.current = (self.count, what, step, time.monotonic())
        try:
            yield
        finally:
            self.current = None

    def _notify(self):
        """Send each peer this rank's latest note, unless the last one to it is still in
        flight: a peer that does not receive (a stopped one) may hold it there for good, and
        waiting for it here would hold self.lock, and so the thread's heartbeats and the
        message, for as long. The latest note goes to that peer at a later tick or collective,
        once the last one has left (under self.lock)."""
        for r in self.peers:
            if r in self.noting:
                if not self.sends[r].Test():
                    continue
                self.noting.discard(r)
            if self.notes[r][0] != self.latest[0]:
                self.notes[r][:] = self.latest
                self.sends[r].Start()
                self.noting.add(r)

    def _drain(self):
        """Record every note received so far (under self.lock)."""
        for r, request in self.receives.items():
            while request.Test():
                self.heard[r] = (int(self.inbox[r][0]), int(self.inbox[r][1]))
                request.Start()

    def _beat(self):
        """Send each peer a heartbeat (unless the last one is still in flight: a peer that
        does not receive) and any note still to send, and count the heartbeats received (under
        self.lock)."""
        self._notify()
        for r in self.peers:
            if r in self.beating and self.beat_sends[r].Test():
                self.beating.discard(r)
            if r not in self.beating:
                self.beat_sends[r].Start()
                self.beating.add(r)
            while self.beat_receives[r].Test():
                self.beats[r] += 1
                self.beat_receives[r].Start()

    def _watch(self):
        while True:
            time.sleep(self.tick)
            with self.lock:
                if self.closed:
                    return
                if self.threaded:
                    self._beat()
            current = self.current
            if current is None or time.monotonic() - current[3] < self.world.timeout:
                continue
            silent = self._silent() if self.threaded else []
            with self.lock:
                if self.current is not current or self.closed:
                    continue  # it completed meanwhile
                if self.threaded:
                    self._drain()
                self.world.abort(self._message(*current, silent))

    def _silent(self):
        """The peers that send fewer than 2 heartbeats in the next max(GRACE / tick, 4) ticks of
        this thread (a live one sends one a tick; one may have left just before it stopped).
        Ticks this thread lives through, not seconds: where the whole machine stalls (a busy
        host, a virtual machine descheduled) this thread and the peers' stall alike, and the
        watch lasts until the peers had as many ticks to answer as if nothing had stalled."""
        before = dict(self.beats)
        for _ in range(max(math.ceil(self.GRACE / self.tick), 4)):
            time.sleep(self.tick)
            with self.lock:
                if self.closed:
                    break
                self._beat()
        return [r for r in self.peers if self.beats[r] - before[r] < 2]

    def _message(self, count, what, step, start, silent):
        at = f" of step {step}" if step is not None else ""
        waited = f"{what}{at} (collective #{count}) has waited {time.monotonic() - start:.1f} s"
        if not self.threaded:
            return (f"{waited}, more than the timeout of {self.world.timeout:g} s, for a rank "
                    f"that did not arrive; aborting all {self.world.size} ranks")
        late = silent or [r for r in self.peers if self.heard[r][0] < count]
        if not late:
            return (f"{waited}: every rank arrived and answers, yet it did not complete (are the "
                    f"ranks in different collectives?); aborting all {self.world.size} ranks")
        last = "; ".join(f"rank {r}'s last: collective #{self.heard[r][0]}"
                         + (f", step {self.heard[r][1]}" if self.heard[r][1] >= 0 else "")
                         for r in late)
        why = (f"{'they do' if len(late) > 1 else 'it does'} not answer: stopped or hung; "
               if silent else "")
        who = ", ".join(map(str, late))
        return (f"{waited}, more than the timeout of {self.world.timeout:g} s, for rank(s) "
                f"{who}, which did not arrive ({why}{last}); aborting all {self.world.size} "
                f"ranks")
