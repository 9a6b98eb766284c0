"""``python -m orchestrator.train RUN_DIR [--resume/--no-resume] [--max-steps N] [--engine E]``."""
import sys

from .trainer import main

sys.exit(main())
