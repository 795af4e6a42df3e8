"""`python -m bench.probes.lifecycle`: each figure's --help (the runs themselves need services
and minutes: docs/archive.md, "Figures")."""

from __future__ import annotations

import pytest

from bench.probes import lifecycle


@pytest.mark.parametrize("figure", [[], ["prune-ab"], ["archive"], ["history"]])
def test_help(figure: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        lifecycle.main([*figure, "--help"])
    assert done.value.code == 0
    assert "usage: python -m bench.probes.lifecycle" in capsys.readouterr().out


def test_a_figure_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        lifecycle.main([])
    assert done.value.code == 2
