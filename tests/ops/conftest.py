"""Direct op tests run the Triton kernels on CPU tensors through Triton's interpreter.

TRITON_INTERPRET must be set before ``triton.jit`` decorates any kernel, i.e.
before ``ops.*.triton_impl`` is imported, so it is set here at collection time.
"""

from __future__ import annotations

import os

if os.environ.get("OPGATE_TEST_DEVICE", "cpu") == "cpu":
    # OPGATE_TEST_DEVICE=cuda runs the same tests on the GPU with compiled kernels
    os.environ.setdefault("TRITON_INTERPRET", "1")
