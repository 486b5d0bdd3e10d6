"""Experimental pieces that no config reaches yet (docs/style.md 11): importable, tested, not part of the loop."""
