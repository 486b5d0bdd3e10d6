"""The stage bodies of a round (loop.py calls them in order): start.py (the run's ends), evidence.py
(train, diagnose, revise), search.py (propose, replay), decide.py (trial, gate, promote, remember);
results.py types what each returns, context.py runs each once."""
