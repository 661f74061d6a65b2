"""``--weight`` names are the policy's own: a misspelt or unused name is one line, exit 2."""

from __future__ import annotations

import pytest

from gpupool.cli.args import check_weights, weight_names
from gpupool.cli.main import main
from gpupool.core.errors import InvalidInput
from gpupool.core.policies import POLICIES


def test_the_weight_names_are_the_ones_each_policy_reads() -> None:
    assert "fgd-balance.lambda" in weight_names("fgd-balance")
    assert "fgd.exact" in weight_names("fgd-balance")  # it builds on fgd
    assert weight_names("best-fit") == {"bestfit.gpu", "bestfit.cpu", "bestfit.memory"}
    assert weight_names("random") == frozenset()
    assert all(isinstance(weight_names(p), frozenset) for p in POLICIES)


def test_a_known_weight_of_a_policy_that_runs_passes() -> None:
    check_weights([("fgd-balance.lambda", 0.5), ("bestfit.cpu", 1.0)],
                  ["fgd-balance", "best-fit"])


@pytest.mark.parametrize(("weights", "policies", "message"), [
    ([("fgd-balance.lamda", 0.5)], ["fgd-balance"],
     "--weight fgd-balance.lamda: no such weight (did you mean fgd-balance.lambda?)"),
    ([("fgd-balance.lambda", 0.5)], ["best-fit"],
     "--weight fgd-balance.lambda: only policy fgd-balance reads it, and it is not run "
     "(--policy fgd-balance)"),
    ([("zzz", 1.0)], ["random"], "--weight zzz: no such weight (weights of random: none)"),
], ids=["a misspelt name", "a name of a policy not run", "a name nothing is close to"])
def test_a_weight_no_policy_run_reads_is_refused_with_the_closest_name(
        weights: list[tuple[str, float]], policies: list[str], message: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        check_weights(weights, policies)
    assert str(caught.value) == message


def test_simulate_refuses_an_unknown_weight_in_one_line_with_exit_2(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--policy", "fgd-balance", "--weight", "fgd-balance.lamda=2",
                 "--synthetic-nodes", "2", "--seeds", "1"]) == 2
    err = capsys.readouterr().err
    assert err == ("gpupool: --weight fgd-balance.lamda: no such weight "
                   "(did you mean fgd-balance.lambda?)\n")
