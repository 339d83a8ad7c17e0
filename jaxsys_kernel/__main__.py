"""``python -m jaxsys_kernel -f CONNECTION_FILE`` launches the jaxsys kernel."""

from ipykernel.kernelapp import IPKernelApp

from .kernel import JaxSysKernel

if __name__ == "__main__":
    IPKernelApp.launch_instance(kernel_class=JaxSysKernel)
