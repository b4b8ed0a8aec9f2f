"""opgate's reporting stage: results.json files in, published matrix, diffs and alerts out.

Reads only files the validators wrote (``validators.result.RunResults``), so it
runs on a machine with no torch: ``publish`` merges runs into compat.json
(schema-checked), compat.md and a self-contained index.html; ``diff`` compares
two compat.json files; ``alert`` posts a diff's regressions to chat.
"""
