"""The public engine: ``LLM(model, ...).generate(prompts, SamplingParams(...))``.

Everything a caller can get wrong (an unknown model, a bad setting, an empty or out-of-vocabulary
prompt, a prompt that does not fit the context, bad sampling parameters) is refused with a clear
:class:`~tokenstate.contracts.ConfigError` before any step runs. Every request is returned, in
prompt order; none is dropped or silently truncated.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from numbers import Integral
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from tokenstate.contracts import ConfigError
from tokenstate.runtime import registry
from tokenstate.runtime.engine import Engine, EngineConfig
from tokenstate.runtime.engine_config import ON_UNHONORED, OnUnhonored
from tokenstate.runtime.generation_settings import warn_on_generation_settings
from tokenstate.runtime.outputs import EngineStats, RequestOutput
from tokenstate.runtime.params import SamplingParams
from tokenstate.runtime.progress import notify_step
from tokenstate.runtime.registry import ModelFactory, ServableModel
from tokenstate.runtime.scheduler import SCHEDULING_ORDERS, Request, SchedulingOrder
from tokenstate.runtime.slot_memory import model_allocation
from tokenstate.runtime.spec_decode import SpeculativeConfig
from tokenstate.runtime.stream import Chaos, chaos_from_env, choose_cpu_stream

__all__ = ["LLM", "execution_device"]

# vLLM engine options tokenstate does not take, with what to do instead (anything else unknown is
# refused too, naming the supported options).
_VLLM_ENGINE_OPTIONS: dict[str, str] = {
    "tokenizer": "tokenstate works on token ids; tokenize prompts yourself",
    "tensor_parallel_size": "tokenstate runs one device; use device='cpu' or device='cuda'",
    "pipeline_parallel_size": "tokenstate runs one device; use device='cpu' or device='cuda'",
    "gpu_memory_utilization": "size the KV budget with kv_cache_tokens=...",
    "max_model_len": "the context length comes from the model config (max_position_embeddings)",
    "enforce_eager": "tokenstate runs eagerly unless compile=True",
    "trust_remote_code": "models are registered ModelFactory objects, never remote code",
    "quantization": "the reference models run unquantized",
    "max_num_batched_tokens_per_seq": "use max_num_batched_tokens",
}
# vLLM generate() options whose values change nothing here: accepted, and ignored.
_NEUTRAL_GENERATE_OPTIONS: dict[str, tuple[object, ...]] = {
    "use_tqdm": (True, False),  # a progress bar: tokenstate draws none
    "lora_request": (None,),
}
# The dtypes the reference models compute in; "auto" is vLLM's "whatever the model uses".
_DTYPES = {"auto": torch.float32, "float32": torch.float32, "float": torch.float32}

_F = TypeVar("_F", bound=Callable[..., Any])


def _serialized(method: _F) -> _F:
    """Run ``method`` under the engine's lock: concurrent callers take turns, never interleave."""

    def locked(self: LLM, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    # Not functools.wraps: with the method's annotations copied, a type checker (beartype under
    # --tokenstate-checks) would refuse a bad argument before the method's own typed error.
    locked.__name__, locked.__qualname__, locked.__doc__ = method.__name__, method.__qualname__, method.__doc__
    locked.__wrapped__ = method  # type: ignore[attr-defined]
    locked.__signature__ = inspect.signature(method)  # type: ignore[attr-defined]
    return locked  # type: ignore[return-value]


def _dtype(dtype: object) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype == torch.float32:
            return dtype
    elif isinstance(dtype, str) and dtype in _DTYPES:
        return _DTYPES[dtype]
    raise ConfigError(
        f"LLM: dtype={dtype!r} is not supported; the reference models compute in float32 — use "
        "dtype='auto' or dtype='float32'."
    )


def _refuse_engine_options(options: Mapping[str, object]) -> None:
    for name in options:
        accepted = [
            p.name for p in inspect.signature(LLM.__init__).parameters.values()
            if p.name != "self" and p.kind is not inspect.Parameter.VAR_KEYWORD
        ]
        instead = _VLLM_ENGINE_OPTIONS.get(name, f"supported options: {', '.join(accepted)}")
        raise ConfigError(f"LLM({name}=...) is not supported: {instead}.")


def _compile_layers(name: str, model: object, config: EngineConfig) -> None:
    """``LLM(compile=True)``: the model's decoder layers as one compiled graph, where that runs.

    Called before the engine starts its stream, so a device process forked there inherits the
    compiled wrapper and compiles in its first step of two or more tokens, in the process that
    runs the model.
    """
    if config.device.type != "cpu":
        raise ConfigError(f"LLM(compile=True) runs on the CPU only; on {config.device.type} use compile=False.")
    hook = getattr(model, "compile_layers", None)
    if hook is None:
        raise ConfigError(
            f"LLM(compile=True): model {name!r} has no compiled path (only dense Llama-style models "
            "have one); use compile=False."
        )
    hook()


Prompt = Sequence[int] | np.ndarray | torch.Tensor | Mapping[str, Sequence[int]]
"""One prompt's token ids: a list (or tuple), a 1-D integer array or tensor, or vLLM's TokensPrompt
dict ``{"prompt_token_ids": [...]}``."""


def _ids_of_array(index: int, ids: np.ndarray | torch.Tensor) -> list[int]:
    """One prompt given as a 1-D integer numpy array or tensor (as tokenizers return ids), as a list."""
    kind = type(ids).__name__
    if ids.ndim != 1:
        raise ConfigError(
            f"prompt {index}: a {kind} prompt must be 1-D (one prompt's ids), got shape "
            f"{tuple(ids.shape)}; pass each row as a prompt of its own, without its padding."
        )
    integral = ids.dtype.kind in "iu" if isinstance(ids, np.ndarray) else not (
        ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool
    )
    if not integral:
        raise ConfigError(
            f"prompt {index}: token ids must be integers, got {kind} dtype {ids.dtype}; convert "
            "them, e.g. ids.astype(np.int64) or ids.long()."
        )
    if isinstance(ids, torch.Tensor) and ids.layout != torch.strided:
        raise ConfigError(
            f"prompt {index}: a sparse tensor ({ids.layout}); pass ids.to_dense(), or a list of the ids."
        )
    if isinstance(ids, torch.Tensor) and ids.is_meta:
        raise ConfigError(
            f"prompt {index}: a meta-device tensor holds no ids (its data was never allocated); "
            "pass the prompt's ids themselves, e.g. a CPU tensor or a list."
        )
    return ids.tolist()


def _positive_int(name: str, value: object, *, int32: bool = False) -> int:
    """``value`` as an int >= 1 (numpy integers included); ``int32``: below 2**31 as well, for the
    counts the device holds as int32 (slots, a step's tokens)."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer) or value < 1:
        raise ConfigError(f"LLM: {name} must be a positive int, got {value!r}.")
    if int32 and value >= 2**31:
        raise ConfigError(f"LLM: {name} must be a positive int below 2**31, got {value!r}.")
    return int(value)


def execution_device(device: torch.device | str) -> torch.device:
    """``device`` as a torch device an engine can run on (``cpu``, or ``cuda`` where available);
    :class:`ConfigError` saying what to use otherwise."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(
            f"LLM: device={device!r} is not a torch device (use 'cpu' or 'cuda')."
        ) from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"LLM: device={device!r} but CUDA is not available here; use device='cpu'."
        )
    if dev.type not in ("cpu", "cuda"):
        raise ConfigError(f"LLM: device={device!r} is not supported; use 'cpu' or 'cuda'.")
    if dev.type == "cpu" and dev.index not in (None, 0):  # torch would run it on the one CPU device
        raise ConfigError(f"LLM: device={device!r}: a CPU has no device index; use device='cpu'.")
    return dev


