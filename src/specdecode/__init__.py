"""specdecode: exact speculative decoding (Leviathan, Kalman & Matias, ICML 2023)."""

__version__ = "0.1.0"
