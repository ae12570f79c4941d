"""Benchmarks that tell the truth: the harness, statistics with confidence intervals, reports."""

from echo_rl.evaluation.benchmark import BenchmarkConfig, EchoRLBenchmark
from echo_rl.evaluation.methods import MethodSpec, MethodUnavailable, method_names, register_method
from echo_rl.evaluation import runners as _runners  # noqa: F401 - registers the built-in methods with the registry

__all__ = ["BenchmarkConfig", "EchoRLBenchmark", "MethodSpec", "MethodUnavailable", "method_names",
           "register_method"]
