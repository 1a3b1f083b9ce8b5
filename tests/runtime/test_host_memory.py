"""The engine keeps a step's freed buffers in the process (glibc malloc), instead of re-faulting them."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from tokenstate.contracts import ConfigError
from tokenstate.runtime import LLM, host_memory

glibc_only = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="tunes glibc's malloc"
)

# A child process: steps whose three activations grow with the step's token count (1-1.7 MiB
# each), as prefill steps' do; prints the page faults of ten steps after a warm-up one. With glibc's
# adaptive thresholds every step's buffers are fresh mappings (each larger than the last freed one);
# retained, a step reuses the last one's memory and faults only what it grew by.
_STEPS = """
import resource, sys, torch
from tokenstate.runtime.host_memory import retain_freed_memory
print(retain_freed_memory(), file=sys.stderr)
def step(tokens):
    activations = [torch.empty(tokens, 1024).fill_(1.0) for _ in range(3)]
    del activations
step(256)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for tokens in range(272, 432, 16):
    step(tokens)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    env = {"TOKENSTATE_CPU_MALLOC": mode, "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", _STEPS], env=env, capture_output=True, text=True, check=True)
    return int(done.stdout.strip())


@glibc_only
def test_freed_step_buffers_are_reused_instead_of_faulted_in_again():
    retained, system = _faults("retain"), _faults("system")
    # ~10,000 pages faulted with glibc's own thresholds, 500-850 retained (the growth, and Python's own).
    assert system > 8_000, f"glibc's own thresholds faulted only {system} pages; the test shows nothing"
    assert retained * 5 < system, f"{retained} page faults retained, against {system} with glibc's own"


@glibc_only
def test_an_engine_on_the_cpu_retains_freed_memory(monkeypatch):
    monkeypatch.delenv(host_memory.CPU_MALLOC_ENV, raising=False)
    LLM("tiny-llama", max_num_seqs=2)
    assert host_memory.freed_memory_retained()


def test_a_bad_malloc_mode_is_refused_naming_the_variable_and_the_values(monkeypatch):
    monkeypatch.setenv(host_memory.CPU_MALLOC_ENV, "tcmalloc")
    with pytest.raises(ConfigError, match=r"TOKENSTATE_CPU_MALLOC='tcmalloc'.*retain, system"):
        LLM("tiny-llama", max_num_seqs=2)
