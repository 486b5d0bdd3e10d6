"""Ways in for runs trained elsewhere: importers of TRL's and verl's logged rollouts, and a TRL callback."""
