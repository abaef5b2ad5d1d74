"""Lesson 4: data-parallel training (DDP), from scratch and with DistributedDataParallel.

Data parallelism: every rank holds a full copy (replica) of the model and trains it on its
own shard of each batch. After backward, the ranks average their gradients, so every
replica takes the same optimizer step and the replicas stay identical. With equal shards
and a loss that is a mean, the averaged gradient *is* the gradient of the whole batch:
N ranks train exactly as one process would on N times the data.

Topics:
  1. DDP from scratch: all_reduce each gradient and divide by the world size; the model
     ends where single-process training on the whole batch ends
  2. the same with simdist.DistributedDataParallel, DistributedSampler and a DataLoader;
     how DDP packs gradients into buckets
  3. the trace: a bucket's all_reduce starts while backward is still running (overlap)
  4. no_sync(): gradient accumulation with one all_reduce per optimizer step

``simdist.simulate(fn, world_size, args=...)`` runs ``fn(rank, *args)`` on every simulated
rank and returns a result whose ``.values`` are the ranks' return values (in rank order)
and whose ``.trace`` records what each rank did, in virtual time. The ranks return their
results and only the parent prints, so the output is the same on every run (CI compares
it with ``04_ddp.out``). Floats are compared with a tolerance: summing the same numbers
in a different order (per shard, then across ranks) may change the last bits.

Run it:  python tutorials/04_ddp.py
"""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import simdist
import simdist as dist  # in place of: import torch.distributed as dist

WORLD_SIZE = 2

# The data: 32 samples of 16 features, and a target for each. A fixed seed makes them
# the same on every run.
gen = torch.Generator().manual_seed(0)
X = torch.randn(32, 16, generator=gen)
Y = torch.randn(32, 1, generator=gen)


