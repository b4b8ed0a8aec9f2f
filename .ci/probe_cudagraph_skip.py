#!/usr/bin/env python3
"""Does the cudagraphs check list why Inductor skipped CUDA graphs? (GPU only)

The check's verdict counts ``counters["inductor"]["cudagraph_skips"]``; its
listing is what :func:`opgate.validators.checks.torchlog.collecting` gathers
from torch's loggers while the graphs are made.  Inductor's cudagraph logger
does not propagate to ``torch``, so a handler there alone saw nothing.  This
compiles, with ``mode="reduce-overhead"`` as the check does, a function
Inductor cannot graph as it is (an input mutated in place) and one it can,
calls each three times (warm-up, record, replay) inside the collection, and
prints each function's skip count and the collected lines the check would
list::

    python3 .ci/probe_cudagraph_skip.py
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any


def _cases() -> list[tuple[str, Callable[..., Any], Callable[[], tuple[Any, ...]]]]:
    import torch

    def mutates(x: torch.Tensor) -> torch.Tensor:
        x.add_(1.0)
        return x * 2.0

    def clean(x: torch.Tensor) -> torch.Tensor:
        return (x * 2.0).relu()

    cuda = lambda: torch.randn(64, 64, device="cuda")  # noqa: E731
    return [
        ("mutated input", mutates, lambda: (cuda(),)),
        ("clean", clean, lambda: (cuda(),)),
    ]


def main() -> int:
    import torch
    from torch._dynamo.utils import counters

    from opgate.validators.checks import torchlog

    if not torch.cuda.is_available():
        print("no CUDA device: nothing to probe")
        return 2
    for name, fn, args in _cases():
        torch._dynamo.reset()
        compiled = torch.compile(fn, mode="reduce-overhead")
        before = int(counters["inductor"]["cudagraph_skips"])
        with torchlog.collecting() as logged:
            for _ in range(3):
                compiled(*args())
        torch.cuda.synchronize()
        skips = int(counters["inductor"]["cudagraph_skips"]) - before
        listed = [line for line in logged if "cudagraph" in line.lower()]
        print(f"{name}: cudagraph_skips {skips}; listed {len(listed)}")
        for line in listed:
            print(f"    {line[:200]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
