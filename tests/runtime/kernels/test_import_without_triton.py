"""``import tokenstate.runtime.kernels`` and the CPU twins work on a machine without triton."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import importlib.abc
    import sys

    class BlockTriton(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "triton" or name.startswith("triton."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, BlockTriton())

    import os
    import torch
    import tokenstate.runtime.kernels as kernels
    from tokenstate.contracts import ConfigError

    assert "triton" not in sys.modules
    i32 = lambda *v: torch.tensor(v, dtype=torch.int32)
    ids, logits = kernels.combine(
        i32(-1), i32(0, 1), i32(5), i32(0), i32(0), i32(3), i32(42),
        torch.zeros(1, 0, dtype=torch.int32), i32(0, 1),
    )
    assert ids.tolist() == [42] and logits.tolist() == [0]
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        kernels.guarded_embedding(torch.tensor([1]), torch.ones(3, 2), backend="triton")
    except ConfigError as exc:
        assert "needs triton" in str(exc) and "backend='torch'" in str(exc), exc
    else:
        raise AssertionError("backend='triton' without triton did not raise ConfigError")
    assert "triton" not in sys.modules
    print("ok")
    """
)


def test_kernels_import_and_run_their_twins_with_triton_blocked() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
