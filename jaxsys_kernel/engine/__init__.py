"""Code that runs inside each JAX process (an ipyparallel engine).

Modules here import jax and numpy only when called, never IPython display or widgets,
so they behave the same under every launcher.
"""
