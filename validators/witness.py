"""The CPU witness beside the profiler: which custom ops had their own Python body run.

Apart from :mod:`validators.profiling` because it is not a trace: it watches
code objects execute (see :func:`executed_custom_ops`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def _own_function(fn: Any) -> Any:
    """The user's function behind a ``torch.library.triton_op`` op.

    ``triton_op`` registers one closure (``backend_fn``) per op, all sharing a
    code object, around the user's body (its free variable ``fn``): the body's
    code is what identifies the op.
    """
    code = getattr(fn, "__code__", None)
    if code is not None and code.co_name == "backend_fn" and "fn" in code.co_freevars and fn.__closure__:
        inner = fn.__closure__[code.co_freevars.index("fn")].cell_contents
        if hasattr(inner, "__code__"):
            return inner
    return fn


def executed_custom_ops(fn: Callable[[], Any], qualnames: Sequence[str]) -> list[str]:
    """Which of ``qualnames`` (``torch.library.custom_op`` ops) had their own Python body run in ``fn``.

    The CPU witness beside the profiler, where a Triton kernel under the
    interpreter leaves no kernel event and torch 2.14 records no dispatcher event
    for a custom op whose arguments are all tensors (measured: ``t::two(Tensor,
    Tensor)`` leaves none, ``t::twof(Tensor, Tensor, float)`` does).  A dispatch
    mode would make Dynamo skip its compiled frames; a profile hook
    (``sys.setprofile``) does not, and it
    sees the custom op's own implementation function (``_init_fn``) execute
    inside the compiled program.  An op that
    was decomposed or replaced never runs its body, so it is never reported.
    """
    import sys

    from torch._library.custom_ops import OPDEFS

    codes: dict[Any, str] = {}
    for name in qualnames:
        opdef = OPDEFS.get(name)
        if opdef is None:
            continue
        # Only the op's own function: register_kernel wrappers share one code object across ops.
        code = getattr(_own_function(opdef._init_fn), "__code__", None)
        if code is not None:
            codes[code] = name
    ran: dict[str, None] = {}

    def hook(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code in codes:
            ran.setdefault(codes[frame.f_code], None)

    previous = sys.getprofile()
    sys.setprofile(hook)
    try:
        fn()
    finally:
        sys.setprofile(previous)
    return list(ran)
