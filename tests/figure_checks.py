"""What every figure of the book must have, checked by the figure tests of each chapter."""
from matplotlib.figure import Figure


def assert_labelled(fig):
    """Every data axes (not a colour bar) has an x label, a y label and at least one artist."""
    assert isinstance(fig, Figure)
    axes = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    assert axes, "the figure has no axes"
    for ax in axes:
        assert ax.get_xlabel().strip(), f"axes {ax.get_title()!r} has no x label"
        assert ax.get_ylabel().strip(), f"axes {ax.get_title()!r} has no y label"
        assert ax.has_data() or ax.images or ax.texts, f"axes {ax.get_title()!r} is empty"
