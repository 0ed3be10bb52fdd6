"""Collectives in a loop, for test_distributed.py's stopped-rank tests: run under mpiexec -n N
with PYTFM_COLLECTIVE_TIMEOUT set. Each rank prints "rank R pid P" once, then runs the World's
collectives (the gradients' all-reduce, a sum of scalars, a barrier) until the job is ended: the
test stops one rank from outside (SIGSTOP), wherever it is, and the watchdog ends the job."""

import os

import numpy as np

from pytfm import distributed

world = distributed.init()
os.write(1, f"rank {world.rank} pid {os.getpid()}\n".encode())  # one write: a whole line
buffer = np.ones(4096, np.float32)
while True:
    world.sum_in_place(buffer)
    buffer[:] = 1.0
    world.sum([1.0])
    world.barrier()
