"""Experimental pieces that no config reaches yet (STYLE.md 11): importable, tested, not part of the loop."""