def make_model():
    """The same initial weights every time it is called (each rank calls it)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))


def sgd_step(model, lr=0.1):
    """One step of plain SGD, what torch.optim.SGD(model.parameters(), lr).step() does; then zero the grads."""
    with torch.no_grad():
        for p in model.parameters():
            p -= lr * p.grad
            p.grad = None


def train_single_process(batches):
    """The reference: one process, one model, whole batches."""
    model = make_model()
    for x, y in batches:
        nn.functional.mse_loss(model(x), y).backward()
        sgd_step(model)
    return model.state_dict()


def max_difference(a, b):
    """The largest absolute difference between two state dicts (of the same model)."""
    return max((a[k] - b[k]).abs().max().item() for k in a)


def title(text):
    print()
    print(f"=== {text} ===")


# --- 1. DDP from scratch -----------------------------------------------------------------------
# Four steps over global batches of 8 samples: rank r takes samples r*4 .. r*4+3 of each.
# Forward and backward are purely local; the only communication is one all_reduce per
# parameter after backward. all_reduce SUMs, so each rank divides by the world size to get
# the mean. (A broadcast of the initial weights from rank 0 is not needed here, because
# make_model() seeds the generator; real code usually broadcasts them.)

GLOBAL_BATCH = 8


def train_from_scratch(rank, world_size):
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    model = make_model()
    shard = GLOBAL_BATCH // world_size
    for start in range(0, len(X), GLOBAL_BATCH):
        lo = start + rank * shard
        x, y = X[lo:lo + shard], Y[lo:lo + shard]

        nn.functional.mse_loss(model(x), y).backward()  # gradients of this rank's shard only
        for p in model.parameters():
            dist.all_reduce(p.grad)                     # sum over the ranks ...
            p.grad /= world_size                        # ... divided by their number: the mean
        sgd_step(model)                                 # the same step on every rank
    dist.destroy_process_group()
    return model.state_dict()


def lesson_from_scratch():
    title("1. DDP from scratch: all_reduce the gradients, divide by the world size")
    res = simdist.simulate(train_from_scratch, WORLD_SIZE, args=(WORLD_SIZE,))
    rank0, rank1 = res.values
    print("replicas identical after training:", all(torch.equal(rank0[k], rank1[k]) for k in rank0))
    reference = train_single_process(zip(X.split(GLOBAL_BATCH), Y.split(GLOBAL_BATCH)))
    diff = max_difference(rank0, reference)
    print(f"max |DDP - single process| < 1e-6: {diff < 1e-6}")
    # What would go wrong without the division? The step would be world_size times too
    # large (the SUM of the gradients). And without the all_reduce, each replica would
    # follow its own shard and the replicas would drift apart.


# --- 2. simdist.DistributedDataParallel ---------------------------------------------------------
# The wrapper does the same work, better:
#   * its constructor broadcasts rank 0's parameters, so the replicas start equal;
#   * in backward, it all_reduces the gradients *while backward is still running*;
#   * it does not send one message per parameter (many tiny messages are slow): it packs
#     the gradients into buckets of up to bucket_cap_mb MiB and all-reduces a bucket as
#     soon as all its gradients are ready.
# Buckets are filled in *reverse* registration order, because backward produces the
# gradients of the last layer first.
#
# DistributedSampler gives each rank its own share of the dataset's indices (disjoint
# shares), in an order shuffled with seed + epoch: call set_epoch() before each epoch, on
# every rank, or each epoch repeats the same order.

BATCH_PER_RANK = 4


def train_with_ddp(rank, world_size, epochs=2):
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    net = make_model()
    # 0.0001 MiB = 104 bytes: a tiny cap, so that this tiny model has several buckets.
    # (The default is 25 MiB, with a small first bucket of 1 MiB.)
    model = simdist.DistributedDataParallel(net, bucket_cap_mb=0.0001)

    dataset = TensorDataset(X, Y)
    sampler = simdist.DistributedSampler(dataset, seed=42)  # rank and world size from the process group
    loader = DataLoader(dataset, batch_size=BATCH_PER_RANK, sampler=sampler)
    seen = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        seen.append(list(sampler))
        for x, y in loader:
            nn.functional.mse_loss(model(x), y).backward()  # DDP averages the gradients in here
            sgd_step(model)  # model.parameters() are those of the wrapped module

    # Peek inside: model._buckets is simdist's internal list of buckets, in the order they
    # are reduced. (torch keeps its buckets inside its C++ reducer; a communication hook,
    # register_comm_hook, is the public way to see them.) DDP's parameters are those of
    # model.module, the wrapped model, so their names come from there.
    names = {p: name for name, p in model.module.named_parameters()}
    buckets = [[(names[p], p.numel() * p.element_size()) for p in b.params] for b in model._buckets]
    dist.destroy_process_group()
    return {"state": model.module.state_dict(), "indices": seen, "buckets": buckets}


def lesson_ddp():
    title("2. simdist.DistributedDataParallel with a DistributedSampler")
    res = simdist.simulate(train_with_ddp, WORLD_SIZE, args=(WORLD_SIZE,))
    for rank, r in enumerate(res.values):
        for epoch, indices in enumerate(r["indices"]):
            print(f"rank {rank}, epoch {epoch}: samples {indices}")
    print("buckets, in the order they are all-reduced:")
    for i, bucket in enumerate(res.values[0]["buckets"]):
        contents = ", ".join(f"{name} ({nbytes} B)" for name, nbytes in bucket)
        print(f"  bucket {i}: {contents}")

    # The same training in one process: with one replica, the sampler's order is the whole
    # permutation, and a global batch of BATCH_PER_RANK * WORLD_SIZE holds the samples that
    # the ranks took together in one step.
    batches = []
    for epoch in range(2):
        order = simdist.DistributedSampler(X, num_replicas=1, rank=0, seed=42)
        order.set_epoch(epoch)
        idx = torch.tensor(list(order))
        batches += [(X[i], Y[i]) for i in idx.split(BATCH_PER_RANK * WORLD_SIZE)]
    reference = train_single_process(batches)
    rank0, rank1 = (r["state"] for r in res.values)
    print("replicas identical after training:", all(torch.equal(rank0[k], rank1[k]) for k in rank0))
    print(f"max |DDP - single process| < 1e-6: {max_difference(rank0, reference) < 1e-6}")


# --- 3. Overlap, in the trace ------------------------------------------------------------------
# On the simulator, DDP charges each gradient a modelled backward cost (1 ns per element)
# to the rank's virtual clock, and records it in the trace as a "compute" event with op
# "backward". Each bucket's all_reduce is a "collective" event with op "all_reduce".
# Forward costs nothing here, and communication costs what the simulated network charges.
# A bigger model makes the times visible: layer 0 has 131072 weights, layer 2 has 65536.


def make_big_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1))


def one_step(rank, world_size, bucket_cap_mb):
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    model = simdist.DistributedDataParallel(make_big_model(), bucket_cap_mb=bucket_cap_mb)
    # To label the trace, note the order in which gradients become ready. These hooks are
    # registered after DDP's, so each runs right after DDP has recorded that gradient.
    ready = []
    for name, p in model.module.named_parameters():
        p.register_post_accumulate_grad_hook(lambda p, name=name: ready.append(name))
    gen = torch.Generator().manual_seed(rank)
    x, y = torch.randn(4, 512, generator=gen), torch.randn(4, 1, generator=gen)
    nn.functional.mse_loss(model(x), y).backward()
    dist.destroy_process_group()
    return ready


def backward_timeline(res, rank=0):
    """(start, end, label) of one rank's backward pass and its buckets' all_reduces, in us."""
    events = [e for e in res.trace if e.rank == rank
              and (e.kind, e.op) in (("compute", "backward"), ("collective", "all_reduce"))]
    # By start time; at equal times the all_reduce first: it was launched before the next gradient.
    events.sort(key=lambda e: (e.t_start, e.kind == "compute"))
    t0 = events[0].t_start  # the first gradient: the start of backward
    grads, buckets = iter(res.values[rank]), iter(range(len(events)))
    rows = []
    for e in events:
        if e.kind == "compute":
            label = f"backward: grad of {next(grads)}"
        else:
            label = f"all_reduce: bucket {next(buckets)} ({e.nbytes} bytes)"
        rows.append(((e.t_start - t0) * 1e6, (e.t_end - t0) * 1e6, label))
    return rows


def print_timeline(rows, width=36):
    """A table of rows, with a bar per row drawn to scale."""
    end = max(stop for _, stop, _ in rows)
    for start, stop, label in rows:
        a, b = round(start / end * width), round(stop / end * width)
        bar = " " * a + "#" * max(b - a, 1)
        print(f"  {start:6.1f} - {stop:6.1f} us  |{bar:<{width}}|  {label}")


def lesson_overlap():
    title("3. overlap: a bucket's all_reduce runs during backward")
    # bucket_cap_mb=0.25: the first bucket closes once it holds layer 2's 256 KiB of weights.
    res = simdist.simulate(one_step, WORLD_SIZE, args=(WORLD_SIZE, 0.25))
    rows = backward_timeline(res)
    print("rank 0, bucket_cap_mb=0.25 (2 buckets), times from the start of backward:")
    print_timeline(rows)
    backward_end = max(stop for _, stop, label in rows if label.startswith("backward"))
    first_reduce = min(start for start, _, label in rows if label.startswith("all_reduce"))
    print(f"bucket 0's all_reduce starts at {first_reduce:.1f} us, backward ends at {backward_end:.1f} us: "
          f"overlap: {first_reduce < backward_end}")
    # Bucket 0 (layers 4 and 2) is all-reduced while the gradient of layer 0 is still being
    # computed: its communication is hidden behind computation. Only the last bucket's is not.

    # One big bucket: nothing can be sent before the last gradient is ready.
    one = backward_timeline(simdist.simulate(one_step, WORLD_SIZE, args=(WORLD_SIZE, 25)))
    print("rank 0, bucket_cap_mb=25 (1 bucket):")
    print_timeline(one)
    print(f"backward + all_reduce: {rows[-1][1]:.1f} us with 2 buckets, {one[-1][1]:.1f} us with 1 bucket")
    # Smaller buckets start sending earlier, but each all_reduce also pays a fixed latency:
    # torch's default of 25 MiB (and 1 MiB for the first bucket) balances the two.


# --- 4. no_sync(): gradient accumulation -------------------------------------------------------
# To train on a batch that does not fit in memory, split it into micro-batches and add up
# their gradients before one optimizer step. Averaging across ranks after every micro-batch
# would waste communication: inside `with model.no_sync():` backward only accumulates
# gradients locally, and the first backward outside it all-reduces the accumulated sum.


def accumulate(rank, world_size):
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    model = simdist.DistributedDataParallel(make_model())
    x, y = X[rank * 8:(rank + 1) * 8], Y[rank * 8:(rank + 1) * 8]  # 8 samples: 2 micro-batches of 4
    # Each micro-batch's loss is divided by the number of micro-batches, so that the
    # accumulated gradient is that of the mean loss over all 8 samples.
    with model.no_sync():
        (nn.functional.mse_loss(model(x[:4]), y[:4]) / 2).backward()  # local only: no all_reduce
    local = [p.grad.clone() for p in model.parameters()]
    (nn.functional.mse_loss(model(x[4:]), y[4:]) / 2).backward()      # accumulates, then all-reduces
    grads = [p.grad.clone() for p in model.parameters()]
    dist.destroy_process_group()
    return local, grads


def lesson_no_sync():
    title("4. no_sync(): accumulate gradients locally, all-reduce once")
    res = simdist.simulate(accumulate, WORLD_SIZE, args=(WORLD_SIZE,))
    (local0, grads0), (local1, grads1) = res.values
    print("after the backward inside no_sync(), the ranks' gradients differ:",
          any(not torch.equal(a, b) for a, b in zip(local0, local1)))
    print("after the backward outside it, they are equal:", all(torch.equal(a, b) for a, b in zip(grads0, grads1)))
    reduces = [e for e in res.trace if e.rank == 0 and e.kind == "collective" and e.op == "all_reduce"]
    print(f"all_reduce calls on rank 0 for 2 backward passes: {len(reduces)} (1 bucket, default cap)")
    # The reference: the gradient of the mean loss over all 16 samples, in one process.
    model = make_model()
    nn.functional.mse_loss(model(X[:16]), Y[:16]).backward()
    same = all(torch.allclose(g, p.grad, atol=1e-6) for g, p in zip(grads0, model.parameters()))
    print("gradients equal the single-process gradient of all 16 samples:", same)


if __name__ == "__main__":
    lesson_from_scratch()
    lesson_ddp()
    lesson_overlap()
    lesson_no_sync()
