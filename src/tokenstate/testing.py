"""The token gate as an assertion for your own tests: ``assert_async_equals_sync(...)``.

Two shapes, one verdict — asynchronous scheduling must produce exactly the tokens synchronous
scheduling produces:

* a **registered model** (a preset or architecture name, a ``ModelFactory``, or an HF-format
  directory): the same requests go through tokenstate's sync and async paths (the gate behind
  ``tokenstate gate``), chunked prefill and mixed prefill/decode steps included;
* **your own engine**: a callable ``generate(prompts, async_scheduling) -> token ids per prompt``,
  called once per mode.

On a mismatch it raises ``AssertionError`` naming each diverging request, the first diverging
token and — for registered models — the step and batch row that sampled it and whether that row
was stale. A contract error on one path (a stale host read, a placeholder in the embedding) fails
the assertion with that error's message. The pytest plugin offers the same function as the
``tokenstate_gate`` fixture.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["EngineGenerate", "assert_async_equals_sync"]

EngineGenerate = Callable[[list[list[int]], bool], Sequence[Sequence[int]]]
"""``generate(prompts, async_scheduling)``: generated token ids per prompt, in prompt order."""


def assert_async_equals_sync(
    model: Any,
    prompts: Sequence[Sequence[int]] | None = None,
    *,
    num_requests: int = 8,
    max_tokens: int = 32,
    max_num_seqs: int = 4,
    max_num_batched_tokens: int = 32,
    seed: int = 0,
    device: str = "cpu",
    checks: str | None = None,
    oracle: bool = False,
) -> Any:
    """Assert that async scheduling reproduces sync scheduling token for token.

    Args:
        model: a registered preset or architecture name, a ``ModelFactory``, an HF-format
            directory — or your own engine's ``generate(prompts, async_scheduling)`` callable.
        prompts: token-id prompts; ``None`` uses the gate's built-in request set (mixed lengths
            that force chunked prefill; registered models only).
        num_requests: size of the built-in request set.
        max_tokens: tokens per request (EOS is ignored, so every request runs this long).
        max_num_seqs: requests running at once (fewer than the requests: slots get reused).
        max_num_batched_tokens: token budget per step (prompts longer than it are chunked).
        seed: seed of the built-in request set and of the engines.
        device: ``"cpu"`` or ``"cuda"``.
        checks: checks mode for the run (``"off"``, ``"boundary"``, ``"full"``; default: the
            active one).
        oracle: also compare both paths with HF transformers: a model that cannot save HF-format
            weights, or whose architecture transformers has no class for, is a ``ConfigError``.

    The options from ``num_requests`` on configure tokenstate's own engines: with your own
    ``generate`` they must stay at their defaults (set them in your engine instead).

    Returns:
        The gate's ``GateReport`` (registered models) or the outputs per path
        (``{"sync": ..., "async": ...}``) for your own engine.

    Raises:
        AssertionError: a path diverged, or raised (a contract error or its own), the message says where.
        tokenstate.contracts.ConfigError: a bad argument — a bad prompt included, which both paths
            would refuse alike (it is never reported as a divergence), and, with your own engine,
            an output that is not one token-id list per prompt.
    """
    from tokenstate.contracts import CHECK_MODES, ConfigError, get_checks_mode
    from tokenstate.runtime.registry import ModelFactory

    get_checks_mode()  # a bad TOKENSTATE_CHECKS is refused here, not reported as a divergence
    if checks is not None and checks not in CHECK_MODES:
        raise ConfigError(
            f"assert_async_equals_sync: checks={checks!r} is not a checks mode; valid values: "
            f"{', '.join(CHECK_MODES)}."
        )
    if prompts is not None:
        prompts = _checked_prompts(prompts)
    if callable(model) and not isinstance(model, ModelFactory):
        if prompts is None:
            raise ConfigError(
                "assert_async_equals_sync: pass prompts=[[...], ...] with your own engine's "
                "generate; the built-in request set is for registered models."
            )
        given = {
            "num_requests": num_requests, "max_tokens": max_tokens, "max_num_seqs": max_num_seqs,
            "max_num_batched_tokens": max_num_batched_tokens, "seed": seed, "device": device,
            "checks": checks, "oracle": oracle,
        }  # fmt: skip
        ignored = [f"{k}={v!r}" for k, v in given.items() if v != _ENGINE_DEFAULTS[k]]
        if ignored:
            raise ConfigError(
                f"assert_async_equals_sync: {', '.join(ignored)} configure tokenstate's own engines; "
                "your own generate(prompts, async_scheduling) runs with whatever settings it has, so "
                "set them there (or leave these at their defaults)."
            )
        return _assert_engine(model, prompts)
    from tokenstate.tools.gate import GateConfig, run_gate

    config = GateConfig(
        num_requests=num_requests if prompts is None else len(prompts),
        max_tokens=max_tokens,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        seed=seed,
        device=device,
        checks=checks,
        oracle=oracle,
    )
    report = run_gate(model, config, prompts)
    if oracle and report.oracle_note:
        raise ConfigError(f"assert_async_equals_sync(oracle=True): {report.oracle_note}; pass oracle=False.")
    if not report.passed:
        raise AssertionError(_describe_report(report))
    return report


_ENGINE_DEFAULTS: dict[str, Any] = {
    "num_requests": 8, "max_tokens": 32, "max_num_seqs": 4, "max_num_batched_tokens": 32, "seed": 0,
    "device": "cpu", "checks": None, "oracle": False,
}  # fmt: skip
"""The defaults of :func:`assert_async_equals_sync`'s engine options (refused with your own engine)."""


