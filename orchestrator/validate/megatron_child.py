"""The subprocess side of the real Megatron checks: ``python -m orchestrator.validate.megatron_child MODE``.

Reads one JSON request on stdin and writes one JSON result to the file named by the request's
``result_path`` (Megatron prints freely on stdout/stderr; the result file is not mixed with that).
Modes:

* ``lm-check``: Megatron-LM's own ``parse_args`` + ``validate_args`` (megatron/training/arguments.py of
  the tree at ``root``) on ``args``, then what ``pretrain_gpt.py`` does next with them on CPU: the
  micro-batch calculator, the null tokenizer's padded vocabulary, ``core_transformer_config_from_args``
  and, from that config, the transformer layers Megatron-Core builds on each pipeline rank
  (``get_num_layers_to_build`` summed over the rank's virtual stages; fact ``layers_per_pipeline_rank``).
* ``lm-flags``: the flag table of that ``arguments.py`` (flag -> dest, arity, type, choices, default).
* ``core-config``: ``TransformerConfig(**kwargs)`` from megatron-core, dotted object names resolved.
* ``batch``: a list of the above, answered in order (one interpreter, one megatron import).

Only this process imports torch / megatron; it runs in a fresh interpreter so that Megatron's globals,
monkey-patches and prints never reach the caller.
"""
from __future__ import annotations

import argparse
import contextlib
import enum
import importlib
import importlib.util
import io
import json
import os
import re
import sys
import traceback
import types
from pathlib import Path

PRETRAIN_GPT_DEFAULTS = {"tokenizer_type": "GPT2BPETokenizer"}  # what pretrain_gpt.py passes as args_defaults
# Transformer Engine on the target GPU machines when it is not installed here: the lowest version
# megatron-core 0.16.1 declares (its "dev" extra: transformer-engine>=2.9.0a0,<2.12.0). Only version checks
# read it (FP8 with MoE, grouped GEMM); code that needs TE itself still fails or is reported as skipped.
TARGET_TE_VERSION = "2.9.0"


def _load_arguments_module(root: str, device_arch: int):
    """megatron.training.arguments from ``root``, with megatron.core from the installed megatron-core.

    ``root`` goes to the END of sys.path, so an installed megatron-core wins over a checkout's own
    megatron/core. The megatron.training package is created bare (its __init__ imports the whole training
    stack, which needs triton and CUDA); the names its submodules import from it come from global_vars.
    """
    if "megatron.training" not in sys.modules:
        sys.path.append(root)
        package = types.ModuleType("megatron.training")
        package.__path__ = [str(Path(root) / "megatron" / "training")]
        sys.modules["megatron.training"] = package
        global_vars = importlib.import_module("megatron.training.global_vars")
        package.__dict__.update({k: v for k, v in vars(global_vars).items() if k.startswith("get_")})
    arguments = importlib.import_module("megatron.training.arguments")
    arguments.get_device_arch_version = lambda: device_arch  # asks the GPU otherwise
    # --moe-grouped-gemm asks torch.cuda for the compute capability: answer as the target GPU would.
    arguments.torch.cuda.get_device_capability = lambda device=None: (device_arch, 0)
    return arguments


def _apply_env(env: dict) -> None:
    """This request's launch environment (a batch runs several in one process)."""
    for key in ("CUDA_DEVICE_MAX_CONNECTIONS", "WORLD_SIZE", "RANK", "LOCAL_RANK"):
        os.environ.pop(key, None)
    os.environ.update(env)


def _error(stage: str, exc: BaseException, captured: str, root: str | None = None) -> dict:
    """The failure as data: stage, exception type, message, and the raising source line."""
    source = ""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if "/megatron/" in frame.filename:
            owner = "Megatron-LM" if root and frame.filename.startswith(root) else "megatron-core"
            source = f"{owner} {Path(frame.filename).name}:{frame.lineno}: {(frame.line or '').strip()}"
            break
    message = str(exc)
    if isinstance(exc, SystemExit):
        message = _argparse_message(captured) or _last_line(captured) or f"exited with code {exc.code}"
    return {"stage": stage, "type": type(exc).__name__, "message": message, "source": source,
            "output_tail": captured[-2000:]}


