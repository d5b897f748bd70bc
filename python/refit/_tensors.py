"""Named tensors -> the (name, exporter, dtype) entries the extension takes.

Zero copy: a torch tensor is handed over as a DLPack capsule of its own storage, a numpy array
through the buffer protocol, anything else with __dlpack__ as its capsule. refit reads (sender)
or writes (receiver) that memory in place, so it must be contiguous and, for a receiver,
writable. CUDA tensors are staged through host copies (StagedTensors below).
"""

import sys

from ._errors import InvalidArgumentError, UnsupportedError

# numpy dtype names -> refit dtype names (numpy has no bf16 or fp8: use torch for those).
_NUMPY_DTYPES = {
    "bool": "bool",
    "uint8": "u8",
    "int8": "i8",
    "int16": "i16",
    "int32": "i32",
    "int64": "i64",
    "float16": "f16",
    "float32": "f32",
    "float64": "f64",
}


def named_items(named_tensors):
    """(name, tensor) pairs of a mapping (state_dict()) or an iterable of pairs
    (named_parameters()); a name given twice is an error."""
    items = named_tensors.items() if hasattr(named_tensors, "items") else named_tensors
    seen = set()
    pairs = []
    for item in items:
        try:
            name, tensor = item
        except (TypeError, ValueError):
            raise InvalidArgumentError(
                f"expected (name, tensor) pairs or a dict of tensors, got a {type(item).__name__}"
            ) from None
        if not isinstance(name, str):
            raise InvalidArgumentError(f"expected (name, tensor) pairs: name {name!r} is not a str")
        if name in seen:
            raise InvalidArgumentError(f"tensor '{name}' is given twice")
        seen.add(name)
        pairs.append((name, tensor))
    return pairs


def _not_contiguous(name, shape, strides):
    return UnsupportedError(
        f"tensor '{name}': not contiguous (shape {tuple(shape)}, strides {tuple(strides)}); "
        "refit reads and writes a tensor's own row-major memory: publish a .contiguous() copy, "
        "attach the contiguous parameter itself"
    )


def _torch_entry(name, tensor, torch):
    from torch.utils.dlpack import to_dlpack

    tensor = tensor.detach()  # same storage; DLPack refuses tensors that require grad
    if not tensor.is_contiguous():
        raise _not_contiguous(name, tensor.shape, tensor.stride())
    if tensor.dtype == torch.bool:  # torch 1.13's DLPack has no bool: export the bytes
        return (name, to_dlpack(tensor.view(torch.uint8)), "bool")
    return (name, to_dlpack(tensor), None)


def _numpy_entry(name, array):
    dtype = _NUMPY_DTYPES.get(array.dtype.name)
    if dtype is None or not array.dtype.isnative:
        raise UnsupportedError(
            f"tensor '{name}': numpy dtype {array.dtype.str} has no refit dtype "
            f"(native {', '.join(_NUMPY_DTYPES)}; bf16 and fp8 through torch)"
        )
    return (name, array, dtype)


def entry(name, tensor):
    """The extension's entry for one CPU tensor."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(tensor, torch.Tensor):
        return _torch_entry(name, tensor, torch)
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(tensor, numpy.ndarray):
        return _numpy_entry(name, tensor)
    if hasattr(tensor, "__dlpack__"):
        return (name, tensor.__dlpack__(), None)
    raise InvalidArgumentError(
        f"tensor '{name}': a {type(tensor).__name__} is not a tensor refit can take "
        "(torch.Tensor, numpy.ndarray, or an object with __dlpack__)"
    )


def _is_device_tensor(tensor):
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(tensor, torch.Tensor) and tensor.device.type != "cpu"


class StagedTensors:
    """Entries for named tensors, with every CUDA (non-CPU torch) tensor replaced by a host copy.

    refit works on host memory only. A sender publishes the host copies made here (one
    device-to-host copy per publish); a receiver applies into host copies made at attach and
    copy_back() writes them into the device tensors after each applied version.
    """

    # --- CUDA staging: not exercised by the tests of this repository (no GPU in CI). ---
    def __init__(self, named_tensors, pin=False):
        self.entries = []
        self._staged = []  # (device tensor, host copy)
        for name, tensor in named_items(named_tensors):
            if _is_device_tensor(tensor):
                host = tensor.detach().to("cpu", copy=True)
                if pin:
                    host = host.pin_memory()
                self._staged.append((tensor, host))
                tensor = host
            self.entries.append(entry(name, tensor))

    def copy_back(self):
        """Writes the host copies into their device tensors (after a receiver applied one)."""
        for device_tensor, host in self._staged:
            with _no_grad():
                device_tensor.copy_(host)

    # --- end of the CUDA staging ---


def _no_grad():
    import torch

    return torch.no_grad()
