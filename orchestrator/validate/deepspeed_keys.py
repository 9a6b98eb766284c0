"""Derive, from the INSTALLED DeepSpeed, the ds_config keys and value types it reads.

``python -m orchestrator.validate.deepspeed_keys --regenerate`` rewrites
``orchestrator/validate/_deepspeed_keys_data.py``; ``--check`` exits 1 when that file is stale (a test runs
it). ``orch validate`` reads only the generated module, so it never imports deepspeed. How each fact is
obtained: docs/internals.md, "validate/deepspeed_keys.py".
"""
from __future__ import annotations

import argparse
import ast
import enum
import inspect
import pathlib
import pprint
import sys
import types
import typing
from typing import Any

from ._ds_probe import CANARY_KEY, TargetMpu, start_single_process_group

DATA_MODULE = pathlib.Path(__file__).with_name("_deepspeed_keys_data.py")
REGENERATE = "python -m orchestrator.validate.deepspeed_keys --regenerate"
OPEN_SECTIONS_CHECKED = ("optimizer", "scheduler", "pipeline")
_BASE = {"train_batch_size": 1}
_RICH = {"train_batch_size": 1, CANARY_KEY: 1,
         "optimizer": {"type": "adam", "params": {"lr": 1e-3}, CANARY_KEY: 1},
         "scheduler": {"type": "WarmupLR", "params": {}, CANARY_KEY: 1},
         "pipeline": {CANARY_KEY: 1}, "zero_optimization": {"stage": 1}, "bf16": {"enabled": True}}


class _Reads:
    """Every (section prefix, key) DeepSpeed looked up, with the default it offered."""

    def __init__(self) -> None:
        self.defaults: dict[str, dict[str, set]] = {}

    def note(self, prefix: str, key: Any, default: Any) -> None:
        if isinstance(key, str):
            self.defaults.setdefault(prefix, {}).setdefault(key, set()).add(_default_token(default))


def _default_token(default: Any) -> Any:
    if isinstance(default, (bool, int, float, str)) or default is None:
        return (type(default).__name__, default)
    return (type(default).__name__, None)


class _KeysView:
    def __init__(self, owner: "_RecordingDict") -> None:
        self._owner = owner

    def __contains__(self, key: Any) -> bool:
        self._owner._note(key, None)
        return dict.__contains__(self._owner, key)

    def __iter__(self):
        return iter(dict.keys(self._owner))

    def __len__(self) -> int:
        return dict.__len__(self._owner)


class _RecordingDict(dict):
    """A dict noting the keys looked up in it; nested dicts are wrapped as they are read.

    ``__iter__`` is deliberately not overridden: ``f(**d)`` then copies the dict without calling our
    methods, so keys handed wholesale to a pydantic model are not mistaken for keys DeepSpeed reads.
    """

    def __init__(self, data: dict, reads: _Reads, prefix: str = "") -> None:
        super().__init__(data)
        self._reads = reads
        self._prefix = prefix

    def _note(self, key: Any, default: Any) -> None:
        self._reads.note(self._prefix, key, default)

    def _wrap(self, key: Any, value: Any) -> Any:
        if isinstance(value, dict) and not isinstance(value, _RecordingDict):
            value = _RecordingDict(value, self._reads, f"{self._prefix}{key}.")
            dict.__setitem__(self, key, value)
        return value

    def __getitem__(self, key: Any) -> Any:
        self._note(key, None)
        return self._wrap(key, dict.__getitem__(self, key))

    def get(self, key: Any, default: Any = None) -> Any:
        self._note(key, default)
        return self._wrap(key, dict.__getitem__(self, key)) if dict.__contains__(self, key) else default

    def __contains__(self, key: Any) -> bool:
        self._note(key, None)
        return dict.__contains__(self, key)

    def keys(self):  # type: ignore[override]
        return _KeysView(self)

    def pop(self, key: Any, *default: Any) -> Any:
        self._note(key, default[0] if default else None)
        return dict.pop(self, key, *default)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        self._note(key, default)
        return dict.setdefault(self, key, default)


