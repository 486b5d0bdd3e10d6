"""The `evotrainer` command line: main.py assembles one app from the command modules (train, harness,
loop, skills), which share only common.py."""
