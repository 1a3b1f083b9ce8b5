"""The scheduling page's code runs, and every feature it shows is actually exercised."""

from __future__ import annotations

import importlib.util
import itertools
from pathlib import Path

from tokenstate.contracts import PLACEHOLDER

TOUR = Path(__file__).resolve().parents[2] / "docs" / "concepts" / "snippets" / "scheduling_tour.py"


def test_scheduling_tour_runs_and_async_matches_sync():
    spec = importlib.util.spec_from_file_location("scheduling_tour", TOUR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result = module.tour()
    (sync_tokens, _), (async_tokens, async_stats) = result["sync"], result["async"]
    assert async_tokens == sync_tokens
    assert all(len(t) == 10 and PLACEHOLDER not in t for t in async_tokens)
    assert async_stats.async_steps > 0 and async_stats.fallback_steps == 0
    assert async_stats.preemptions > 0 and async_stats.reordered_steps > 0
    assert async_stats.drafts_proposed > 0 and async_stats.skipped_rows > 0
    for penalised in (async_tokens[1], async_tokens[3]):  # bad words (59,) and (78, 39) never appear
        assert 59 not in penalised
        assert all(pair != (78, 39) for pair in itertools.pairwise(penalised))
    assert [len(o.token_ids) for o in result["streamed"]] == [10, 10]
