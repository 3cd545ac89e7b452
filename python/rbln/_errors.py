"""The exceptions of the rbln package.

Every error from the stack is an :class:`RBLNError`. Wrong inputs are also
``ValueError`` (count, shape, values) or ``TypeError`` (dtype), with the
same messages ``rbln-run`` prints (naming the tensor, expected vs got).
"""


class RBLNError(Exception):
    """Base class of every rbln error."""


class RBLNRuntimeError(RBLNError, RuntimeError):
    """The runtime or the device failed to run a request."""


class RBLNDeviceError(RBLNRuntimeError):
    """No usable NPU: rbln.ko not loaded, no such device, no permission,
    or every device context in use."""


class RBLNDeviceLostError(RBLNDeviceError):
    """The NPU or this device context is gone: the device was removed, or
    a fault or hang poisoned the context. Create a new Runtime."""


class RBLNTimeoutError(RBLNRuntimeError, TimeoutError):
    """A request did not finish in time on the device."""


class RBLNClosedError(RBLNRuntimeError):
    """The runtime was closed."""


class RBLNCompileError(RBLNError):
    """The compiler refused the model (unsupported op, invalid model, ...)."""


class RBLNModelError(RBLNError, ValueError):
    """A .rbln model that cannot be loaded (bad file, wrong hardware)."""


class RBLNModelNotFoundError(RBLNModelError, FileNotFoundError):
    """The .rbln file does not exist."""


class RBLNInputError(RBLNError, ValueError):
    """Wrong inputs: count, shape, length or values."""


class RBLNInputTypeError(RBLNError, TypeError):
    """An input of the wrong dtype."""


class RBLNValueError(RBLNError, ValueError):
    """A bad argument (other than the inputs)."""


class RBLNTypeError(RBLNError, TypeError):
    """An argument of the wrong type (other than the inputs)."""


class RBLNOSError(RBLNError, OSError):
    """A file could not be read or written."""


__all__ = [
    "RBLNError",
    "RBLNRuntimeError",
    "RBLNDeviceError",
    "RBLNDeviceLostError",
    "RBLNTimeoutError",
    "RBLNClosedError",
    "RBLNCompileError",
    "RBLNModelError",
    "RBLNModelNotFoundError",
    "RBLNInputError",
    "RBLNInputTypeError",
    "RBLNValueError",
    "RBLNTypeError",
    "RBLNOSError",
]
