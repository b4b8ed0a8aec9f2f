"""Planted faulty ops: each module registers one ``zoo::`` op with exactly one realistic bug.

Every op computes RMSNorm over the last dim of a 2-d ``x`` (same contract and
reference as ``rms_norm``) with one shared Triton kernel (:mod:`zoo_ops.kernels`),
so that a verdict difference between ``zoo_good`` and a faulty op can only come
from the planted fault.  The specs next to this package (``../*/spec.yaml``)
declare which cells each fault should affect; ``tests/zoo_cases.py`` holds the
expected verdict table.
"""
