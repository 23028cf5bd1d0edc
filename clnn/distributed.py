"""Data-parallel training across processes with MPI (mpi4py): one process (rank) per
OpenCL device, in one machine or many.

    # mpiexec -n 2 python train.py
    from clnn import distributed, nn
    world = distributed.World()                 # MPI's world; picks this rank's device
    net = nn.Sequential([...], in_features=784, device=world.device, seed=0)
    dp = distributed.DataParallel(net, world)   # same weights everywhere (from rank 0)
    hist = dp.fit(x, y, "cross_entropy", epochs=5, batch_size=64)  # global batch
    dp.save("model.npz")                        # rank 0 writes

Every rank holds the whole data set (as each would load it); each global batch is split
into one shard per rank, each rank computes its shard's gradients, and the network's
gradient hook sums them across ranks before the same update runs everywhere. The sum is
taken in rank order on every rank (gathered, then added 0 + 1 + ... in turn), not by a
plain Allreduce, whose order MPI does not promise: so every rank holds bitwise the same
weights after every step, and N ranks with batch B/N match one process with batch B to
rounding. The exchange moves what a ring all-reduce does, 2 (N-1)/N of the gradient per
rank (a reduce-scatter by Alltoall, each chunk summed by one rank in rank order, then
an Allgather).

The gradients go in buckets (``bucket_bytes``), last layers first; a bucket's copy to the
host is queued right behind the kernels that compute it, so the host sums one bucket
across ranks while the device runs the backward pass of the layers below.

Dropout masks are those of one process with the global batch (each rank draws its
shard's part), so N ranks match one process with Dropout too. Not yet: synchronised
BatchNorm statistics (each rank normalises with its own shard's, as PyTorch's DDP
without SyncBatchNorm).
"""

import contextlib
import json
import os
import sys
import traceback

import numpy as np

import clnn
from .errors import ArgumentError, DistributedError


def _mpi():
    try:
        from mpi4py import MPI
    except ImportError:
        raise DistributedError("clnn.distributed needs mpi4py and an MPI: pip install "
                               "'clnn[mpi]' (mpi4py and MPICH from PyPI)") from None
    return MPI


def launched_by_mpi():
    """Whether this process was started by mpiexec/mpirun with more than one rank (read
    from the environment, without initialising MPI)."""
    for var in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS", "PMIX_SIZE"):
        v = os.environ.get(var)
        if v and v.isdigit() and int(v) > 1:
            return True
    return False


