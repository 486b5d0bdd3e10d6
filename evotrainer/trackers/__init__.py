"""Experiment trackers for `run.report_to`: the contract (tracker.py), the forwarder that sends them what the
run records (forward.py), and one module per backend, each imported only when named."""
