"""``torch.library.triton_op`` ops on CPU tensors, under Triton's interpreter (``TRITON_INTERPRET=1``).

``triton_op`` + ``wrap_triton`` is PyTorch's documented way to register a
Triton kernel, and it breaks under the interpreter (pytorch issue 152868):
``@triton.jit`` then returns an ``InterpretedFunction``, ``wrap_triton`` hands
it back unwrapped, and the op's fake kernel (``triton_op`` registers the op's
own Python body as its fake) launches the interpreter on FakeTensors, which
dies reading their data pointers.  Every compile and export cell and opcheck's
fake-tensor test of such an op fail on CPU although the op is correct.

A CPU worker makes the documented path work the way it works on a GPU:

* an interpreted launch whose tensor arguments are fake is a no-op.  That is
  exactly the fake kernel of ``wrap_triton``'s own higher-order op
  (``triton_kernel_wrapper_mutation`` under FakeTensorMode returns nothing: a
  kernel only writes into buffers the body already allocated, whose metadata
  the body computed);
* ``torch._functorch.config.decompose_custom_triton_ops`` is off, so
  AOTDispatch keeps the op as one opaque call (as ``torch.export`` always
  does) instead of inlining its kernel, which Inductor can only do for GPU
  tensors.  With it on, the fake no-op above would be traced as the kernel and
  the compiled graph would return unwritten (NaN-poisoned) buffers: the cells
  would fail loudly, never pass silently.

Only the interpreter's launch path is touched, and only in processes that run
CPU cells; GPU workers run ``triton_op`` as PyTorch ships it (the kernel is
inlined under compile and embedded by AOTInductor).
"""

from __future__ import annotations

import functools
import os
from typing import Any


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _has_fake_tensor(values: Any) -> bool:
    import torch
    from torch._subclasses.fake_tensor import is_fake

    return any(isinstance(v, torch.Tensor) and is_fake(v) for v in values)


@functools.cache
def support_triton_ops() -> bool:
    """Install the two switches above (once per process); False when Triton's interpreter is off or absent."""
    if not interpreting():
        return False
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:
        return False
    import torch._functorch.config as functorch_config

    launch = InterpretedFunction.run

    @functools.wraps(launch)
    def run(self: Any, *args: Any, grid: Any, warmup: Any, **kwargs: Any) -> Any:
        if _has_fake_tensor((*args, *kwargs.values())):
            return None
        return launch(self, *args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction.run = run
    functorch_config.decompose_custom_triton_ops = False
    return True
