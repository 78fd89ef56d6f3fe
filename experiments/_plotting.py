"""Matplotlib for the experiments, through its object API: no pyplot state, no backend switch.

An experiment's plot function makes its figure with `subplots(...)`, draws, and hands the figure
to `experiments.report.savefig`, which lays it out and writes the PNG. Figures are plain
`matplotlib.figure.Figure` objects (not registered with pyplot), so plotting from a notebook
neither changes its backend nor leaves figures open, and a headless machine needs no setup.
Importing this module does not import matplotlib, so listing or importing experiments stays fast.
"""

from __future__ import annotations


def subplots(nrows: int = 1, ncols: int = 1, *, figsize: tuple[float, float] | None = None, **kwargs):
    """A new `Figure` and its axes: `(fig, axes)`, as `pyplot.subplots` returns them.

    `kwargs` go to `Figure.subplots` (`squeeze`, `sharex`, `sharey`, ...).
    """
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    return fig, fig.subplots(nrows, ncols, **kwargs)


def colormap(name: str):
    """The registered matplotlib colormap `name` (e.g. "viridis"), callable on values in [0, 1]."""
    import matplotlib

    return matplotlib.colormaps[name]


def legend(ax, **kwargs) -> None:
    """Draws `ax`'s legend only when it has labelled artists (an empty legend just warns)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kwargs)