def _checked_prompts(prompts: Sequence[Sequence[int]]) -> list[list[int]]:
    from tokenstate.contracts import ConfigError

    if isinstance(prompts, str | bytes) or not isinstance(prompts, Sequence) or not prompts or any(
        isinstance(p, str | bytes) or not isinstance(p, Sequence) for p in prompts
    ):
        raise ConfigError(
            f"assert_async_equals_sync: prompts must be a non-empty list of token-id lists, got {prompts!r}."
        )
    return [list(p) for p in prompts]


def _describe_report(report: Any) -> str:
    lines = [f"async scheduling diverged from sync scheduling for model {report.model!r}:"]
    return "\n".join(lines + [f"  {problem}" for problem in report.problems()])


def _assert_engine(generate: EngineGenerate, prompts: list[list[int]]) -> dict[str, list[list[int]]]:
    import inspect

    from tokenstate.contracts import ConfigError

    try:
        inspect.signature(generate).bind(prompts, False)
    except TypeError as exc:
        raise ConfigError(
            f"assert_async_equals_sync: generate(prompts, async_scheduling) is called with two positional "
            f"arguments, which {getattr(generate, '__qualname__', generate)!r} does not take ({exc}); "
            "give it that signature (a keyword-only async_scheduling cannot be passed positionally)."
        ) from None
    except ValueError:  # a builtin or C callable without a signature: just call it
        pass
    outputs: dict[str, list[list[int]]] = {}
    for path, async_scheduling in (("sync", False), ("async", True)):
        try:
            got = generate([list(p) for p in prompts], async_scheduling)
        except ConfigError:
            raise
        except Exception as exc:  # a contract error, or the engine's own (torch's IndexError at a placeholder)
            if path == "sync":  # the reference itself failed: there is nothing to compare against
                raise AssertionError(
                    f"the sync path, the reference, raised {type(exc).__name__}: {exc}; nothing was compared "
                    "— the engine fails without async scheduling too."
                ) from exc
            raise AssertionError(
                f"async scheduling diverged from sync scheduling: the {path} path raised "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        outputs[path] = _token_lists(got, len(prompts), async_scheduling)
        if path == "sync" and not any(outputs[path]):
            raise ConfigError(
                "assert_async_equals_sync: generate(prompts, async_scheduling=False) generated no token for "
                "any prompt, so there is nothing to compare; generate at least one token per prompt."
            )
    problems = []
    for i, (sync, async_) in enumerate(zip(outputs["sync"], outputs["async"], strict=True)):
        if sync != async_:
            k = next((j for j, (a, b) in enumerate(zip(sync, async_, strict=False)) if a != b), min(len(sync), len(async_)))
            expected = sync[k] if k < len(sync) else "end of output"
            got = async_[k] if k < len(async_) else "end of output"
            problems.append(
                f"  request {i} ({len(prompts[i])}-token prompt): {k}/{len(sync)} tokens match; first "
                f"divergence token {k}: expected {expected}, got {got}"
            )
    if problems:
        raise AssertionError("async scheduling diverged from sync scheduling:\n" + "\n".join(problems))
    return outputs


def _token_lists(got: object, num_prompts: int, async_scheduling: bool) -> list[list[int]]:
    """``got`` as one list of int token ids per prompt, or a ConfigError saying what came back."""
    import numbers

    from tokenstate.contracts import ConfigError

    def is_ids(tokens: object) -> bool:
        return (
            not isinstance(tokens, str | bytes) and isinstance(tokens, Sequence)
            and all(isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in tokens)
        )  # fmt: skip

    if isinstance(got, str | bytes) or not isinstance(got, Sequence) or len(got) != num_prompts or not all(
        is_ids(tokens) for tokens in got
    ):
        raise ConfigError(
            f"assert_async_equals_sync: generate(prompts, async_scheduling={async_scheduling}) "
            f"must return one token-id list per prompt ({num_prompts}), got {got!r}."
        )
    return [[int(t) for t in tokens] for tokens in got]
