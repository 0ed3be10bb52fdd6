"""Train a small byte-level GPT with pytfm's kernels and hand-written backprop, then sample.

    python examples/train_tiny.py               # 0.83M parameters, context 128, < 1 min on 2 cores
    python examples/train_tiny.py --steps 1000 --text my.txt --out run1
    python examples/train_tiny.py --out run1 --resume          # continue an interrupted run
    python examples/train_tiny.py --force                      # train anew over out/
    python examples/train_tiny.py --device cuda                # on the GPU (CuPy, CUDA build)
    python examples/train_tiny.py --precision bf16             # BF16 products, FP32 state
    mpiexec -n 2 python examples/train_tiny.py                 # two processes (pytfm[mpi])
    python examples/train_tiny.py --tokenizer bpe:4096         # GPT-2's BPE, trained on the text
    python examples/train_tiny.py --init-from gpt2 --text my.txt --lr 3e-4   # fine-tune GPT-2

With no --text it learns from the Python standard library's own source files, which every
machine has: 800 steps of 8 windows of 128 bytes, a progress line every 10 steps and the
validation loss every 100; it writes out/model.safetensors (also at each validation),
out/loss.csv and, with matplotlib, out/loss.png, then prints a sample. It refuses to replace a
trained model unless --resume continues it or --force starts over. --help lists every flag;
docs/training.md tells what each does and what is checked.

This file is the library's calls a training run makes, in the order it makes them: the model,
the optimizer, the batches, the loop (forward, backward, clip, step), the checkpoint and a
sample. It is `python -m pytfm train`, flag for flag and bit for bit: the command line's
machinery (the flags and their checks, reading the text, the tokenizer, --resume, MPI, the
progress lines, validation, checkpoints, Ctrl-C, loss.csv and loss.png) is pytfm.cli.train's
`session`, and pytfm.cli.train.main makes these same calls.
"""

import sys

from pytfm import data
from pytfm.cli import train as cli
from pytfm.generate import generate
from pytfm.nn import GPT, GPTConfig
from pytfm.optim import AdamW, clip_grad_norm, cosine_lr


def main(argv=None, interrupt_at=None):
    """Returns the exit status: 0, 1 (a loss became NaN or inf), 130 (Ctrl-C: checkpoint
    saved); a bad flag or path exits with status 2 before anything is trained."""
    # The flags checked, the text read and tokenized (rank 0 reads, every rank gets it)
    with cli.session(argv, interrupt_at) as run:
        args = run.args

        # The model: a GPT of the flags' shape, or a Hugging Face GPT-2 folder to fine-tune
        if run.base is not None:
            model = run.base_model()
        else:
            cfg = GPTConfig(vocab=run.vocab, d_model=args.d_model, n_layer=args.n_layer,
                            n_head=args.n_head, max_seq=args.context, pos=args.pos,
                            seed=args.seed)
            model = GPT(cfg, device=args.device, precision=args.precision)

        # AdamW over the parameters' one flat buffer, and the text cut into training windows
        # (the last tenth kept for validation), shuffled by the seed
        opt = AdamW(model.params, model.grads, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
        batches = data.Batches(run.tokens, args.context, args.batch, seed=args.seed)

        # --resume's checkpoint into model and opt; every rank from rank 0's parameters
        run.begin(model, opt, batches)

        for step in run.steps():  # up to --steps, or until Ctrl-C
            lr = cosine_lr(step, args.lr, args.warmup, args.steps, min_lr=args.lr / 10)
            x, y, share = run.batch(step)  # this rank's rows of the global batch
            model.zero_grad()
            _, loss = model.forward(x, y, check_ids=False)  # ids below vocab by construction
            model.backward()  # every gradient into model.grads
            run.world.average_gradients(model.grads, share)  # one process: nothing to do
            norm = clip_grad_norm(model.grads, 1.0)
            opt.step(lr)
            # the progress line; at each --eval-every the validation loss and the checkpoint
            # (pytfm.checkpoint.save: model, optimizer, step and log, what --resume reads)
            if not run.record(loss, norm, share, lr):
                return 1  # a loss or a gradient became NaN or inf: the last checkpoint stays

        status = run.finish()  # the last checkpoint, loss.csv and loss.png

        # A sample: the model continues the prompt ('def ' on the stdlib corpus)
        if status == 0 and run.world.root and args.sample_tokens:
            prompt, n_new = run.sample_prompt()
            ids = generate(model, prompt, n_new, temperature=0.8, top_k=40, seed=args.seed)[0]
            print("sample (temperature 0.8, top-k 40):\n" + run.decode(ids))
        return status


if __name__ == "__main__":
    sys.exit(main())
