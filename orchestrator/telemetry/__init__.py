"""Per-step telemetry: step timing, collective timing, bubble, memory, and the sinks they feed.

Modules: record.py (the metrics record and its schema), comm.py (time in collectives), timing.py
(busy time, peak memory), metrics.py (the formulas), step.py (StepTelemetry: per-step aggregation
over ranks), sinks.py (metrics.jsonl, console), wandb_sink.py (W&B), wrapper.py (the same record for a user's
program, observed from outside) and devicetime.py (its CUDA-event clock). Nothing here imports deepspeed.
"""
