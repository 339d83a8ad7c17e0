"""The jaxsys Jupyter kernel."""

from .kernel import JaxSysKernel

__all__ = ["JaxSysKernel"]
