"""orch: one training spec -> planned, validated, launchable DeepSpeed / Megatron-Core runs."""

__version__ = "0.1.0"
