"""Tell the format of an engine config from its text: a JSON object (DeepSpeed), sectioned TOML
(torchtitan), an argument list (torchtitan ``--section.key`` overrides or Megatron-LM
``--kebab-case`` arguments, possibly inside a ``torchrun`` command) or YAML (nanotron)."""

from __future__ import annotations

import json
import re
import tomllib
from typing import Any

import yaml

from meshplan.bounded_parse import load_json, load_toml, load_yaml
from meshplan.errors import InputError
from meshplan.interop.meshplan_json import is_meshplan_json

FORMATS = ("torchtitan", "torchtitan-toml", "megatron", "deepspeed", "nanotron", "meshplan")
TORCHTITAN_SECTIONS = ("parallelism", "training", "activation_checkpoint", "job", "model", "float8", "compile")
MEGATRON_HINTS = ("--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--micro-batch-size",
                  "--global-batch-size", "--num-layers", "--hidden-size", "--seq-length",
                  "--context-parallel-size", "--use-distributed-optimizer")
DEEPSPEED_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                  "zero_optimization", "bf16", "fp16")
EXPECTED = ("a DeepSpeed JSON, a torchtitan TOML or --section.key list, Megatron-LM arguments, a nanotron YAML "
            "or meshplan's estimate --json")


def detect(text: str, where: str = "plan") -> str:
    """The format name (one of :data:`FORMATS`), or an InputError naming what was expected."""
    body = text.strip()
    if not body:
        raise InputError(where, "the file is empty")
    if body.startswith("{"):
        try:
            data: Any = load_json(body, where)
        except json.JSONDecodeError as exc:
            raise InputError(where, f"looks like JSON but does not parse (line {exc.lineno})") from None
        if isinstance(data, dict) and any(k in data for k in DEEPSPEED_KEYS):
            return "deepspeed"
        if is_meshplan_json(data):
            return "meshplan"
        if isinstance(data, dict) and "model_type" in data:
            raise InputError(where, "this is a Hugging Face model config: give it to --model")
        raise InputError(where, f"a JSON object without DeepSpeed keys; expected {EXPECTED}")
    words = re.findall(r"(?:^|\s)(--[A-Za-z][\w.-]*)", body)
    if any("." in w for w in words) and any(w[2:].split(".")[0].replace("-", "_") in TORCHTITAN_SECTIONS for w in words):
        return "torchtitan"
    if any(w.split("=")[0] in MEGATRON_HINTS for w in words):
        return "megatron"
    try:
        toml = load_toml(body, where)
    except tomllib.TOMLDecodeError:
        toml = None
    if isinstance(toml, dict) and any(isinstance(toml.get(s), dict) for s in ("parallelism", "training", "activation_checkpoint")):
        return "torchtitan-toml"
    try:
        data = load_yaml(body, where)
    except yaml.YAMLError:
        data = None
    if isinstance(data, dict) and isinstance(data.get("parallelism"), dict) and any(k in data["parallelism"] for k in ("dp", "tp", "pp")):
        return "nanotron"
    raise InputError(where, f"cannot tell the format; expected {EXPECTED}")
