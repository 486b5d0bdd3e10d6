"""The paper's claims, measured: the loop against a human-engineered reference harness, per domain.

Arms per domain and seed, one total budget of generated tokens for each (the loop's trials, A-A controls and
gate evaluations all count against it; a static arm spends all of it on training), defined in arms.py:

- static_default: the domain's example config (examples/<domain>.yaml), trained unchanged;
- static_reference: the human-engineered reference (examples/reference/<domain>.yaml), trained unchanged;
- loop_default / loop_reference: the co-evolution loop started from each, with an empty skill library;
- loop_default_warm: loop_default again, starting with the skill library loop_default left and
  loop.adopt_skills on (what loop_default won from the same start is adopted there without a trial) (skills);
- loop_default_across: the same with the library the source domain's loop_default left at the same seed
  (arms.ACROSS_FROM: code's from swe_short_300k's, and back) and loop.adopt_skills `across` (a regrade learned
  there is adopted as the term it plays here) (skills that cross domains);
- loop_default_project: loop_default_warm at a seed outside arms.PROJECT_SEEDS, its library the cold runs of those
  seeds merged, skills and losses (a project's earlier runs: what they won is adopted, what they lost on the same
  harness is not raced again near the step it lost at) (skills, as a project accumulates them);
- planted: a three-round loop from the default with invalid interventions planted, one a round;
- base: the warm-started policy untrained, for scale.

Every arm is read on the same fresh tasks: drawn under another seed, minus every question the seed put in
its train or held-out split, so no policy trained on them and no gate read them (benchmarks/fresh_read.py).
Each (domain, arm, seed) is a resumable cell (cells.py) writing benchmarks/results/claims/<domain>-<arm>-<seed>.json
with its manifest (a finished cell is skipped; an unfinished loop resumes from its ledger), so the grid runs
over sittings; aggregate.py reads the cells into benchmarks/results/claims.json and the table; sweep.py is the
reference's tuning. From the repository root:

    python -m benchmarks.claims cell math loop_default 1      # one cell
    python -m benchmarks.claims grid --domains math --seeds 1 2 3
    python -m benchmarks.claims aggregate       # -> benchmarks/results/claims.json and the table
    python -m benchmarks.claims sweep math --lr 0 3e-5 1e-4 3e-4 1e-3   # the human's tuning (0: base)

The sweep is the reference's tuning: static_reference at each learning rate on TUNING_SEED, read on
tasks that no benchmark seed trains on, is gated on or is read on.
"""
