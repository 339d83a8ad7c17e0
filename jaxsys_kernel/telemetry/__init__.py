"""Telemetry: events from the JAX processes to the kernel, and the shapes widgets consume."""
