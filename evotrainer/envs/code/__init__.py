"""The code domain: write a Python function; hidden tests in the sandbox are the audit (config.py,
domain.py; tasks.py generates tasks, data.py loads HumanEval / MBPP files, detectors.py flags
hard-coded examples and code that does not run)."""
