"""The network API: layers, Sequential networks, sgd and fit, save and load."""

from .layers import AvgPool2d, Conv2d, Dense, Flatten, MaxPool2d
from .network import LOSSES, Sequential, load, sgd

__all__ = ["Dense", "Conv2d", "MaxPool2d", "AvgPool2d", "Flatten", "Sequential", "sgd",
           "load", "LOSSES"]
