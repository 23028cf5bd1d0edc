"""The clnn error hierarchy.

Every check a routine makes raises one of these before anything is enqueued, so a
caller can tell bad input (ShapeError, DTypeError, ArgumentError) from a device that
cannot do the job (DeviceError, OutOfDeviceMemory) or a kernel that does not build.
The builtin base classes let code that knows nothing of clnn still catch them.
"""


class ClnnError(Exception):
    """Base class of every error clnn raises on purpose."""


class ShapeError(ClnnError, ValueError):
    """Shapes, strides, offsets or axes that an op cannot take."""


class ArgumentError(ClnnError, ValueError):
    """A scalar argument that is out of range or would produce NaN."""


class DTypeError(ClnnError, TypeError):
    """A dtype the op or the device does not support; clnn never casts silently."""


class CheckpointError(ClnnError, ValueError):
    """A saved network that is not a valid clnn checkpoint (damaged, crafted, or with
    weights that do not match its architecture); found before anything is built."""


class DistributedError(ClnnError):
    """Ranks of a data-parallel job disagree (networks, dtypes), or MPI is missing."""


class DeviceError(ClnnError):
    """No such device, or arrays that live on different devices."""


class OutOfDeviceMemory(ClnnError, MemoryError):
    """The pool cannot serve a request within its budget or the device's limits."""

    def __init__(self, message, *, request=0, budget=0, active=0, held=0):
        super().__init__(message)
        self.request = request
        self.budget = budget
        self.active = active
        self.held = held


class TemplateError(ClnnError):
    """A kernel template failed to render; carries the parameters and Mako's traceback."""

    def __init__(self, message, *, template="", params=None, traceback=""):
        super().__init__(message)
        self.template = template
        self.params = dict(params or {})
        self.traceback = traceback


class KernelBuildError(ClnnError):
    """The OpenCL compiler rejected a rendered kernel.

    ``source_path`` names a saved copy of the rendered source with line numbers, so the
    line numbers in ``log`` can be looked up.
    """

    def __init__(self, message, *, log="", options=(), params=None, source_path=None):
        super().__init__(message)
        self.log = log
        self.options = tuple(options)
        self.params = dict(params or {})
        self.source_path = source_path
