"""The network API: dense layers, Sequential networks, sgd and fit, save and load."""

from .layers import Dense
from .network import LOSSES, Sequential, load, sgd

__all__ = ["Dense", "Sequential", "sgd", "load", "LOSSES"]
