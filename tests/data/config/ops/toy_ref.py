"""Importable fixture for ``resolve`` (lives on the --ops-path root)."""


def reference(x: float) -> float:
    return x


def sample_inputs() -> list[float]:
    return [1.0]
