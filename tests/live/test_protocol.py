"""Protocol conformance of the jaxsys kernel with jupyter_kernel_test's standard checks.

The kernel runs ordinary cells in its own process, so the standard samples apply as they
are; the replies to cells that run on the engines are validated in test_kernel.py.
"""

from __future__ import annotations

import jupyter_kernel_test as jkt

from ..harness import TAG_VAR, new_tag, wait_no_processes


class JaxSysProtocolTests(jkt.KernelTests):
    kernel_name = "jaxsys"
    language_name = "python"
    file_extension = ".py"

    code_hello_world = "print('hello, world')"
    code_stderr = "import sys; print('oops', file=sys.stderr)"
    completion_samples = [{"text": "zi", "matches": {"zip"}}]
    complete_code_samples = ["1", "print('hello, world')", "def f(x):\n  return x*2\n\n"]
    incomplete_code_samples = ["print('''hello", "def f(x):\n  x*2"]
    invalid_code_samples = ["import = 7q"]
    code_page_something = "zip?"
    code_generate_error = "raise ValueError('boom')"
    code_execute_result = [{"code": "6*7", "result": "42"}]
    code_display_data = [
        {
            "code": "from IPython.display import HTML, display; display(HTML('<b>x</b>'))",
            "mime": "text/html",
        }
    ]
    code_history_pattern = "6*7"
    # "range" is left out: IPython answers a range request for the current session with
    # session number 0, which this check rejects for the stock python3 kernel as well.
    supported_history_operations = ("tail", "search")
    code_inspect_sample = "zip"
    code_clear_output = "from IPython.display import clear_output; clear_output()"

    @classmethod
    def setUpClass(cls):
        import os

        cls._tag = new_tag()
        cls._old_tag = os.environ.get(TAG_VAR)
        os.environ[TAG_VAR] = cls._tag
        super().setUpClass()

    @classmethod
    def tearDownClass(cls):
        import os

        super().tearDownClass()
        if cls._old_tag is None:
            os.environ.pop(TAG_VAR, None)
        else:
            os.environ[TAG_VAR] = cls._old_tag
        assert not wait_no_processes(cls._tag, timeout=10)