def trace_reads(configs: list[tuple[dict, Any]], reads: _Reads | None = None) -> _Reads:
    """Build DeepSpeedConfig from each (config, mpu) through a recording dict; failures are fine."""
    from deepspeed.runtime.config import DeepSpeedConfig  # noqa: PLC0415

    reads = reads if reads is not None else _Reads()
    for config, mpu in configs:
        try:
            DeepSpeedConfig(_RecordingDict(config, reads), mpu=mpu)
        except Exception:  # noqa: BLE001 - the look-ups made before a failure are still real
            pass
    for prefix, keys in reads.defaults.items():
        if CANARY_KEY in keys:
            raise RuntimeError(f"tracing recorded the canary key under {prefix!r}: the recorder is unreliable")
    return reads


def removed_keys() -> tuple[list[str], list[str]]:
    """Top-level and zero_optimization keys DeepSpeed refuses as removed features."""
    import deepspeed.runtime.config as ds_config  # noqa: PLC0415

    return (sorted(getattr(ds_config, "_REMOVED_TOP_LEVEL_CONFIG_KEYS", {})),
            sorted(getattr(ds_config, "_REMOVED_ZERO_CONFIG_KEYS", {})))


def literal_keys(source: str, container: str, function: str | None = None) -> set[str]:
    """String keys used on ``container`` (``k in c``, ``c[k]``, ``c.get(k)``) in ``source``."""
    tree = ast.parse(source)
    if function is not None:
        tree = next(node for node in ast.walk(tree)
                    if isinstance(node, ast.FunctionDef) and node.name == function)
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and ast.unparse(node.value) == container:
            found |= _strings(node.slice)
        elif isinstance(node, ast.Compare) and any(isinstance(op, ast.In) for op in node.ops) and \
                any(ast.unparse(c) == container for c in node.comparators):
            found |= _strings(node.left)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr == "get" and ast.unparse(node.func.value) == container and node.args:
            found |= _strings(node.args[0])
    return found


def _strings(node: ast.AST) -> set[str]:
    return {node.value} if isinstance(node, ast.Constant) and isinstance(node.value, str) else set()


def _source_of(module_name: str) -> str:
    return inspect.getsource(sys.modules[module_name] if module_name in sys.modules
                             else __import__(module_name, fromlist=["_"]))


def _all_models() -> dict[str, type]:
    from deepspeed.runtime.config_utils import DeepSpeedConfigModel  # noqa: PLC0415

    found: dict[str, list[type]] = {}
    stack = [DeepSpeedConfigModel]
    while stack:
        cls = stack.pop()
        for sub in cls.__subclasses__():
            found.setdefault(sub.__name__, []).append(sub)
            stack.append(sub)
    return {name: classes[0] for name, classes in found.items() if len(set(classes)) == 1}


def model_sections(top_keys: list[str]) -> dict[str, type]:
    """Top-level key -> the pydantic model that rejects a canary key placed in it."""
    from pydantic import ValidationError  # noqa: PLC0415

    from deepspeed.runtime.config import DeepSpeedConfig  # noqa: PLC0415

    models = _all_models()
    sections: dict[str, type] = {}
    for key in top_keys:
        try:
            DeepSpeedConfig({**_BASE, key: {CANARY_KEY: 1}}, mpu=TargetMpu(1))
        except ValidationError as error:
            for item in error.errors():
                if item["type"] == "extra_forbidden" and item["loc"][-1:] == (CANARY_KEY,) \
                        and error.title in models:
                    sections[key] = _walk(models[error.title], item["loc"][:-1])
        except Exception:  # noqa: BLE001 - a key that fails otherwise is not a model section
            pass
    return sections


def _walk(model: type, loc: tuple) -> type:
    for name in loc:
        model = _nested_model(model.model_fields[name].annotation)
    return model


def _nested_model(annotation: Any) -> type | None:
    from deepspeed.runtime.config_utils import DeepSpeedConfigModel  # noqa: PLC0415

    for candidate in (annotation, *typing.get_args(annotation)):
        if inspect.isclass(candidate) and issubclass(candidate, DeepSpeedConfigModel):
            return candidate
    return None


