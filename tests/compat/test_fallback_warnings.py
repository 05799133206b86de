"""megarl hides megatron's TE/apex fallback import warnings (filter installed by `import megarl`), only those."""

import importlib.util
import subprocess
import sys
import warnings

from megarl.compat.megatron_core.fallback_warnings import fallback_note, ignore_fallback_warnings


def emitted(message: str, module: str) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ignore_fallback_warnings()  # catch_warnings restores the filters on exit
        warnings.warn_explicit(message, UserWarning, "x.py", 1, module=module)
    return [str(w.message) for w in caught]


def test_only_megatron_fallback_messages_are_hidden():
    te = "Transformer Engine and Apex are not installed. Falling back to Torch optimizers."
    apex = "Apex is not installed. Falling back to Torch Norm"
    assert emitted(te, "megatron.core.optimizer") == []
    assert emitted(apex, "megatron.core.models.backends") == []
    assert emitted(te, "mypackage.optim") == [te]  # the same words from elsewhere still show
    other = "full scope is deprecated. Use empty cuda_graph_scope to capture the whole layer."
    assert emitted(other, "megatron.core.transformer.transformer_config") == [other]


def test_importing_megatron_after_megarl_prints_no_fallback_warning():
    """In a fresh process (pytest resets warning filters per test, so not in this one)."""
    code = "import megarl, megatron.core.optimizer, megatron.core.models.gpt.gpt_layer_specs"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "not installed. Falling back" not in proc.stderr, proc.stderr[-2000:]


def test_note_names_the_missing_packages():
    missing = [name for name in ("transformer_engine", "apex") if importlib.util.find_spec(name) is None]
    note = fallback_note()
    if missing:
        assert f"{' and '.join(missing)} not installed" in note
    else:
        assert note is None
