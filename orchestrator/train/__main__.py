"""``python -m orchestrator.train RUN_DIR [--resume/--no-resume] [--max-steps N] [--engine E]``."""
import logging
import os
import sys

from .trainer import main

code = main()
# A rank that returned has closed everything it writes (metrics.jsonl through unbuffered os.write, W&B's
# run.finish, train_status.json, its checkpoints) after dist.barrier, engine.destroy and destroy_process_group.
# It leaves without the interpreter's teardown: C++ threads of gloo and DeepSpeed's CPU ops still alive in static
# destructors can abort a finished rank there ("terminate called without an active exception", ENV-NOTES.md),
# which torchrun reports as a failed run (seen once in ~60 trainer runs of a CI pass, at 2026-12-02 08:11 UTC).
# An exception still unwinds as usual above, with its traceback.
sys.stdout.flush()
sys.stderr.flush()
logging.shutdown()
os._exit(code if isinstance(code, int) else 1)