def describe_annotation(annotation: Any) -> dict:
    """A JSON-able type tag for a pydantic annotation: type, nullable, choices."""
    nullable = False
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        nullable = len(args) < len(typing.get_args(annotation))
        if len(args) != 1:
            return {"type": "any", "nullable": nullable}
        annotation = args[0]
    info: dict[str, Any] = {"type": _type_tag(annotation), "nullable": nullable}
    if inspect.isclass(annotation) and issubclass(annotation, enum.Enum):
        values = sorted({member.value for member in annotation}, key=repr)
        info["choices"] = values
        info["type"] = "integer" if all(isinstance(v, int) for v in values) else "string"
    elif typing.get_origin(annotation) is typing.Literal:
        info["choices"] = list(typing.get_args(annotation))
    return info


def _type_tag(annotation: Any) -> str:
    simple = {bool: "boolean", int: "integer", float: "number", str: "string", pathlib.Path: "string"}
    if annotation in simple:
        return simple[annotation]
    origin = typing.get_origin(annotation) or annotation
    if origin in (dict, typing.Dict) or _nested_model(annotation) is not None:
        return "mapping"
    if origin in (list, tuple, typing.List):
        return "list"
    return "any"


def describe_model(model: type, path: str, out: dict) -> None:
    """Add ``path`` (and its nested model sections) to ``out`` from the model's fields."""
    keys: dict[str, dict] = {}
    for name, field in model.model_fields.items():
        info = describe_annotation(field.annotation)
        if field.default == "auto":
            info["default_is_auto"] = True
        for key in {name, field.alias or name}:
            keys[key] = info
            nested = _nested_model(field.annotation)
            if nested is not None:
                describe_model(nested, f"{path}.{key}", out)
    out[path] = {"model": model.__name__, "rejects_unknown": model.model_config.get("extra") == "forbid",
                 "keys": keys}


def _traced_type(tokens: set) -> str:
    kinds = {kind for kind, _ in tokens} - {"NoneType"}
    if kinds == {"bool"}:
        return "boolean"
    if kinds and kinds <= {"int", "float"}:
        return "number" if "float" in kinds else "integer"
    return "mapping" if kinds == {"dict"} else "any"


def open_sections(reads: _Reads) -> dict[str, dict]:
    """optimizer / scheduler / pipeline: sections DeepSpeed reads by name and otherwise ignores."""
    from deepspeed.runtime.config import get_pipeline_config  # noqa: PLC0415

    out = {name: {"model": None, "rejects_unknown": False,
                  "keys": {k: {"type": "any", "nullable": True} for k in reads.defaults.get(name + ".", {})}}
           for name in ("optimizer", "scheduler")}
    defaults = get_pipeline_config({})
    engine_keys = literal_keys(_source_of("deepspeed.runtime.pipe.engine"), "self._config.pipeline")
    pipeline_keys = {}
    for key in sorted(set(defaults) | engine_keys):
        value = defaults.get(key)
        tag = {bool: "boolean", int: "integer"}.get(type(value), "any")
        pipeline_keys[key] = {"type": tag, "nullable": False}
        if value == "auto":
            pipeline_keys[key]["default_is_auto"] = True
    out["pipeline"] = {"model": None, "rejects_unknown": False, "keys": pipeline_keys}
    return out


def optimizer_and_scheduler_names() -> dict[str, list[str]]:
    import torch  # noqa: PLC0415

    import deepspeed.runtime.config as ds_config  # noqa: PLC0415
    from deepspeed.runtime import lr_schedules  # noqa: PLC0415

    torch_optimizers = sorted(name for name, obj in vars(torch.optim).items() if not name.startswith("_")
                              and inspect.isclass(obj) and issubclass(obj, torch.optim.Optimizer))
    torch_schedulers = sorted(name for name, obj in vars(torch.optim.lr_scheduler).items()
                              if not name.startswith("_") and inspect.isclass(obj)
                              and obj.__module__ == torch.optim.lr_scheduler.__name__ and hasattr(obj, "step"))
    return {"deepspeed_optimizers": sorted(ds_config.DEEPSPEED_OPTIMIZERS), "torch_optimizers": torch_optimizers,
            "deepspeed_schedulers": sorted(lr_schedules.VALID_LR_SCHEDULES), "torch_schedulers": torch_schedulers}