def _first_preset(factory: ModelFactory) -> str:
    if not factory.presets:
        raise ConfigError(
            f"model {factory.name!r} has no embedded default config; pass a preset name or a path to "
            "an HF-format directory instead."
        )
    return next(iter(factory.presets))


def _load_model(
    model: ModelFactory | str | os.PathLike[str], device: torch.device
) -> tuple[ModelFactory, Any]:
    with model_allocation(repr(os.fspath(model)) if isinstance(model, str | os.PathLike) else f"model {model!r:.80}"):
        return _build_or_load(model, device)


def _build_or_load(
    model: ModelFactory | str | os.PathLike[str], device: torch.device
) -> tuple[ModelFactory, Any]:
    if isinstance(model, ModelFactory):
        return model, model.build_preset(_first_preset(model), device=device)
    if not isinstance(model, str | os.PathLike):
        raise ConfigError(
            f"LLM: model must be a registered name, a ModelFactory or a path, got {type(model).__name__}."
        )
    if not os.fspath(model).strip():  # Path("") is the current directory: never load that by accident
        raise ConfigError(
            "LLM: the model name is empty; pass a registered name (e.g. 'tiny-llama'), a ModelFactory, "
            "or the path of an HF-format directory ('.' for the current one)."
        )
    path = Path(model)
    if path.is_dir():
        factory = registry.resolve_directory(path)
        if factory.load is None:
            raise ConfigError(
                f"model {factory.name!r} cannot load weights from a directory ({path})."
            )
        return factory, factory.load(path, device=device)
    name = os.fspath(model)
    if not isinstance(model, str) or _looks_like_path(name):
        if path.exists():
            raise ConfigError(
                f"LLM: model path {name!r} is not a directory; pass an HF-format directory "
                "(config.json + safetensors) or a registered name."
            )
        raise ConfigError(
            f"LLM: model path {name!r} does not exist (tokenstate never downloads from the Hub); "
            "pass an existing HF-format directory (config.json + safetensors) or a registered name."
        )
    factory = registry.resolve(name)
    preset = name if name in factory.presets else _first_preset(factory)
    return factory, factory.build_preset(preset, device=device)


