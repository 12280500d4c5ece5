"""sweep_params.png is readable: a log axis's tick labels do not run into each other, and the
colour bar stands beside the last axis, not over it (clorch.sweep.report._readable_ticks)."""

from __future__ import annotations

import warnings

import pytest

pytestmark = pytest.mark.timeout(60)


def _slice_figure():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import optuna
    import optuna.visualization.matplotlib as plots

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    study.optimize(lambda t: t.suggest_float("lr", 1e-4, 1e-1, log=True), n_trials=12)  # a one-key lr search
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        axes = plots.plot_slice(study)
    return (axes.flat[0] if hasattr(axes, "flat") else axes).figure


def _overlaps(boxes) -> bool:
    boxes = sorted(boxes, key=lambda b: b.x0)
    return any(a.x1 > b.x0 for a, b in zip(boxes, boxes[1:]))


def _crowded(figure) -> list[str]:
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    found = []
    plots = [ax for ax in figure.axes if ax.get_label() != "<colorbar>"]
    for ax in plots:
        labels = [
            t for t in [*ax.get_xticklabels(), *ax.get_xticklabels(minor=True)] if t.get_visible() and t.get_text()
        ]
        if _overlaps([t.get_window_extent(renderer) for t in labels]):
            found.append(f"{ax.get_xlabel()}: tick labels overlap")
    bars = [ax for ax in figure.axes if ax.get_label() == "<colorbar>"]
    last = max(plots, key=lambda ax: ax.get_position().x1)
    if any(bar.get_position().x0 < last.get_position().x1 for bar in bars):
        found.append("the colour bar covers the last axis")
    return found


def test_the_parameters_plot_is_readable():
    from clorch.sweep.report import _readable_ticks

    assert _crowded(_slice_figure()) == ["lr: tick labels overlap"]  # as Optuna draws it
    figure = _slice_figure()
    _readable_ticks(figure)
    assert _crowded(figure) == []
