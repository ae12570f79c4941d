"""Builds the optional compiled kernels; all metadata lives in pyproject.toml.

The extension needs only a C++ compiler (CPython C API + buffer protocol, no numpy headers). It
is marked optional: without a compiler the build warns and the package falls back to its numpy
kernels (``echo_rl.kernels.kernels_available()`` then returns False).
Set ECHO_RL_NO_NATIVE_BUILD=1 to skip it on purpose.
"""

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """Never fail the install because the kernels could not be compiled."""

    def run(self):
        try:
            super().run()
        except Exception as exc:  # no compiler at all, or a broken toolchain
            print(f"echo-rl: compiled kernels skipped ({exc}); using the numpy kernels", file=sys.stderr)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as exc:
            print(f"echo-rl: compiled kernels skipped ({exc}); using the numpy kernels", file=sys.stderr)


ext_modules = []
if os.environ.get("ECHO_RL_NO_NATIVE_BUILD", "").lower() not in ("1", "true", "yes"):
    compile_args = [] if sys.platform == "win32" else ["-O3", "-std=c++17"]
    sources = [f"echo_rl/kernels/native/{unit}.cpp" for unit in ("module", "sumtree", "rows", "batch_math")]
    ext_modules.append(Extension("echo_rl.kernels._native", sources, depends=["echo_rl/kernels/native/common.h"],
                                 language="c++", extra_compile_args=compile_args, optional=True))

setup(ext_modules=ext_modules, cmdclass={"build_ext": OptionalBuildExt})