def _eos_token_ids(built: Any, source: object) -> tuple[int, ...]:
    """The ids that end a request (unless ``ignore_eos``): the model's ``eos_token_ids`` (an HF
    ``eos_token_id`` list), else its ``eos_token_id``; for a checkpoint directory whose
    ``generation_config.json`` names ``eos_token_id``, those — what HF ``generate`` stops on."""
    ids = getattr(built, "eos_token_ids", None)
    if ids is None:
        ids = () if built.eos_token_id is None else (built.eos_token_id,)
    where = "the model's eos_token_ids"
    if isinstance(source, str | os.PathLike) and Path(source).is_dir():
        generation = Path(source) / "generation_config.json"
        if generation.is_file():
            eos = registry.read_json_object(generation).get("eos_token_id")
            if eos is not None:
                ids, where = (tuple(eos) if isinstance(eos, list) else (eos,)), f"{generation}: eos_token_id"
    vocab = built.vocab_size
    if not all(isinstance(t, Integral) and not isinstance(t, bool) and 0 <= t < vocab for t in ids):
        raise ConfigError(f"{where} {list(ids)!r}: every stop id must be an int in [0, vocab_size={vocab}).")
    return tuple(int(t) for t in ids)


def _looks_like_path(name: str) -> bool:
    return os.sep in name or "/" in name or name.startswith((".", "~"))