def _last_line(captured: str) -> str:
    lines = [line.strip() for line in captured.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _argparse_message(captured: str) -> str:
    lines = [line for line in captured.splitlines() if ": error: " in line]
    return lines[-1].split(": error: ", 1)[1] if lines else ""


def lm_check(request: dict) -> dict:
    arguments = _load_arguments_module(request["root"], request.get("device_arch", 9))
    _apply_env(request.get("env", {}))
    out = io.StringIO()
    facts: dict = {}
    stage = "parse_args"
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            sys.argv = ["pretrain_gpt.py", *request["args"]]
            args = arguments.parse_args()
            stage = "validate_args"
            args = arguments.validate_args(args, dict(PRETRAIN_GPT_DEFAULTS))
            facts.update(data_parallel_size=args.data_parallel_size,
                         virtual_pipeline_model_parallel_size=args.virtual_pipeline_model_parallel_size,
                         grad_reduce_in_fp32=bool(args.accumulate_allreduce_grads_in_fp32))
            stage = "num_microbatches"
            facts["num_microbatches"] = _num_microbatches(args)
            if args.tokenizer_type == "NullTokenizer":
                stage = "build_tokenizer"
                from megatron.training.tokenizer import build_tokenizer  # noqa: PLC0415

                build_tokenizer(args)
                facts["padded_vocab_size"] = args.padded_vocab_size
            stage = "core_transformer_config_from_args"
            _assume_target_te_version()     # as core_config: TE's version checks answered as on the target GPUs
            facts.update(_transformer_config(arguments, args))
    except (Exception, SystemExit) as exc:  # noqa: BLE001  (every failure is the answer)
        return {"ok": False, "error": _error(stage, exc, out.getvalue(), request["root"]), "facts": facts}
    return {"ok": True, "facts": facts}


def _transformer_config(arguments, args) -> dict:
    """pretrain_gpt's TransformerConfig; a refusal that only says Transformer Engine is missing HERE is
    recorded as skipped (the target GPU machines run --transformer-impl transformer_engine)."""
    try:
        config = arguments.core_transformer_config_from_args(args)
        return {"transformer_config": type(config).__name__, "layers_per_pipeline_rank": _layers_per_rank(config)}
    except ValueError as exc:
        if _te_installed() or not re.search(r"install TE|Transformer ?Engine", str(exc)):
            raise
        return {"skipped": f"core_transformer_config_from_args needs Transformer Engine, not installed here: {exc}"}


def _layers_per_rank(config) -> list[int]:
    """Transformer layers Megatron-Core builds on each pipeline rank (all its virtual stages)."""
    from megatron.core.transformer.transformer_block import get_num_layers_to_build  # noqa: PLC0415

    vpp = config.virtual_pipeline_model_parallel_size or 1
    return [sum(get_num_layers_to_build(config, vp_stage=v if vpp > 1 else None, pp_rank=rank) for v in range(vpp))
            for rank in range(config.pipeline_model_parallel_size)]


def _te_installed() -> bool:
    return importlib.util.find_spec("transformer_engine") is not None


def _num_microbatches(args) -> int:
    """The micro-batch calculator pretrain() sets up (it asserts the batch arithmetic)."""
    from megatron.core import num_microbatches_calculator as calc  # noqa: PLC0415

    calc.init_num_microbatches_calculator(args.rank, args.rampup_batch_size, args.global_batch_size,
                                          args.micro_batch_size, args.data_parallel_size,
                                          args.decrease_batch_size_if_needed)
    try:
        return calc.get_num_microbatches()
    finally:
        calc.unset_num_microbatches_calculator()


def lm_flags(request: dict) -> dict:
    arguments = _load_arguments_module(request["root"], 9)
    parser = argparse.ArgumentParser(allow_abbrev=False)
    with contextlib.redirect_stdout(io.StringIO()):
        arguments.add_megatron_arguments(parser)
    flags = {}
    for action in parser._actions:  # noqa: SLF001  (argparse has no public listing)
        for flag in action.option_strings:
            if flag.startswith("--"):
                flags[flag] = _describe_action(action, flag)
                if flag != action.option_strings[0] and action.option_strings[0].startswith("--"):
                    flags[flag]["alias_of"] = action.option_strings[0]
    return {"ok": True, "flags": flags}


_ACTIONS = {"_StoreAction": "store", "_StoreTrueAction": "store_true", "_StoreFalseAction": "store_false",
            "_StoreConstAction": "store_const", "_AppendAction": "append", "_CountAction": "count",
            "BooleanOptionalAction": "boolean_optional", "_HelpAction": "help"}


def _describe_action(action: argparse.Action, flag: str) -> dict:
    entry: dict = {"dest": action.dest, "action": _ACTIONS.get(type(action).__name__, "store")}
    if entry["action"] in ("store", "append"):
        entry["nargs"] = action.nargs if action.nargs is not None else 1
        entry["type"] = _type_name(action.type)
    if action.choices is not None:
        entry["choices"] = [_plain(c) for c in action.choices]
    default = _plain(action.default)
    if default is not None and _json_ok(default):
        entry["default"] = default
    if entry["action"] == "boolean_optional":
        entry["value"] = not flag.startswith("--no-")
    if _deprecated(action):
        entry["deprecated"] = True
    return entry


def _type_name(kind) -> str:
    if kind in (int, float):
        return kind.__name__
    return "str"


def _plain(value):
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _json_ok(value) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def _deprecated(action: argparse.Action) -> bool:
    """Deprecated or 'do not use' by Megatron-LM's own help text or dest name."""
    text = (action.help or "").lower()
    return ("deprecated" in action.dest or ("deprecated" in text and not re.search(r"(will be|was) deprecated", text))
            or (text.startswith("old ") and "do not use" in text))


def _assume_target_te_version() -> None:
    """Answer megatron-core's TE version checks as the target machines would (TE absent here)."""
    if _te_installed():
        return
    import megatron.core.utils as core_utils  # noqa: PLC0415
    from packaging.version import Version  # noqa: PLC0415

    core_utils._te_version = Version(TARGET_TE_VERSION)


def core_config(request: dict) -> dict:
    from megatron.core.transformer import TransformerConfig  # noqa: PLC0415

    _assume_target_te_version()

    kwargs = resolve_objects(request["config"], request.get("object_fields", []))
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            TransformerConfig(**kwargs)
    except (Exception, SystemExit) as exc:  # noqa: BLE001
        return {"ok": False, "error": _error("TransformerConfig", exc, out.getvalue())}
    return {"ok": True}


def resolve_objects(config: dict, object_fields: list[str]) -> dict:
    """Replace the dotted names in ``object_fields`` by the objects they name."""
    kwargs = dict(config)
    for key in object_fields:
        if isinstance(kwargs.get(key), str):
            kwargs[key] = resolve_dotted(kwargs[key])
    return kwargs


def resolve_dotted(name: str):
    """``torch.bfloat16`` / ``megatron.core.transformer.enums.AttnBackend.flash`` -> the object."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(f"cannot resolve {name!r}")


def batch(request: dict) -> dict:
    """Several requests in this one process (saves the ~4 s megatron import per request)."""
    return {"ok": True, "results": [MODES[r["mode"]](r) for r in request["requests"]]}


MODES = {"lm-check": lm_check, "lm-flags": lm_flags, "core-config": core_config, "batch": batch}


def main() -> int:
    request = json.loads(sys.stdin.read())
    try:
        result = MODES[request["mode"]](request)
    except (Exception, SystemExit) as exc:  # noqa: BLE001  (setup failures: missing package, bad root)
        result = {"ok": False, "error": _error("setup", exc, "", None), "setup_failed": True}
    Path(request["result_path"]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
