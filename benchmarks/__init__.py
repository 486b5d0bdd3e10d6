"""Benchmarks: side-by-side measurements of the package, each run from the repository root as
`python -m benchmarks.NAME`; results under benchmarks/results/, each with its manifest."""
