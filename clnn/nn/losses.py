"""Loss options for ``fit``, ``train_step`` and ``evaluate`` beyond the names
"quadratic" and "cross_entropy": PyTorch's nn.CrossEntropyLoss arguments."""

import numpy as np

from ..errors import ArgumentError
from ..ops._args import finite


class CrossEntropyLoss:
    """Cross-entropy of a softmax output layer against class labels, with PyTorch's
    nn.CrossEntropyLoss options: ``weight`` (C class weights), ``ignore_index`` (labels
    that count for nothing) and ``label_smoothing``; the mean over the labels' total
    weight, as PyTorch. The labels go to the device as int32 and the loss kernel reads
    them (no one-hot rows on the host). ``loss="cross_entropy"`` is the plain case on
    its fast path.
    """

    def __init__(self, weight=None, ignore_index=-100, label_smoothing=0.0):
        if weight is not None:
            weight = np.asarray(weight, dtype=np.float64)
            if weight.ndim != 1 or not np.all(np.isfinite(weight)) or np.any(weight < 0):
                raise ArgumentError("weight must be a 1-D sequence of finite numbers >= 0")
        if not isinstance(ignore_index, (int, np.integer)) or isinstance(ignore_index, bool) \
                or not -2 ** 31 <= ignore_index < 2 ** 31:
            raise ArgumentError(f"ignore_index must be a 32-bit int, got {ignore_index!r}")
        self.label_smoothing = finite(label_smoothing, "label_smoothing")
        if not 0 <= self.label_smoothing <= 1:
            raise ArgumentError(f"label_smoothing must lie in [0, 1], got {label_smoothing}")
        self.weight, self.ignore_index = weight, int(ignore_index)

    def __repr__(self):
        return (f"CrossEntropyLoss(weight={None if self.weight is None else list(self.weight)}"
                f", ignore_index={self.ignore_index}, "
                f"label_smoothing={self.label_smoothing})")
