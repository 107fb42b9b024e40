"""CUDA-graph capture sizes per vLLM version, as VllmConfig._set_cudagraph_sizes, CompilationConfig.
adjust_cudagraph_sizes_for_spec_decode and CudagraphDispatcher.initialize_cudagraph_keys pick them (read in the
0.25.0, 0.27.0-0.31.0 wheels and the installed 0.32.0), checked against every real boot's own count."""

from __future__ import annotations

import json
import re

import pytest

from autotune.fit.settings import Settings, settings
from autotune.fit.vllm_memory import capture_sizes
from benchmarks import estimator_accuracy as acc

SHAPE = acc._shape(str(acc.CONFIG))
BOOTS = json.loads((acc.DATA / "gpu-boots" / "boots.json").read_text())["boots"]
PROFILED = re.compile(r"PIECEWISE=(\d+) \(largest=(\d+)\), FULL=(\d+) \(largest=(\d+)\)")


def _settings(flags: dict) -> Settings:
    return settings(SHAPE, acc.h200(), {"language_model_only": True, **flags}, 0.9, None, False)


@pytest.mark.parametrize("boot", BOOTS, ids=[b["name"] for b in BOOTS])
def test_capture_sizes_match_what_the_boot_profiled(boot: dict) -> None:
    """"Profiling CUDA graph memory: PIECEWISE=n (largest=m), FULL=k (largest=l)" of each vLLM 0.25.0 boot; with
    MTP the sizes are rounded up to multiples of the query length 2 (1 -> 2), and FULL decode graphs start at 2."""
    flags = {k: v for k, v in boot["flags"].items() if k not in ("model", "host", "port")}
    m = PROFILED.search(boot["figures"]["cudagraph_profiled"])
    assert m is not None
    piecewise, full = capture_sizes(_settings(flags), flags, "0.25.0")
    assert (len(piecewise), max(piecewise), len(full), max(full)) == tuple(int(g) for g in m.groups())


@pytest.mark.parametrize("version", ["0.25.0", "0.27.1"])
def test_max_num_batched_tokens_is_captured_when_it_fits_since_0_25(version: str) -> None:
    """0.25 and 0.27 _set_cudagraph_sizes alike: 'ensure max_num_tokens is captured if within max capture size'."""
    flags = {"max_num_seqs": 48, "max_num_batched_tokens": 92}
    piecewise, _ = capture_sizes(_settings(flags), flags, version)
    assert piecewise[-1] == 92 and 88 in piecewise


@pytest.mark.parametrize(("version", "appended"), [("0.27.1", False), ("0.30.0", False), ("0.31.0", True),
                                                  ("0.32.0", True), (None, True)])
def test_max_num_seqs_decode_size_is_appended_from_0_31(version: str | None, appended: bool) -> None:
    flags = {"max_num_seqs": 20, "max_num_batched_tokens": 8192}
    piecewise, full = capture_sizes(_settings(flags), flags, version)
    assert (20 in piecewise) is appended and (20 in full) is appended
    assert max(piecewise) == 40


@pytest.mark.parametrize(("version", "largest"), [("0.27.1", 512), ("0.28.0", 1024), ("0.32.0", 1024)])
def test_blackwell_default_ceiling_is_1024_from_0_28(version: str, largest: int) -> None:
    flags = {"max_num_seqs": 512, "max_num_batched_tokens": 8192}
    piecewise, _ = capture_sizes(_settings(flags), flags, version, blackwell=True)
    assert max(piecewise) == largest


@pytest.mark.parametrize(("version", "decode_sizes"), [("0.28.0", False), ("0.29.0", True)])
def test_speculative_decode_sizes_are_appended_from_0_29(version: str, decode_sizes: bool) -> None:
    """Two draft tokens, 20 sequences: the grid is rounded up to multiples of 3; 0.29 adds n x 3 for the request
    counts 1, 2, 4, 8, 16, 20 (12 and 60 are not a rounded grid size); before, the widest FULL decode graph is 57."""
    flags = {"max_num_seqs": 20, "max_num_batched_tokens": 8192,
             "speculative_config": {"method": "mtp", "num_speculative_tokens": 2}}
    piecewise, full = capture_sizes(_settings(flags), flags, version)
    assert all(n % 3 == 0 for n in piecewise) and max(piecewise) == 120
    assert (12 in piecewise and 60 in piecewise) is decode_sizes
    assert full[0] == 3 and max(full) == (60 if decode_sizes else 57)


@pytest.mark.parametrize(("version", "rounded"), [("0.29.0", True), ("0.32.0", False), (None, False)])
def test_from_0_32_the_v2_runner_rounds_only_the_decode_graphs(version: str | None, rounded: bool) -> None:
    """0.32 runs Model Runner V2 by default: adjust_cudagraph_sizes_for_spec_decode applies to the V1 runner only
    (config/compilation.py 1495-1501), and V2 rounds its uniform-decode descriptors to the query length
    (gpu/cudagraph_utils.py _init_candidates): PIECEWISE keeps 1, 2, 4, 8, ...; FULL takes multiples of 3."""
    flags = {"max_num_seqs": 20, "max_num_batched_tokens": 8192,
             "speculative_config": {"method": "mtp", "num_speculative_tokens": 2}}
    piecewise, full = capture_sizes(_settings(flags), flags, version)
    assert all(n % 3 == 0 for n in piecewise) is rounded and (8 in piecewise) is not rounded
    assert full and all(n % 3 == 0 for n in full) and full[0] == 3
