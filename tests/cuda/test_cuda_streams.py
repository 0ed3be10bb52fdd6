"""Streams and events in the stand-in CuPy (tests/fake_cupy.py), and its hazard detector: two
accesses to one allocation on two streams, at least one a write, with nothing ordering them
(an event recorded after the first and waited on before the second, a synchronisation, the
legacy null stream's implicit one) raise StreamHazard at the second. Each rule is held here by a
small two-stream program that breaks it and the same program ordered; then the bug the detector
is for, planted in pytfm.train_step.TrainStep (a step on a stream of its own whose caller does
not wait for it, or which does not wait for its caller's batch), is caught, and missed with the
detector off.
"""

import numpy as np
import pytest

from pytfm import ops
from pytfm.nn import GPT, GPTConfig
from pytfm.optim import AdamW
from pytfm.train_step import TrainStep

TINY = GPTConfig(vocab=32, d_model=32, n_layer=2, n_head=2, max_seq=12)


def hazard(cp, match):
    return pytest.raises(cp.StreamHazard, match=match)


def test_a_read_on_another_stream_needs_an_event(cp):
    a = cp.zeros(4, np.float32)  # written on the null stream
    s = cp.cuda.Stream(non_blocking=True)
    with s, hazard(cp, r"cupy.multiply on stream 0x[0-9a-f]+ reads a 16-byte allocation that "
                       "zeros wrote on the null stream, and nothing orders the two"):
        a * 2
    assert len(cp.hazards()) == 1
    s.wait_event(cp.cuda.Stream.null.record())
    with s:
        b = a * 2  # ordered now
    # and back: the host reads through the null stream, which must wait for s
    with hazard(cp, "a read back to the host on the null stream reads a 16-byte allocation "
                    "that cupy.multiply wrote on stream"):
        b.get()
    done = cp.cuda.Event()
    done.record(s)
    cp.cuda.Stream.null.wait_event(done)
    assert b.get().tolist() == [0, 0, 0, 0] and len(cp.hazards()) == 2


def test_an_event_orders_only_the_work_recorded_before_it(cp):
    s = cp.cuda.Stream(non_blocking=True)
    a = cp.zeros(4, np.float32)
    early = cp.cuda.Stream.null.record()
    a.fill(1.0)  # after the record: the event does not cover it
    s.wait_event(early)
    with s, hazard(cp, "copy on stream .* reads .* that fill wrote on the null stream"):
        a.copy()


def test_a_write_after_a_read_on_another_stream_is_a_hazard(cp):
    a = cp.zeros(4, np.float32)
    s = cp.cuda.Stream(non_blocking=True)
    s.wait_event(cp.cuda.Stream.null.record())
    with s:
        b = a + 1  # reads a on s
    with hazard(cp, "fill on the null stream writes a 16-byte allocation that cupy.add read on "
                    "stream"):
        a.fill(2.0)
    cp.cuda.Stream.null.wait_event(s.record())
    a.fill(2.0)
    assert b.get().tolist() == [1, 1, 1, 1]


@pytest.mark.parametrize("sync", ["stream", "event", "device"])
def test_the_host_orders_what_it_saw_complete(cp, sync):
    """After a synchronisation the host has seen s's work complete: reads of it and work queued
    later, on any stream, are ordered after it."""
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        a = cp.zeros(4, np.float32)
        a += 1
        done = s.record()
    with hazard(cp, "a read back to the host on the null stream reads"):
        float(a[0])
    before = cp.syncs()
    {"stream": s.synchronize, "event": done.synchronize,
     "device": lambda: cp.cuda.Device().synchronize()}[sync]()
    assert cp.syncs() == before + 1
    assert float(a[0]) == 1.0
    a *= 3  # on the null stream, queued after the host saw s's work complete
    assert a.get().tolist() == [3, 3, 3, 3]


def test_the_legacy_null_stream_orders_blocking_streams_only(cp):
    blocking, free = cp.cuda.Stream(), cp.cuda.Stream(non_blocking=True)
    a = cp.zeros(4, np.float32)
    with blocking:
        a += 1  # waits for the null stream's zeros
    b = a * 2  # and the null stream for blocking's add
    with free, hazard(cp, "cupy.add on stream .* reads a 16-byte allocation that cupy.add wrote "
                          "on stream"):
        a += 1  # free waits for neither
    assert b.get().tolist() == [2, 2, 2, 2]


def test_a_kernel_reads_its_const_arguments_and_writes_the_rest(cp):
    """pytfm.ops' twins run on the current stream: softmax reads x (const in pytfm_cuda.h) and
    writes y. Two streams may read x at once; y, written on one, is a hazard on the other."""
    x = cp.asarray(np.arange(12, dtype=np.float32).reshape(3, 4))
    s, t = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    with s, hazard(cp, "pytfm_softmax_forward_cuda on stream .* reads a 48-byte allocation that "
                       "asarray .* wrote on the null stream"):
        ops.softmax_forward(x)
    ready = cp.cuda.Stream.null.record()
    s.wait_event(ready)
    t.wait_event(ready)
    with s:
        y = ops.softmax_forward(x)
    with t:
        ops.softmax_forward(x)  # a second reader of x: no hazard
        with hazard(cp, "cupy.add on stream .* reads .* that pytfm_softmax_forward_cuda wrote"):
            y + 1
    cp.cuda.Stream.null.wait_event(s.record())
    assert np.allclose(y.get().sum(axis=1), 1)


