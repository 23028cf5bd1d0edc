"""Routines: validate arguments, pick the kernel variant and its parameters, launch.

Each module here has a kernel template of the same stem in clnn/kernels/.
"""

from .elementwise import (ACTIVATIONS, activation, activation_backward,
                          activation_derivative, axpy, copy, elu, fill, hadamard, identity,
                          leaky_relu, relu, scale, sigmoid, softplus, tanh)
from .bias import activation_bias_backward, bias_add, bias_grad
from .reduce import count_nonfinite, dot, max, mean, nrm2, sum
from .softmax import log_softmax, softmax, softmax_cross_entropy
from .xent import cross_entropy
from .cast import cast
from .loss import quadratic_loss
from .gemm import gemm, gemv
from .conv import conv2d, conv2d_backward_data, conv2d_backward_weight
from .optim import adam_step, sgd_step
from .batchnorm import batch_norm, batch_norm_backward, update_running_stats
from .dropout import dropout, dropout_key, dropout_key_at, dropout_mask
from .pool import avg_pool2d, avg_pool2d_backward, max_pool2d, max_pool2d_backward
from . import _memo

# the modules whose settings decide the planned ops' launches (see _memo.watch);
# clnn.programs builds and launches what they chose (tests spy on it)
_memo.watch(*[f"clnn.ops.{m}" for m in ("_args", "elementwise", "bias", "reduce", "softmax",
                                         "cast", "gemm", "conv", "pool", "batchnorm")],
            "clnn.tuning", "clnn.plans", "clnn.device", "clnn.memory")

__all__ = [
    "ACTIVATIONS", "activation", "activation_backward", "activation_derivative", "axpy",
    "copy", "elu", "fill", "hadamard", "identity", "leaky_relu", "relu", "scale",
    "sgd_step", "adam_step", "batch_norm", "batch_norm_backward", "update_running_stats",
    "dropout", "dropout_key", "dropout_key_at", "dropout_mask",
    "sigmoid", "softplus", "tanh", "bias_add", "bias_grad", "activation_bias_backward",
    "count_nonfinite", "dot", "max", "mean", "nrm2",
    "sum", "log_softmax", "softmax", "softmax_cross_entropy", "cross_entropy", "cast", "quadratic_loss", "gemm", "gemv",
    "conv2d", "conv2d_backward_data", "conv2d_backward_weight", "max_pool2d",
    "max_pool2d_backward", "avg_pool2d", "avg_pool2d_backward",
]
