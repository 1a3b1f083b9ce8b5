"""HF-format checkpoints: ``config.json`` + safetensors in, the same out. Never unpickles.

Generic over models: a model family supplies its module (whose parameter names are HF's) and the
names that are aliases of another tensor (a tied LM head); this module reads the config, finds the
safetensors files (single or sharded), checks every tensor name, shape and dtype against the module
*from the file headers*, and reports every missing, unexpected, mis-shaped and mis-typed (integer or
boolean for a float weight) tensor in one :class:`~tokenstate.contracts.ConfigError` before copying
anything. A tensor in two files, or a shard index that names tensors no shard holds, is refused.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from tokenstate.contracts import ConfigError

# One reader of config.json for the registry and every model (clear errors for a bad directory).
from tokenstate.runtime.registry import read_hf_config as read_config

__all__ = [
    "PICKLE_SUFFIXES",
    "load_state",
    "read_config",
    "safetensors_files",
    "save_checkpoint",
    "seeded_init",
    "tensor_names",
]

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
_INDEX = "model.safetensors.index.json"


_SINGLE_FILE = "model.safetensors"


def safetensors_files(path: str | Path) -> list[Path]:
    """The safetensors files of a directory: the shard index's when there is one, else
    ``model.safetensors`` when it exists (what HF loads), else every ``*.safetensors``.

    A directory with only pickle checkpoints is refused: unpickling can run arbitrary code.
    """
    directory = Path(path)
    index = directory / _INDEX
    if index.is_file():
        weight_map = _weight_map(index)
        files = [directory / name for name in sorted(set(weight_map.values()))]
        absent = [f.name for f in files if not f.is_file()]
        if absent:
            raise ConfigError(f"{index} names shards that do not exist: {absent}.")
        return files
    single = directory / _SINGLE_FILE
    if single.is_file():  # as HF loads it: other *.safetensors beside it (an adapter...) are not the model
        return [single]
    files = sorted(directory.glob("*.safetensors"))
    if files:
        return files
    pickles = sorted(p.name for p in directory.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise ConfigError(
            f"{directory}: only pickle checkpoints found ({', '.join(pickles)}); tokenstate never "
            "unpickles weights (it can run arbitrary code). Convert them to safetensors, e.g. "
            "load with transformers and call save_pretrained(dir, safe_serialization=True)."
        )
    raise ConfigError(f"{directory}: no *.safetensors weights found next to config.json.")


def _weight_map(index: Path) -> dict[str, str]:
    """The shard index's ``{tensor name: shard file name}``, or a ConfigError saying what is wrong."""
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as exc:
        raise ConfigError(f"{index}: not a valid shard index ({exc!r}).") from exc
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and v for k, v in weight_map.items()
    ):
        raise ConfigError(f"{index}: weight_map must map tensor names to shard file names, got {weight_map!r:.200}.")
    return weight_map


# safetensors dtype names of floating tensors (the only ones a float model's weights may come from)
_FLOAT_DTYPES = frozenset({"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"})


def _tensors_in(files: list[Path]) -> dict[str, tuple[tuple[int, ...], str, Path]]:
    """``{name: (shape, safetensors dtype, file)}`` from the files' headers; a name in two files is refused."""
    found: dict[str, tuple[tuple[int, ...], str, Path]] = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as handle:
                for name in handle.keys():
                    if name in found:
                        raise ConfigError(
                            f"{file.parent}: tensor {name} is in both {found[name][2].name} and {file.name}; "
                            "a checkpoint holds each tensor once (remove the stray file)."
                        )
                    info = handle.get_slice(name)
                    found[name] = (tuple(info.get_shape()), str(info.get_dtype()), file)
        except ConfigError:
            raise
        except Exception as exc:  # safetensors raises its own error types for corrupt headers
            raise ConfigError(f"{file}: not a readable safetensors file ({exc}).") from exc
    return found


def tensor_names(path: str | Path) -> frozenset[str]:
    """The tensor names an HF-format directory's safetensors files hold."""
    return frozenset(_tensors_in(safetensors_files(path)))


_STALE_BUFFER = "rotary_emb.inv_freq"


