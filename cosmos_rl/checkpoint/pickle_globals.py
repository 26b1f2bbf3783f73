"""Which globals a torch `.pth`/`.pt` file's pickle names, judged before torch unpickles it.

`torch.load(weights_only=True)` admits torch's own default allowlist, wider than a state dict of
tensors needs. A file a user did not write is therefore read only when every global its pickle
names is one of the exact (module, name) pairs below: no prefix rule, no dotted names (pickle
protocol 4 resolves `a.b` as an attribute chain). The pickle is walked with `pickletools`, which
decodes opcodes and runs nothing.
"""

from __future__ import annotations

import io
import pickletools
import zipfile

# What `torch.save` of a state dict of tensors (and parameters) is made of. Meta and sparse
# tensors rebuild through torch's own functions too, so the caller can name them as what they are.
STATE_DICT_GLOBALS = frozenset(
    {("torch._utils", "_rebuild_tensor_v2"), ("torch._utils", "_rebuild_parameter"), ("collections", "OrderedDict"),
     ("torch._utils", "_rebuild_meta_tensor_no_storage"), ("torch._utils", "_rebuild_sparse_tensor"), ("torch", "sparse_coo"),
     ("torch.serialization", "_get_layout"), ("torch", "Size"), ("torch", "float32"), ("torch", "float16"), ("torch", "bfloat16"), ("torch", "float64")}
    | {("torch", f"{kind}Storage") for kind in ("Float", "Double", "Half", "BFloat16", "Long", "Int", "Short", "Char", "Byte", "Bool")}
)
_STRINGS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINSTRING", "BINSTRING", "STRING"}


def pickle_bytes(data: bytes) -> bytes:
    """The pickle of a torch file: `data.pkl` of the zip format, or the whole legacy file."""
    if zipfile.is_zipfile(io.BytesIO(data)):
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            names = [n for n in archive.namelist() if n.endswith("/data.pkl") or n == "data.pkl"]
            if len(names) != 1:
                raise ValueError(f"a torch zip file holds one data.pkl, this one {len(names)}")
            return archive.read(names[0])
    return data


def refused_global(pickled: bytes, allowed: frozenset = STATE_DICT_GLOBALS) -> str | None:
    """The first global `pickled` names that is not in `allowed`, as "module.name", or None.

    STACK_GLOBAL takes its two names from the strings pushed just before it; any other way of
    building them (memo lookups, computed strings) is refused, as nothing here can judge it.
    """
    recent: list = []
    for op, arg, _ in pickletools.genops(pickled):
        if op.name == "GLOBAL":
            module, name = str(arg).split(" ", 1)
            if (module, name) not in allowed:
                return f"{module}.{name}"
        elif op.name == "STACK_GLOBAL":
            if len(recent) < 2 or recent[-2] is None or recent[-1] is None:
                return "a STACK_GLOBAL whose names are not plain strings"
            if (recent[-2], recent[-1]) not in allowed:
                return f"{recent[-2]}.{recent[-1]}"
        elif op.name == "INST":  # protocol 0's way of naming a class: a global too
            module, name = str(arg).split(" ", 1)
            if (module, name) not in allowed:
                return f"{module}.{name}"
        if op.name in _STRINGS:
            recent.append(arg)
        elif op.name not in ("MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT"):
            recent.append(None)
        recent = recent[-2:]
    return None
