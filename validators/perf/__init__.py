"""Performance measurement and regression detection (GPU only; CPU cells record nothing).

Modules:

* :mod:`~validators.perf.timing`    CUDA-event timing: warm-up, L2 flush, rotating inputs, A/B, clocks
* :mod:`~validators.perf.ceilings`  the run's measured copy-bandwidth and GEMM ceilings
* :mod:`~validators.perf.stats`     the regression rule: :func:`~validators.perf.stats.judge` (pure Python)
* :mod:`~validators.perf.study`     measured quality of the rule: A/A false alarms and a planted slowdown
* :mod:`~validators.perf.block`     a decoder block with opgate's ops vs stock PyTorch
* :mod:`~validators.perf.bench`     the opgate-wide benchmark table against peers

Bytes and FLOPs come from the spec's ``cost`` through :mod:`opgate.matrix.cost`.
The per-cell check is :mod:`validators.checks.perf`; the command line is
``opgate perf {bench,study,block}``.
"""