class World:
    """This process's place in an MPI job: ``rank``, ``size``, its rank among the ranks
    of its machine (``local_rank``, ``local_size``), and the OpenCL ``device`` it uses:
    CLNN_DEVICE when set (each rank may get its own), else the machine's GPUs shared out
    by local rank, else PoCL with the machine's cores split between its ranks (so two
    ranks on one machine do not fight over the same cores)."""

    def __init__(self, comm=None):
        MPI = _mpi()
        self.MPI = MPI
        self.comm = MPI.COMM_WORLD if comm is None else comm
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        local = self.comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        self.local_rank, self.local_size = local.Get_rank(), local.Get_size()
        local.Free()
        self.device = self._pick_device()

    def _pick_device(self):
        spec = os.environ.get("CLNN_DEVICE")
        if spec:
            return clnn.device(spec)
        if self.local_size > 1 and "POCL_CPU_MAX_CU_NUM" not in os.environ:
            # read by PoCL when it starts: set before any device is opened
            cores = os.cpu_count() or 1
            os.environ["POCL_CPU_MAX_CU_NUM"] = str(max(1, cores // self.local_size))
        from .device import all_devices
        import pyopencl as cl
        gpus = [(p, d) for p, d, dev in all_devices() if dev.type & cl.device_type.GPU]
        if gpus:
            p, d = gpus[self.local_rank % len(gpus)]
            return clnn.device(f"{p}:{d}")
        return clnn.device("pocl")

    def describe(self):
        """One line per rank (gathered on every rank): rank, host and device."""
        import socket
        mine = f"rank {self.rank}/{self.size} on {socket.gethostname()}: {self.device.name}"
        return self.comm.allgather(mine)

    def abort(self, exc):
        """End the whole job now, saying which rank failed and why (no other rank is
        left waiting in a collective)."""
        sys.stderr.write(f"clnn.distributed: rank {self.rank} of {self.size} failed: "
                         f"{type(exc).__name__}: {exc}\n")
        traceback.print_exception(exc, file=sys.stderr)
        sys.stderr.flush()
        self.comm.Abort(1)

    @contextlib.contextmanager
    def guard(self):
        """Run a block; an exception on this rank aborts every rank (MPI_Abort)."""
        try:
            yield self
        except BaseException as exc:       # noqa: BLE001 - any failure ends the job
            if self.size > 1:
                self.abort(exc)
            raise


def shard(indices, rank, size):
    """Rank ``rank``'s part of one global batch: ``size`` nearly equal contiguous
    parts, in rank order (the first ones one longer when it does not divide)."""
    return np.array_split(np.asarray(indices), size)[rank]


# Gradients are exchanged in buckets of about this many bytes, the last layers' first
# (PyTorch's DDP: 25 MiB): a bucket's exchange starts as soon as its layers' gradients
# exist, while the device runs the backward pass of the layers below.
BUCKET_BYTES = 4 << 20


class DataParallel:
    """Train ``net`` on every rank of ``world`` as one network: checks that every rank
    built the same network, copies rank 0's parameters to all, and sums gradients in a
    fixed rank order in the network's gradient hook.

    ``bucket_bytes``: the gradients go in buckets of consecutive layers of at least
    this size, exchanged last layer first, each as soon as the device has computed it
    (its copy to the host is queued right after the layer's backward kernels), so the
    host exchanges one bucket while the device computes the next; None or 0: one
    bucket after the whole backward pass (no overlap). Bucketing never changes the
    result: each element is summed in rank order either way."""

    def __init__(self, net, world=None, bucket_bytes=BUCKET_BYTES):
        self.net = net
        self.world = World() if world is None else world
        if bucket_bytes is not None and (not isinstance(bucket_bytes, (int, np.integer))
                                         or bucket_bytes < 0):
            raise ArgumentError(f"bucket_bytes must be an int >= 0 or None, got "
                                f"{bucket_bytes!r}")
        self.bucket_bytes = int(bucket_bytes or 0)
        self._buckets = None        # [(start, stop, lowest layer)], in exchange order
        self._events = {}           # bucket -> the event of its copy to the host
        self._check_same_network()
        self._broadcast_parameters()

    # ---------------------------------------------------------------- set-up
    def _description(self):
        net = self.net
        return json.dumps({"in_shape": list(net.in_shape), "dtype": net.dtype.name,
                           "layers": [l.config() for l in net.layers],
                           "parameters": [list(p.shape) for p in net.parameters()]},
                          sort_keys=True)

    def _check_same_network(self):
        descs = self.world.comm.allgather(self._description())
        differ = [r for r, d in enumerate(descs) if d != descs[0]]
        if differ:       # every rank sees the same list, so every rank raises
            raise DistributedError(f"ranks {differ} built another network than rank 0 "
                                   f"(layers, shapes or dtypes): rank 0 has {descs[0]}, "
                                   f"rank {differ[0]} has {descs[differ[0]]}")

    def _broadcast_parameters(self):
        flat = self.net.flat_parameters
        if flat is None:
            return
        host = flat.get() if self.world.rank == 0 else np.empty(flat.shape, flat.dtype)
        self.world.comm.Bcast(host, root=0)
        flat.set(host)

    def buckets(self):
        """[(start, stop, lowest layer)]: the gradient buckets in exchange order (the
        last layers first), as element ranges of the network's flat gradients. The
        same on every rank (the network is), so the collectives match."""
        if self._buckets is None:
            net, isz = self.net, self.net.dtype.itemsize
            out, hi, lo, low = [], None, None, None
            for i in reversed(range(len(net.layers))):
                start, stop = net.gradient_range(i)
                if start == stop:
                    continue
                hi = stop if hi is None else hi
                lo, low = start, i
                if self.bucket_bytes and (hi - lo) * isz >= self.bucket_bytes:
                    out.append((lo, hi, low))
                    hi = None
            if hi is not None:
                out.append((lo, hi, low))
            self._buckets = out
            self._closing = {low: b for b, (_, _, low) in enumerate(out)}
            n = 0 if net.flat_parameters is None else net.flat_parameters.size
            self._sent = np.zeros(n, net.dtype)        # this rank's gradients
            self._summed = np.zeros(n, net.dtype)      # the sums over ranks
        return self._buckets

    # ---------------------------------------------------------------- the step
    def _reduce(self, v, extra, out):
        """``v`` (plus the number ``extra`` riding at its end) summed over every rank in
        rank order into ``out``: bitwise the same on every rank; returns the sum of
        ``extra``.

        Reduce-scatter, then all-gather, as a ring all-reduce moves data (2 (N-1)/N of
        the vector per rank), but in a fixed order: the vector is cut into N chunks,
        Alltoall hands rank j every rank's chunk j, rank j adds them 0 + 1 + ... in
        turn, and Allgather gives every rank every summed chunk. Each element is thus
        added in rank order by exactly one rank, and copied to the others."""
        n, dt, size = v.size, self.net.dtype, self.world.size
        chunk = -(-(n + 1) // size)
        mine = np.zeros(chunk * size, dt)
        mine[:n] = v
        mine[n] = extra
        parts = np.empty((size, chunk), dt)
        self.world.comm.Alltoall(mine.reshape(size, chunk), parts)
        summed = parts[0].copy()
        for r in range(1, size):
            summed += parts[r]
        total = np.empty(chunk * size, dt)
        self.world.comm.Allgather(summed, total)
        out[:] = total[:n]
        return float(total[n])

    def _sum_gradients(self, flat_grads, count):
        """The whole gradient and the example count summed over ranks, one bucket
        (what the benchmark times as the exchange alone)."""
        n = 0 if flat_grads is None else flat_grads.size
        out = np.empty(n, self.net.dtype)
        total = self._reduce(flat_grads.get() if n else out, count, out)
        return out, total

    def _layer_done(self, i):
        """The network's layer hook: when layer i closes a bucket, queue the copy of
        the bucket's gradients to the host right behind the kernels that computed
        them."""
        if self.world.size == 1:
            return
        self.buckets()
        b = self._closing.get(i)
        if b is not None:
            lo, hi, _ = self._buckets[b]
            self._events[b] = self._copy(lo, hi, to_host=True)

    def _copy(self, lo, hi, to_host):
        import pyopencl as cl
        g = self.net.flat_gradients
        isz = g.dtype.itemsize
        q = self.net.device.queue
        if to_host:
            return cl.enqueue_copy(q, self._sent[lo:hi], g.base_data,
                                   src_offset=g.offset + lo * isz, is_blocking=False)
        return cl.enqueue_copy(q, g.base_data, self._summed[lo:hi],
                               dst_offset=g.offset + lo * isz, is_blocking=False)

    def _exchange(self, count, zero=False):
        """Every bucket in order: wait for its copy to the host (queued by the layer
        hook, or now), sum it over the ranks, queue the sums back to the device. The
        example count rides with the first bucket. Returns the total count. ``zero``:
        this rank has no examples and sends zeros."""
        total = count
        for b, (lo, hi, _) in enumerate(self.buckets()):
            if zero:
                self._sent[lo:hi] = 0
            else:
                evt = self._events.pop(b, None)
                (evt if evt is not None else self._copy(lo, hi, to_host=True)).wait()
            extra = self._reduce(self._sent[lo:hi], count if b == 0 else 0.0,
                                 self._summed[lo:hi])
            if b == 0:
                total = extra
            # the queue is in order: the optimizer's kernel runs after these copies,
            # and the next step's copy to the host (which any reuse of these host
            # arrays waits for) after them too
            self._copy(lo, hi, to_host=False)
        self._events.clear()
        if not self._buckets:           # a network without parameters: the count alone
            total = self._reduce(np.empty(0, self.net.dtype), count,
                                 np.empty(0, self.net.dtype))
        return total

    def hook(self, step):
        """The gradient hook: replaces this rank's gradients by the sum over ranks and
        scales by one over the global batch."""
        if self.world.size == 1:
            return                        # nothing to sum: this rank's are the sums
        # this rank's share of the mean's denominator: its batch, or for a
        # CrossEntropyLoss its labels' total weight (the step's grad_scale is 1 over it)
        local = 1.0 / step.grad_scale if step.grad_scale else 0.0
        step.grad_scale = 1.0 / self._exchange(local)

    def train_step(self, x, y, loss=None, offset=0, precision=None,
                   global_batch=None):
        """One global step: this rank's shard (x, y: device arrays of its examples,
        or None when the global batch left this rank none), ``offset`` examples into
        the global batch (Dropout draws that part of the global batch's masks).
        ``precision``, ``global_batch``: as Sequential.train_step (every rank checks the
        same summed gradients for overflow, so all skip or update together)."""
        net = self.net
        if x is None:
            return self._step_without_examples(precision)
        return net.train_step(x, y, loss=loss, hook=self.hook, layer_hook=self._layer_done,
                              example_offset=offset, precision=precision,
                              global_batch=global_batch)

    def _step_without_examples(self, precision=None):
        """A rank whose shard of the last global batch is empty still takes part: it
        adds nothing to the sums and applies the same update (and, in float16, makes
        the same overflow check on the same sums)."""
        from .nn import amp
        from .nn.network import GradientStep
        net = self.net
        low = amp.check_precision(precision, net)
        opt = net._optimizer()
        if net.flat_parameters is not None:
            net._workspace(1)                      # the gradient buffer
            opt.prepare([net.flat_parameters])
        count = self._exchange(0.0, zero=True)
        net._finish_step(GradientStep((), (), 1.0 / count, net.flat_parameters,
                                      net.flat_gradients), amp.scaled(low))
        return None

    # ---------------------------------------------------------------- training
    def fit(self, x, y, loss=None, epochs=1, batch_size=32, lr=None, momentum=None,
            optimizer=None, scheduler=None, shuffle=True, seed=0, validation=None,
            initial_epoch=0, callback=None, precision=None):
        """``Sequential.fit`` across ranks: ``batch_size`` is the global batch; every
        global batch (the same shuffle on every rank, from ``seed``) is split into one
        shard per rank, so each example is used once per epoch, by one rank. Returns
        the history with losses averaged over every example of every rank. An
        exception on any rank ends the whole job. ``initial_epoch``, ``callback`` and
        ``precision`` as in ``Sequential.fit`` (the callback runs on every rank)."""
        net, world = self.net, self.world
        loss = net.loss_for(loss)
        if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ArgumentError(f"batch_size must be a positive int, got {batch_size!r}")
        with world.guard():
            x_host = np.asarray(x.get() if hasattr(x, "get") else x)
            y_host = np.asarray(y.get() if hasattr(y, "get") else y)
            from .nn import amp
            low = amp.check_precision(precision, net)
            scaled = amp.scaled(low)
            dt = low if low is not None else net.dtype   # the data's dtype, as fit's
            net._check_fit_optimizer(optimizer, lr, momentum)
            xd, yd, lr, momentum = net._train_args(x_host, y_host, loss, lr, momentum, dt)
            net._fit_optimizer(optimizer, lr, momentum)
            n = xd.shape[0]
            x_all = x_host.astype(dt, copy=False)
            y_all = yd.get()
            rng = np.random.default_rng(seed)
            hist = {"loss": [], "epoch_time": []}
            if validation is not None:
                hist.update(val_loss=[], val_accuracy=[])
            import time
            skipped_before = net.scaler.skipped if scaled else 0
            if shuffle:
                for _ in range(min(initial_epoch, epochs)):
                    rng.permutation(n)           # the shuffles of the epochs done
            for epoch in range(initial_epoch, epochs):
                t0 = time.perf_counter()
                order = rng.permutation(n) if shuffle else np.arange(n)
                local = 0.0
                for start in range(0, n, batch_size):
                    parts = np.array_split(order[start:start + batch_size], world.size)
                    mine = parts[world.rank]
                    if len(mine) == 0:
                        self.train_step(None, None, loss, precision=precision)
                        continue
                    xs = clnn.asarray(np.ascontiguousarray(x_all[mine]), device=net.device)
                    ys = clnn.asarray(np.ascontiguousarray(y_all[mine]), device=net.device)
                    value = self.train_step(xs, ys, loss,
                                            sum(len(p) for p in parts[:world.rank]),
                                            precision=precision,
                                            global_batch=min(batch_size, n - start))
                    local += float(value.get()) * len(mine)
                hist["loss"].append(world.comm.allreduce(local) / n)
                hist["epoch_time"].append(time.perf_counter() - t0)
                if scaled:        # the same on every rank: they skip together
                    skipped_before = amp.record_epoch(hist, net.scaler, skipped_before)
                if scheduler is not None:
                    scheduler.step()
                if validation is not None:
                    vl, va = net.evaluate(validation[0], validation[1], loss,
                                          precision=precision)
                    hist["val_loss"].append(vl)
                    hist["val_accuracy"].append(va)
                if callback is not None:
                    callback(epoch, hist)
            return hist

    def save(self, path):
        """Rank 0 writes the checkpoint (atomically); every rank waits for it."""
        with self.world.guard():
            if self.world.rank == 0:
                self.net.save(path)
            self.world.comm.Barrier()
        return path

    def identical(self):
        """Whether every rank holds bitwise the same parameters (gathered and compared
        byte for byte; for tests and checks)."""
        flat = self.net.flat_parameters
        mine = flat.get().tobytes() if flat is not None else b""
        return len(set(self.world.comm.allgather(mine))) == 1