def trace_all(removed_top: list[str]) -> _Reads:
    """Look-ups for a config using the common sections (with and without an mpu, as DeepSpeed branches on
    it), then for each top-level key holding an empty mapping, so nested look-ups are seen too."""
    reads = trace_reads([(_RICH, TargetMpu(1)), (_RICH, None)])
    keys = sorted(set(reads.defaults.get("", {})) - set(removed_top))
    return trace_reads([({**_BASE, key: {}}, TargetMpu(1)) for key in keys], reads)


def top_level_keys(reads: _Reads, removed_top: list[str]) -> dict[str, dict]:
    """Every top-level key DeepSpeedConfig or deepspeed.initialize reads, typed by the default offered."""
    top = {key: {"type": _traced_type(tokens), "nullable": True}
           for key, tokens in reads.defaults.get("", {}).items() if key not in removed_top}
    for key in literal_keys(_source_of("deepspeed"), "config", function="initialize"):
        top.setdefault(key, {"type": "any", "nullable": True})
    return top


def auto_defaults(reads: _Reads, sections: dict[str, dict]) -> list[str]:
    """Dotted paths whose DeepSpeed default is the string "auto"."""
    traced = {f"{prefix}{key}" for prefix, keys in reads.defaults.items() for key, tokens in keys.items()
              if ("str", "auto") in tokens}
    modelled = {f"{path}.{key}" for path, spec in sections.items() for key, info in spec["keys"].items()
                if info.get("default_is_auto")}
    return sorted(traced | modelled)


def collect() -> dict:
    """Everything the generated module holds, from the installed deepspeed and torch."""
    import deepspeed  # noqa: PLC0415
    import torch  # noqa: PLC0415

    start_single_process_group()
    removed_top, removed_zero = removed_keys()
    reads = trace_all(removed_top)
    top = top_level_keys(reads, removed_top)
    sections: dict[str, dict] = {}
    for key, model in model_sections(sorted(top)).items():
        describe_model(model, key, sections)
    sections.update(open_sections(reads))
    top.update({key: {"type": "mapping", "nullable": True} for key in sections if "." not in key})
    return {"DEEPSPEED_VERSION": deepspeed.__version__, "TORCH_VERSION": torch.__version__.split("+")[0],
            "TOP_LEVEL": top, "REMOVED_TOP_LEVEL": removed_top,
            "REMOVED_IN_SECTION": {"zero_optimization": removed_zero}, "SECTIONS": sections,
            "AUTO_IS_DEEPSPEED_DEFAULT": auto_defaults(reads, sections),
            **{k.upper(): v for k, v in optimizer_and_scheduler_names().items()}}


def render(data: dict) -> str:
    """The generated module's text: deterministic (sorted), so a diff shows what DeepSpeed changed."""
    lines = [f'"""ds_config keys DeepSpeed {data["DEEPSPEED_VERSION"]} reads, derived from the installed package.',
             "",
             f"GENERATED by `{REGENERATE}` (see deepspeed_keys.py for how each fact",
             "is obtained). Do not edit by hand; tests/integration/test_validate_deepspeed_real.py fails when stale.",
             '"""', "# fmt: off", ""]
    for name in sorted(data):
        text = pprint.pformat(data[name], width=110, sort_dicts=True)
        lines.append(f"{name} = {text}")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.validate.deepspeed_keys",
                                     description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--regenerate", action="store_true", help=f"rewrite {DATA_MODULE.name}")
    group.add_argument("--check", action="store_true", help=f"exit 1 when {DATA_MODULE.name} is stale")
    args = parser.parse_args(argv)
    text = render(collect())
    if args.regenerate:
        DATA_MODULE.write_text(text)
        print(f"wrote {DATA_MODULE}", file=sys.stderr)
        return 0
    if DATA_MODULE.exists() and DATA_MODULE.read_text() == text:
        print(f"{DATA_MODULE.name} is up to date", file=sys.stderr)
        return 0
    print(f"{DATA_MODULE.name} is stale for the installed DeepSpeed; run: {REGENERATE}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
