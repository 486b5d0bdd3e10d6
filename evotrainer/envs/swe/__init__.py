"""The SWE domain: fix a seeded bug in a generated mini-repository with tools (config.py, domain.py;
repos.py generates repositories, runner.py runs their tests, demos.py scripts demonstrations,
detectors.py flags test tampering)."""
