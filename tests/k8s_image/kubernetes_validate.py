"""Stands in for kubernetes-validate in the test cluster's pods, kernels and jobs.

kubernetes-validate is a test tool here (tests/unit checks manifests against the schemas).
Where it is installed, the ``kubernetes`` client imports it, with jsonschema and its format
checkers, on every import: about a second per process on these machines, which a user's
kernel and a pod's image (jaxsys and ``kubernetes``, not the test tools) never pay. The
test cluster puts this folder first on ``PYTHONPATH`` of what it runs, so that they import
as a user's would; the client reads the ImportError as "not installed".
"""

raise ImportError("kubernetes-validate is a test tool, not part of a pod's image or a kernel's")
