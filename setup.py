"""The optional C kernels of the keyed fast path (clasp/core/_kernels.c); everything else is in pyproject.toml.
Without a compiler the build goes on without them and clasp runs their Python versions."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("clasp.core._kernels", ["clasp/core/_kernels.c"], optional=True)])
