"""The reference trainer that consumes a run dir: ``python -m orchestrator.train RUN_DIR``.

Modules: trainer.py (the loop, options, exit codes), model.py (the GPT), mlp.py (its feed-forward), data.py (deterministic
data), engine.py (DeepSpeed: ZeRO 0-3 and the pipeline engine), megatron_engine.py (Megatron-Core,
GPU), checkpoint.py, signals.py, session.py (telemetry wiring).
"""
