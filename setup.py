"""Build of psfleet's native sparse-table core, ``psfleet.ps.table._core`` (issue 41).

Everything else is in pyproject.toml. The extension is C++17 bound with pybind11
(``[build-system].requires``), compiled by g++ at ``pip install``; nothing prebuilt
is downloaded. Without a working C++ compiler the install fails with a message that
names g++ (BuildNative below). The sources' flags: -O3, warning-free under
-Wall -Wextra, and -ffp-contract=off so no multiply-add is fused: the rules' float32
arithmetic must round exactly as numpy's (psfleet/ps/table/rules.py).
"""

from __future__ import annotations

import os
import shutil

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

NATIVE = "psfleet/ps/table/_native"
SOURCES = ["index.cpp", "pool.cpp", "table.cpp", "module.cpp"]
# -fno-tree-loop-distribute-patterns: short row copies stay inline loops, not memmove calls.
FLAGS = ["-std=c++17", "-O3", "-Wall", "-Wextra", "-ffp-contract=off", "-fvisibility=hidden",
         "-fno-tree-loop-distribute-patterns"]


class BuildNative(build_ext):
    """build_ext that compiles the sources two at a time and turns a missing or broken
    compiler into one clear error."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if self.parallel is None:
            self.parallel = min(4, os.cpu_count() or 1)

    def build_extension(self, ext: Extension) -> None:
        import pybind11

        ext.include_dirs.append(pybind11.get_include())
        extra = os.environ.get("PSFLEET_NATIVE_CFLAGS", "").split()  # e.g. sanitizers
        ext.extra_compile_args = FLAGS + extra
        ext.extra_link_args = [f for f in extra if f.startswith("-fsanitize")]
        compiler = (self.compiler.compiler_cxx or ["g++"])[0]
        if shutil.which(compiler) is None:
            raise SystemExit(
                f"psfleet: no C++ compiler ({compiler!r} not found) to build the native "
                f"sparse-table core ({NATIVE}/*.cpp). It needs g++ with C++17: install it "
                "(Debian: apt-get install g++ python3-dev), then run pip install again.")
        try:
            super().build_extension(ext)
        except Exception as exc:  # CompileError, LinkError
            raise SystemExit(
                f"psfleet: g++ failed to build the native sparse-table core "
                f"({NATIVE}/*.cpp): {exc}. It needs g++ with C++17 and Python's headers "
                "(Debian: apt-get install g++ python3-dev).") from exc


setup(
    ext_modules=[Extension("psfleet.ps.table._core",
                           [f"{NATIVE}/{name}" for name in SOURCES],
                           depends=[f"{NATIVE}/{h}" for h in
                                    ("index.hpp", "pool.hpp", "rules.hpp", "table.hpp")],
                           language="c++")],
    cmdclass={"build_ext": BuildNative},
)
