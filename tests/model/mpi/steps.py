"""A few training steps of a tiny GPT through pytfm.distributed, for
tests/model/test_distributed.py: run alone or under mpiexec -n N. Each rank builds its model from
its own seed (rank 0's wins through the broadcast, or the check below fails); after every step each
rank's parameters and AdamW moments are compared across ranks by digest. Rank 0 prints one JSON
line: {"ranks", "threads", "losses": [global loss per step], "norms": [the averaged gradient's norm
per step], "identical": [per step: parameters and moments the same bytes on every rank],
"first_identical": after the broadcast}.

    python tests/model/mpi/steps.py [steps] [global batch]
"""

import hashlib
import json
import sys

import pytfm
from pytfm import data, distributed
from pytfm.nn import GPT, GPTConfig
from pytfm.optim import AdamW, clip_grad_norm


def same_everywhere(world, *buffers):
    digest = hashlib.blake2b(b"".join(b.tobytes() for b in buffers), digest_size=16).digest()
    everyone = world.comm.allgather(digest) if world.size > 1 else [digest]
    return all(d == everyone[0] for d in everyone)


def main(steps, batch):
    world = distributed.init()
    text = data.encode("def f(x, y):\n    return x * y + 1  # the product, plus one\n" * 60)
    batches = data.Batches(text, 16, batch, seed=1)
    model = GPT(GPTConfig(d_model=32, n_layer=2, n_head=2, max_seq=16, seed=world.rank))
    opt = AdamW(model.params, model.grads, lr=3e-3)
    world.broadcast(model.params.buffer)
    first = same_everywhere(world, model.params.buffer)
    losses, norms, identical = [], [], []
    for step in range(steps):
        x, y, share = world.shard(*batches.batch("train", step))
        model.zero_grad()
        _, loss = model.forward(x, y)
        losses.append(float(world.sum([float(loss) * share])[0]))
        model.backward()
        world.average_gradients(model.grads, share)
        norms.append(float(clip_grad_norm(model.grads, 1.0)))  # of the averaged gradient
        opt.step(1e-2)
        identical.append(same_everywhere(world, model.params.buffer, opt.m.buffer, opt.v.buffer))
    if world.root:
        print(json.dumps({"ranks": world.size, "threads": pytfm.get_num_threads(),
                          "losses": losses, "norms": norms, "identical": identical,
                          "first_identical": first}))
    return 0


if __name__ == "__main__":
    sys.exit(main(*(int(a) for a in sys.argv[1:3])) if len(sys.argv) > 2 else main(10, 6))