def load_state(
    module: nn.Module,
    path: str | Path,
    *,
    aliases: Mapping[str, str] | None = None,
    model: str = "model",
    ignored: tuple[str, ...] = (),
) -> None:
    """Copy an HF-format directory's tensors into ``module``'s parameters, by name.

    Args:
        module: the model, already built (its parameter names are the checkpoint's).
        path: directory holding safetensors files.
        aliases: ``{alias: source}`` parameter names that share storage with another (a tied LM
            head: ``{"lm_head.weight": "model.embed_tokens.weight"}``). An alias may be absent
            from the checkpoint; if present it must equal its source.
        model: name used in messages.
        ignored: prefixes of checkpoint tensors the model does not use and HF skips on load too
            (NemotronH's ``mtp.``); the caller says so.
    """
    aliases = dict(aliases or {})
    state = module.state_dict()
    expected = {name: tuple(t.shape) for name, t in state.items()}
    files = safetensors_files(path)
    found = _tensors_in(files)
    index = Path(path) / _INDEX
    if index.is_file():
        ghosts = sorted(set(_weight_map(index)) - set(found))
        if ghosts:
            raise ConfigError(f"{index} names tensors its shards do not hold: {', '.join(ghosts[:8])}.")
    # Old conversions kept rotary inverse frequencies, a buffer computed from the config: HF skips it.
    found = {n: v for n, v in found.items() if not (n.endswith(_STALE_BUFFER) and n not in expected)}
    found = {n: v for n, v in found.items() if not (ignored and n.startswith(ignored) and n not in expected)}
    missing = sorted(n for n in expected if n not in found and n not in aliases)
    unexpected = sorted(n for n in found if n not in expected)
    misshaped = sorted(
        f"{n} (checkpoint {list(found[n][0])}, model {list(expected[n])})"
        for n in expected
        if n in found and found[n][0] != expected[n]
    )
    # A float weight read from integers or booleans would be cast silently: refused instead.
    mistyped = sorted(
        f"{n} (checkpoint {found[n][1]}, model {str(state[n].dtype).removeprefix('torch.')})"
        for n in expected
        if n in found and state[n].is_floating_point() and found[n][1] not in _FLOAT_DTYPES
    )
    if missing or unexpected or misshaped or mistyped:
        parts = [
            f"{label} ({len(names)}): {', '.join(names)}"
            for label, names in (
                ("missing", missing), ("unexpected", unexpected), ("mis-shaped", misshaped), ("mis-typed", mistyped)
            )
            if names
        ]
        raise ConfigError(
            f"{path}: checkpoint does not match {model}: " + "; ".join(parts)
            + ". Check that config.json describes these weights (sizes, layer count, tie_word_embeddings)."
        )
    params = state
    by_file: dict[Path, list[str]] = {}
    for name, (_, _, file) in found.items():
        by_file.setdefault(file, []).append(name)
    tied_copies: dict[str, torch.Tensor] = {}
    damaged: list[str] = []
    with torch.no_grad():
        for file, names in by_file.items():
            with safe_open(str(file), framework="pt") as handle:
                for name in names:
                    if name in aliases:
                        tied_copies[name] = handle.get_tensor(name)
                    else:
                        params[name].copy_(handle.get_tensor(name))
                        bad = _non_finite(params[name])
                        if bad:
                            damaged.append(f"{name} ({bad} of {params[name].numel()})")
    if damaged:  # NaN logits would be argmax'd to token 0: fluent garbage, no error
        raise ConfigError(
            f"{path}: the checkpoint's tensors hold NaN or infinite values: {', '.join(sorted(damaged))}; "
            "the checkpoint is damaged: export or download it again."
        )
    # Compared only once every source is in place: shard order is arbitrary.
    for name, tensor in tied_copies.items():
        source = params[aliases[name]]
        if not torch.equal(tensor.to(source.device, source.dtype), source):
            raise ConfigError(
                f"{path}: {name} is tied to {aliases[name]} by the config but the checkpoint holds "
                "a different tensor; set tie_word_embeddings=false in config.json."
            )


def save_checkpoint(
    module: nn.Module, path: str | Path, config: Mapping[str, Any], *, aliases: Mapping[str, str] | None = None
) -> None:
    """Write ``config.json`` and ``model.safetensors`` (aliases omitted, as HF does for tied heads)."""
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    skip = set(aliases or {})
    tensors = {
        name: t.detach().to("cpu").contiguous()
        for name, t in module.state_dict().items()
        if name not in skip
    }
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(dict(config), indent=2, sort_keys=True) + "\n")


def seeded_init(module: nn.Module, seed: int, std: float) -> None:
    """Deterministic random weights, independent of the device: N(0, std) matrices, unit norms.

    Parameters are visited in name order and drawn from one CPU generator, so the same seed gives
    the same model on every device. 1-D parameters are norm weights (ones) unless named ``bias``
    (zeros); a model family re-initialises anything special (e.g. SSM decay) afterwards.
    """
    generator = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(module.named_parameters(), key=lambda item: item[0]):
            if param.dim() >= 2:
                values = torch.randn(param.shape, generator=generator, dtype=torch.float32) * std
                param.copy_(values)
            elif name.endswith("bias"):
                param.zero_()
            else:
                param.fill_(1.0)


def _non_finite(tensor: torch.Tensor) -> int:
    """How many of a floating tensor's values are NaN or infinite (0 for any other dtype)."""
    if not tensor.is_floating_point():
        return 0
    finite = torch.isfinite(tensor)
    return 0 if bool(finite.all()) else int((~finite).sum())
