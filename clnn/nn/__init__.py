"""The network API: layers, Sequential networks, sgd and fit (float32, or mixed
precision with a GradScaler), save and load."""

from .layers import (AvgPool2d, BatchNorm1d, BatchNorm2d, Conv2d, Dense, Dropout, Flatten,
                     MaxPool2d)
from .amp import GradScaler
from .losses import CrossEntropyLoss
from .network import LOSSES, Sequential, load, sgd

__all__ = ["Dense", "Conv2d", "MaxPool2d", "AvgPool2d", "Flatten", "Dropout", "BatchNorm1d",
           "BatchNorm2d", "Sequential", "sgd", "load", "LOSSES", "CrossEntropyLoss", "GradScaler"]
