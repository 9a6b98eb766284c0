"""orch doctor: measure a cluster through the run's own launch path before the run.

- :mod:`.probe` runs on every rank (``python -m orchestrator.doctor.probe RUN_DIR``, started by the run
  dir's launch script with ``ORCH_ENTRY``): preflight facts, a GEMM rate, collectives, pairwise node tests;
- :mod:`.report` turns the ranks' results into the report (per-node table, outliers), pure;
- :mod:`.run` starts the probe with the local, SLURM or pdsh backend within a bounded time;
- :mod:`.measured` feeds a doctor.json into the cost model (``orch plan/generate --measured``).
"""
