"""`run --goodput`: vLLM bench's SLO syntax for the limits, a percentile form of autotune's, refused in one line."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from autotune.cli import main
from autotune.cli.search import spread_goodput
from autotune.config.objective import goodput_limits
from autotune.errors import SpecError
from autotune.measure.stats import Limits


def test_goodput_pairs_are_limits_at_p95_or_at_the_percentile_named() -> None:
    assert goodput_limits(["ttft:2000", "tpot:100"]) == Limits(p95_ttft_ms=2000, p95_tpot_ms=100)
    assert goodput_limits(["p99_tpot:50", "e2el:9000", "p50_itl_ms:20"]) == Limits(
        p99_tpot_ms=50, p95_e2el_ms=9000, p50_itl_ms=20)


@pytest.mark.parametrize("item", ["ttft=2000", "ttft:", "ttft:abc", "ttft:-5", "ttft:nan", "ttft:inf", "p97_ttft:10",
                                  "latency:10", "p99:10"])
def test_a_malformed_goodput_pair_is_refused_naming_it(item: str) -> None:
    with pytest.raises(SpecError) as info:
        goodput_limits(["tpot:100", item])
    assert (info.value.source, info.value.key) == ("--goodput", item) and "KEY:MS" in info.value.message


def test_the_same_limit_twice_is_refused() -> None:
    with pytest.raises(SpecError, match="p95_ttft_ms is given twice"):
        goodput_limits(["ttft:100", "p95_ttft:200"])


def test_several_values_after_one_goodput_flag_as_vllm_bench_takes_them() -> None:
    assert spread_goodput(["s.toml", "--goodput", "ttft:1", "p99_tpot:2", "--budget", "1m"]) == [
        "s.toml", "--goodput", "ttft:1", "--goodput", "p99_tpot:2", "--budget", "1m"]
    assert spread_goodput(["--goodput", "ttft:1", "s.toml"]) == ["--goodput", "ttft:1", "s.toml"]


def test_run_refuses_a_malformed_goodput_in_one_line_before_anything_is_written(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    study = tmp_path / "s.toml"
    study.write_text("not read: the option is checked first\n")
    out = CliRunner().invoke(main, ["run", str(study), "--goodput", "ttft:500", "tpot=50"])
    assert out.exit_code == 2, out.output
    (line,) = out.output.strip().splitlines()
    assert line.startswith("error: --goodput: tpot=50: expected KEY:MS") and list(tmp_path.iterdir()) == [study]