class LLM:
    """An engine over one model, with synchronous or asynchronous scheduling.

    Args:
        model: a registered architecture or preset name (``"tiny-llama"``), a
            :class:`~tokenstate.runtime.ModelFactory` (built from its first preset), or a path to
            an HF-format directory (``config.json`` + safetensors).
        async_scheduling: prepare step N+1 before step N's tokens reach the host (the device
            splices them in). ``False`` runs every step on fresh host ids.
        device: execution device, ``"cpu"`` or ``"cuda"``.
        dtype: compute dtype, as vLLM's ``dtype=``: ``"auto"`` (the model's) or ``"float32"``
            (the reference models compute in float32; anything else is refused). A checkpoint
            stored in bfloat16 or float16 (its config's ``torch_dtype``) is upcast exactly at load
            and computed in float32, so its tokens can differ from a run in the stored dtype (HF's
            ``from_pretrained`` default); the token gate compares against HF in float32.
        max_num_seqs: requests running at once (also the number of slots). Every slot holds
            state for ``max_model_len`` tokens, allocated at start; more than the machine's
            available memory is refused (:mod:`tokenstate.runtime.slot_memory`).
        max_num_batched_tokens: token budget per step; longer prompts are prefilled in chunks.
        seed: engine seed, from which requests without their own seed derive one.
        on_unhonored: for a forward that did not declare ``honors_device_token_ids=True``, on an
            async step with spliced rows: ``"fallback"`` runs that step on the synchronous host
            path; ``"refuse"`` raises, naming the model.
        scheduling_order: ``"decode_first"`` (decode rows, then prefill chunks, then new requests)
            or ``"random"``: the same selection, rows permuted every step (seeded by ``seed``).
        kv_cache_tokens: total tokens of KV/state the running requests may hold; when a step would
            exceed it, the latest-arrived requests are preempted and later re-prefill everything
            the host knows (recompute). ``None``: no limit beyond the slots.
        speculative: ``{"method": "ngram", "num_tokens": k}`` (optional ``"ngram_size"``, default
            2): prompt-lookup drafts proposed on the device, verified greedily. Only for models
            whose factory declares ``supports_speculative=True``.
        chaos: a seed: seeded random pauses in the stream and the host, so a missing fence shows as
            a wrong token (default: ``$TOKENSTATE_CHAOS``, else none). Runs on the threaded stream
            unless ``cpu_stream="process"``.
        cpu_stream: on a CPU device, where a step's device work runs: ``"inline"`` (in the host
            thread, as it is submitted: no overlap and no hand-offs), ``"thread"`` (a worker
            thread: step N computes while the host prepares step N+1, but both threads' Python
            shares one GIL, so the overlap costs more than it hides) or ``"process"`` (a forked
            device process, Linux: the host's Python really runs beside the forward, on a second
            core, as beside a GPU) or ``"deferred"`` (for testing: in the host thread, but only when
            the host waits past it — the device always as far behind as the fences allow).
            Default: ``$TOKENSTATE_CPU_STREAM``, else ``"thread"`` under chaos and ``"inline"``
            otherwise (``docs/concepts/runner-paths.md``). Tokens are the same.
        compile: run the model's decoder layers as one ``torch.compile`` graph (CPU, dense
            Llama-style models; projections re-check their weights before every compiled call and
            attention stays our own op, so weight updates and each step's slots need no
            recompilation). The first step of two or more tokens compiles (seconds; it needs a C++
            compiler); the tiny peer model measured 1.04–1.12x the eager tokens/s, the big one
            about even. With ``cpu_stream="process"`` the device process compiles. Tokens are the
            same as eager's wherever the logits are not within float rounding of a tie.

    Besides `generate`, the engine can be driven request by request, as a server does:
    `add_request` queues a request at any time, `step` runs one engine step and returns the
    requests that finished in it, `has_unfinished_requests` says when to stop.

    One engine may be shared by several threads: `generate`, `add_request` and `step` take the
    engine's lock, so concurrent calls run one after another, never interleaved. vLLM engine
    options tokenstate does not take (``tensor_parallel_size``, ``tokenizer``, ...) are refused with
    a `ConfigError` that names the alternative.
    """

    def __init__(
        self,
        model: ModelFactory | str | os.PathLike[str],
        *,
        async_scheduling: bool = True,
        device: torch.device | str = "cpu",
        max_num_seqs: int = 8,
        max_num_batched_tokens: int = 256,
        seed: int = 0,
        on_unhonored: OnUnhonored = "fallback",
        scheduling_order: SchedulingOrder = "decode_first",
        kv_cache_tokens: int | None = None,
        speculative: dict[str, Any] | None = None,
        chaos: int | None = None,
        cpu_stream: str | None = None,
        dtype: str | torch.dtype = "auto",
        compile: bool = False,  # shadows the builtin inside __init__ only, where it is not used
        **unsupported: object,
    ) -> None:
        _refuse_engine_options(unsupported)
        self.dtype: torch.dtype = _dtype(dtype)
        """The compute dtype (``torch.float32``)."""
        if not isinstance(async_scheduling, bool):
            raise ConfigError(f"LLM: async_scheduling must be a bool, got {async_scheduling!r}.")
        if not isinstance(compile, bool):
            raise ConfigError(f"LLM: compile must be a bool, got {compile!r}.")
        if on_unhonored not in ON_UNHONORED:
            raise ConfigError(
                f"LLM: on_unhonored={on_unhonored!r} is not a policy; valid: {', '.join(ON_UNHONORED)}."
            )
        if isinstance(seed, bool | np.bool_) or not isinstance(seed, int | np.integer) or seed < 0:
            raise ConfigError(f"LLM: seed must be an int >= 0, got {seed!r}.")
        seed = int(seed)
        if scheduling_order not in SCHEDULING_ORDERS:
            raise ConfigError(
                f"LLM: scheduling_order={scheduling_order!r} is not an order; valid: "
                f"{', '.join(SCHEDULING_ORDERS)}."
            )
        if kv_cache_tokens is not None:
            _positive_int("kv_cache_tokens", kv_cache_tokens)
        dev = execution_device(device)
        factory, built = _load_model(model, dev)
        self.factory: ModelFactory = factory
        """The registered factory serving the model (its forward, opt-in and presets)."""
        self.model: Any = built
        """The built model (a `ServableModel`): ``vocab_size``, ``max_model_len``, weights."""
        lacking = [
            name for name in ("vocab_size", "max_model_len", "eos_token_id", "allocate_slots", "reset_slot")
            if not hasattr(self.model, name) or (name in ("allocate_slots", "reset_slot") and not callable(getattr(self.model, name)))
        ]  # fmt: skip
        if lacking or not isinstance(self.model, ServableModel):
            raise ConfigError(
                f"model {self.factory.name!r}: the built {type(self.model).__name__} lacks "
                f"{' / '.join(lacking or ['what ServableModel asks for'])} (a ServableModel has vocab_size, "
                "max_model_len and eos_token_id attributes and allocate_slots(n) / reset_slot(slot) methods)."
            )
        if self.model.max_model_len < 2:  # a prompt token, and the one token every request generates
            raise ConfigError(
                f"model {self.factory.name!r} has a context of {self.model.max_model_len} token(s) "
                "(max_model_len); serving needs at least 2: check max_position_embeddings in its config."
            )
        self._eos_token_ids = _eos_token_ids(self.model, model)
        if isinstance(model, str | os.PathLike) and Path(model).is_dir():
            warn_on_generation_settings(Path(model), self._eos_token_ids)
        spec = SpeculativeConfig.parse(
            speculative, model=self.factory.name, supported=self.factory.supports_speculative
        )
        self.seed: int = seed
        """The engine seed (requests without their own seed derive one from it)."""
        self.kv_cache_tokens: int | None = kv_cache_tokens
        """The KV/state token budget of the running requests (``None``: only the slots limit)."""
        self.stats: EngineStats = EngineStats()
        """Step counters over the engine's lifetime (see `EngineStats`)."""
        self._lock = threading.Lock()
        self._closed = False
        # Outputs of a step whose observer raised (Ctrl-C in the progress bar): the next step() returns them.
        self._undelivered: list[RequestOutput] = []
        self._owner_pid = os.getpid()  # a process forked from this one must create its own LLM
        self._num_requests = 0
        self._next_request_id = 0
        engine_chaos = chaos_from_env() if chaos is None else Chaos(chaos)
        config = EngineConfig(
            async_scheduling=async_scheduling,
            device=dev,
            max_num_seqs=_positive_int("max_num_seqs", max_num_seqs, int32=True),
            max_num_batched_tokens=_positive_int("max_num_batched_tokens", max_num_batched_tokens, int32=True),
            seed=seed,
            on_unhonored=on_unhonored,
            scheduling_order=scheduling_order,
            kv_cache_tokens=kv_cache_tokens,
            speculative=spec,
            chaos=engine_chaos,
            cpu_stream=choose_cpu_stream(cpu_stream, engine_chaos),
        )
        if compile:  # before the engine: a device process forked by its stream inherits the wrapper
            _compile_layers(self.factory.name, self.model, config)
        self._engine = Engine(self.factory, self.model, config, self.stats)

    def close(self) -> None:
        """Stop the engine now: drop unfinished requests, stop the stream's worker thread or
        device process (``cpu_stream="thread"`` / ``"process"``) and free what they hold.

        Idempotent; afterwards ``generate``, ``add_request`` and ``step`` raise ``ConfigError``.
        Without it the stream stops when the ``LLM`` is garbage-collected. ``with LLM(...) as llm:``
        closes on leaving the block.
        """
        with self._lock:
            if not self._closed:
                self._closed = True
                self._engine.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def async_scheduling(self) -> bool:
        """Whether the engine schedules asynchronously (as passed to the constructor)."""
        return self._engine.config.async_scheduling

    def _derived_seed(self) -> int:
        digest = hashlib.blake2b(
            f"{self.seed}:{self._num_requests}".encode(), digest_size=8
        ).digest()
        return int.from_bytes(digest, "little") >> 2

    def _validate_prompt(self, index: int, prompt: object) -> tuple[int, ...]:
        vocab, max_len = self.model.vocab_size, self.model.max_model_len
        if isinstance(prompt, Mapping):  # vLLM's TokensPrompt: {"prompt_token_ids": [...]}
            if set(prompt) != {"prompt_token_ids"}:
                raise ConfigError(
                    f"prompt {index}: a dict prompt must hold only 'prompt_token_ids' (vLLM's "
                    f"TokensPrompt), got keys {sorted(prompt)}."
                )
            prompt = prompt["prompt_token_ids"]
        if isinstance(prompt, np.ndarray | torch.Tensor):
            prompt = _ids_of_array(index, prompt)
        if isinstance(prompt, str | bytes) or not isinstance(prompt, Sequence):
            raise ConfigError(
                f"prompt {index}: expected a list of token ids, got {type(prompt).__name__} (tokenize "
                "text before calling generate)."
            )
        if len(prompt) == 0:
            raise ConfigError(f"prompt {index} is empty; every prompt needs at least one token.")
        if len(prompt) >= max_len:
            raise ConfigError(
                f"prompt {index} has {len(prompt)} tokens but model {self.factory.name!r} has a context "
                f"of max_model_len={max_len}, which must also hold at least one generated token; "
                f"shorten the prompt to at most {max_len - 1} tokens."
            )
        not_ids = [t for t in prompt if isinstance(t, bool) or not isinstance(t, Integral)]
        if not_ids:
            raise ConfigError(
                f"prompt {index}: token ids must be ints, got {not_ids[:8]} "
                f"({type(not_ids[0]).__name__}); convert them, e.g. [int(t) for t in ids]."
            )
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise ConfigError(
                f"prompt {index}: token ids {bad[:8]} are outside the vocabulary [0, {vocab}) of model "
                f"{self.factory.name!r}."
            )
        return tuple(int(t) for t in prompt)

    def _validate_params(self, index: int, params: object, prompt: tuple[int, ...]) -> SamplingParams:
        if not isinstance(params, SamplingParams):
            raise ConfigError(
                f"sampling {index}: expected SamplingParams, got {type(params).__name__}."
            )
        vocab = self.model.vocab_size
        bad = [t for t in params.stop_token_ids if t >= vocab]
        if bad:
            raise ConfigError(
                f"sampling {index}: stop_token_ids {bad} are outside the vocabulary [0, {vocab}) and "
                "could never be generated."
            )
        bad_words = [w for w in params.bad_words if max(w) >= vocab]
        if bad_words:
            raise ConfigError(
                f"sampling {index}: bad_words {bad_words[:4]} hold ids outside the vocabulary "
                f"[0, {vocab})."
            )
        if len({w[-1] for w in params.bad_words}) == vocab:
            # A longer word bans its last token whenever its prefix was just generated: together
            # they could leave a step nothing to sample, and a banned token would come out.
            raise ConfigError(
                f"sampling {index}: bad_words ban every one of the model's {vocab} tokens (a one-token "
                "word always, a longer word's last token after its prefix), so a step could be left "
                "with no token to sample; leave at least one token that no word ends with."
            )
        longest = min(len(prompt) + params.max_tokens, self.model.max_model_len)
        if self.kv_cache_tokens is not None and longest > self.kv_cache_tokens:
            raise ConfigError(
                f"request {index} may reach {longest} tokens (prompt {len(prompt)} + max_tokens "
                f"{params.max_tokens}, capped by the context) but kv_cache_tokens="
                f"{self.kv_cache_tokens} could never hold it even alone; raise kv_cache_tokens or "
                "lower max_tokens."
            )
        return params

    def _request(self, request_id: int, prompt: tuple[int, ...], params: SamplingParams) -> Request:
        seed = params.seed if params.seed is not None else self._derived_seed()
        self._num_requests += 1
        return Request(request_id, prompt, params, seed, self._eos_token_ids)

    @_serialized
    def has_unfinished_requests(self) -> bool:
        """Whether a request is waiting, running, or has a step in flight (never, once closed)."""
        return not self._closed and self._has_unfinished()

    def _require_open(self, method: str) -> None:
        if self._owner_pid != os.getpid():
            raise ConfigError(
                f"LLM.{method}: this LLM was created in process {self._owner_pid}, and this process was "
                "forked from it: its device state (the stream's worker or device process, torch's "
                "intra-op thread pool, on which a first forward can hang) stays with the parent. "
                "Create the LLM in the process that uses it."
            )
        if self._closed:
            raise ConfigError(
                f"LLM.{method}: this LLM was closed (its stream and device process are stopped); "
                "create a new LLM."
            )

    def _has_unfinished(self) -> bool:
        return bool(self._undelivered) or self._engine.has_unfinished

    @_serialized
    def add_request(self, prompt: Prompt, params: SamplingParams | None = None, *extra: object, **unknown: object) -> int:
        """Queue one request (validated now); returns its ``request_id`` (0, 1, ... per engine).

        It joins the next :meth:`step` that has room for it; its :class:`RequestOutput` comes back
        from the step in which it finishes. vLLM's engine form, ``add_request(request_id, prompt,
        params)``, is refused with a :class:`ConfigError` saying so: the engine assigns the ids.
        """
        self._require_open("add_request")
        if extra or unknown or (isinstance(prompt, str) and params is not None and not isinstance(params, SamplingParams)):
            given = ", ".join([*(repr(a) for a in (prompt, params, *extra)), *(f"{k}=..." for k in unknown)])
            raise ConfigError(
                f"LLM.add_request({given}): takes (prompt, params) and returns the request id it assigns; "
                "vLLM's engine form add_request(request_id, prompt, params) is not supported: drop the "
                "request id and keep the one add_request returns."
            )
        checked = self._validate_prompt(self._next_request_id, prompt)  # named by its request id
        request_id = self._next_request_id
        params = self._validate_params(request_id, SamplingParams() if params is None else params, checked)
        self._next_request_id += 1
        self._engine.add(self._request(request_id, checked, params))
        return request_id

    @_serialized
    def step(self) -> list[RequestOutput]:
        """Run one engine step; returns the requests whose finish the host learnt in it.

        An exception from the engine step aborts every request and propagates. One raised by a step
        observer after it (Ctrl-C in a progress bar) loses nothing: the next call returns that
        step's finished requests before running another."""
        self._require_open("step")
        if self._undelivered:
            done, self._undelivered = self._undelivered, []
            return done
        if not self._has_unfinished():
            return []
        try:
            finished = self._engine.step()
        except BaseException:
            self._engine.abort()
            raise
        self.stats.finished_requests += len(finished)
        done = [req.to_output() for req in finished]
        self._undelivered = done  # an observer may raise: these are then the next step's result
        notify_step(done)
        self._undelivered = []
        return done

    @_serialized
    def generate(
        self,
        prompts: Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        **unsupported: object,
    ) -> list[RequestOutput]:
        """Generate for every prompt; returns one `RequestOutput` per prompt, in order.

        Args:
            prompts: token-id lists (or vLLM ``{"prompt_token_ids": [...]}`` dicts, or 1-D
                integer numpy arrays or tensors, one per prompt, as tokenizers return them).
            sampling_params: one `SamplingParams` for all prompts, or one per prompt
                (default: ``SamplingParams()``).
        """
        self._require_open("generate")
        for name, value in unsupported.items():
            if value in _NEUTRAL_GENERATE_OPTIONS.get(name, ()):
                continue  # vLLM's generate(..., use_tqdm=False): nothing for tokenstate to do
            raise ConfigError(
                f"generate({name}=...) is not supported; generate takes prompts and "
                "sampling_params=SamplingParams(...) (one, or a list with one per prompt)."
            )
        sampling = sampling_params
        if isinstance(prompts, np.ndarray | torch.Tensor) and prompts.ndim in (1, 2):
            kind = type(prompts).__name__
            raise ConfigError(
                f"generate: prompts is one 1-D {kind}, the ids of one prompt; pass a list of prompts, e.g. [ids]."
                if prompts.ndim == 1
                else f"generate: a 2-D {kind} of prompts cannot say where each one's padding is; pass a list "
                "with one prompt per row, each its own ids (a list, or a 1-D array or tensor) without "
                "padding, e.g. [ids[mask.bool()] for ids, mask in zip(input_ids, attention_mask)]."
            )
        if isinstance(prompts, str | bytes) or not isinstance(prompts, Sequence):
            raise ConfigError(
                f"generate: prompts must be a list of token-id lists, got {type(prompts).__name__}."
            )
        if prompts and all(isinstance(p, Integral) for p in prompts):
            raise ConfigError(
                "generate: prompts must be a list of prompts, got one flat list of ints; for a "
                f"single prompt pass [[{', '.join(map(str, list(prompts)[:3]))}, ...]]."
            )
        if self._has_unfinished():
            raise ConfigError(
                "generate: requests added with add_request are still unfinished; drive them to the "
                "end with step() before calling generate."
            )
        checked = [self._validate_prompt(i, p) for i, p in enumerate(prompts)]
        if sampling is None:
            sampling = SamplingParams()
        if isinstance(sampling, SamplingParams):
            sampling = [sampling] * len(checked)
        if isinstance(sampling, Sequence) and len(sampling) == len(checked):
            per_request = [
                self._validate_params(i, p, prompt)
                for i, (p, prompt) in enumerate(zip(sampling, checked, strict=True))
            ]
        else:
            raise ConfigError(
                f"generate: sampling_params must be one SamplingParams or a list of {len(checked)} (one per "
                f"prompt), got {sampling!r}."
            )
        requests = [
            self._request(i, prompt, params)
            for i, (prompt, params) in enumerate(zip(checked, per_request, strict=True))
        ]
        return self._run(requests)

    def _run(self, requests: list[Request]) -> list[RequestOutput]:
        engine = self._engine
        for req in requests:
            engine.add(req)
        outputs: dict[int, RequestOutput] = {}
        try:
            while engine.has_unfinished:
                done = [req.to_output() for req in engine.step()]
                outputs.update((out.request_id, out) for out in done)
                notify_step(done)
        except BaseException:
            engine.abort()
            raise
        self.stats.finished_requests += len(outputs)
        return [outputs[req.request_id] for req in requests]
