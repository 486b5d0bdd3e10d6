"""`python -m evotrainer.cli`: the same app as the console script."""

from evotrainer.cli.main import main

main()
