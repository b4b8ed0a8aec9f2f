"""The validators stage: run every cell in an isolated worker and judge it with evidence.

Importing the package hands the harness's CUDA build (:mod:`.cuda_build`) to the
payload (:mod:`opgate.ops._extension`): ``ops/`` imports none of the stages, yet
its CUDA ops and launch replay need a library built the way the build cells
inspect it.  ``cuda_build`` imports only the standard library at module level.
"""

from opgate.validators import cuda_build as _cuda_build

_cuda_build.install()