def test_a_graph_is_work_on_the_stream_it_is_launched_on(cp):
    """A capture records what its operations touch; the graph touches it at each launch, as
    work on the launch's stream."""
    s = cp.cuda.Stream(non_blocking=True)
    x = cp.asarray(np.ones(8, np.float32))
    with s:
        y = cp.empty(8, np.float32)
        s.begin_capture()
        cp.multiply(x, 2, out=y)  # recorded, not run: no hazard yet
        graph = s.end_capture()
    with hazard(cp, "cupy.multiply on stream .* reads a 32-byte allocation that asarray .* "
                    "wrote on the null stream"):
        graph.launch(stream=s)
    s.wait_event(cp.cuda.Stream.null.record())
    graph.launch(stream=s)
    with hazard(cp, "fill on the null stream writes a 32-byte allocation that cupy.multiply "
                    "read on stream"):
        x.fill(3.0)  # while the graph on s may still read x


def test_the_detector_is_on_for_every_test_and_can_be_turned_off(cp):
    assert cp.hazards() == []
    s = cp.cuda.Stream(non_blocking=True)
    a = cp.zeros(4, np.float32)
    cp.set_hazards(False)
    with s:
        a += 1  # unordered, unseen
    assert cp.hazards() == [] and a.get().tolist() == [1, 1, 1, 1]


# ---- the bug the detector is for, planted in TrainStep -------------------------------------


def trained(cp, check_ids=True):
    """A TrainStep of a model made on the null stream, and a batch on the host."""
    model = GPT(TINY, device="cuda")
    opt = AdamW(model.params, model.grads, lr=1e-2)
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, TINY.vocab, (2, 12)), rng.integers(0, TINY.vocab, (2, 12))
    return TrainStep(model, opt, max_norm=1.0, check_ids=check_ids), x, y


def skip_waits(cp, monkeypatch, on):
    """Plant the bug: stream `on` (a pointer) ignores the events it is told to wait on."""
    wait = cp.cuda.Stream.wait_event
    monkeypatch.setattr(cp.cuda.Stream, "wait_event",
                        lambda self, event: None if self.ptr == on else wait(self, event))


def test_a_step_whose_caller_does_not_wait_is_caught(cp, monkeypatch):
    step, x, y = trained(cp)
    skip_waits(cp, monkeypatch, on=0)  # the caller, on the null stream, never waits
    loss = step(x, y)
    with hazard(cp, "a read back to the host on the null stream reads a 4096-byte allocation "
                    "that copyto wrote on stream"):
        float(loss)
    with hazard(cp, "on the null stream reads .* that pytfm_adamw_step_scalars_cuda wrote"):
        model_params = step.model.params.buffer
        model_params + 0


def test_a_step_that_does_not_wait_for_its_batch_is_caught(cp, monkeypatch):
    step, x, y = trained(cp, check_ids=False)  # (a check would read the ids: a synchronisation)
    skip_waits(cp, monkeypatch, on=step.stream.ptr)  # the step never waits for the caller
    with hazard(cp, "copyto on stream .* reads a 192-byte allocation that asarray .* wrote on "
                    "the null stream"):
        step(cp.asarray(x), cp.asarray(y))


def test_with_the_detector_off_the_planted_bug_goes_unseen(cp, monkeypatch):
    """The stand-in runs everything at once, in the host's order: only the detector sees that
    a GPU need not."""
    step, x, y = trained(cp)
    skip_waits(cp, monkeypatch, on=0)
    cp.set_hazards(False)
    assert np.isfinite(float(step(x, y))) and cp.hazards() == []


def test_a_step_orders_itself_with_the_stream_it_is_called_on(cp):
    """Called from a stream of the user's, the step's results may be read there; the null
    stream, which the user's stream does not synchronise with, must wait for it too (and the
    user's stream for the model the null stream made)."""
    step, x, y = trained(cp)
    user = cp.cuda.Stream(non_blocking=True)
    with user, hazard(cp, r"fill on stream .* writes a \d+-byte allocation that asarray "
                          r"\(a copy from the host\) wrote on the null stream"):
        step(x, y)  # zero_grad: the gradients asarray made on the null stream
    user.wait_event(cp.cuda.Stream.null.record())
    with user:
        xs, ys = cp.asarray(x), cp.asarray(y)  # the batch made on the user's stream
        losses = [step(xs, ys) for _ in range(3)]
        assert all(np.isfinite(float(loss)) for loss in losses)
        last = step(xs, ys)
        twice = last * 2  # device work on the user's stream, after the step
    assert step.mode == "graph" and len(cp.hazards()) == 1  # the one above
    with hazard(cp, "a read back to the host on the null stream reads"):
        float(twice)
    cp.cuda.Stream.null.wait_event(user.record())
    assert float(twice) == 2 * float(last)
