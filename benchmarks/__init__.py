"""Side-by-side benchmarks of the build against a no-framework floor and a naive peer (``python -m benchmarks.run``)."""
