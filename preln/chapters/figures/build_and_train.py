"""Figures of the chapter "The block, built and trained in one sitting" (book/build_and_train.ipynb).

The notebook trains the tiny language model and records its losses; this module draws them. Every
plot returns a :class:`matplotlib.figure.Figure` built without pyplot (a notebook cell shows it once,
when it is the cell's value) and carries its alt text and description (:func:`preln.nb.set_alt`).
"""
from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from preln.chapters.viz import PALETTE
from preln.nb import fixed, set_alt

__all__ = ["EXPLORABLES", "plot_loss_curves", "LOSS_FIGSIZE"]

#: inches; shown at 100 CSS px per inch (preln.nb.FIGURE_SCALE), 640 px: no wider than the page's
#: text column, so its 10-11 pt words stay at least 13 px on the site
LOSS_FIGSIZE = (6.4, 3.6)
TRAIN, HELD_OUT = PALETTE[0], PALETTE[1]     # blue, vermillion


def plot_loss_curves(train_loss, val_steps, val_loss, vocab_size, warmup):
    """Cross-entropy (nats per character) against the Adam step: the training batches' loss at
    every step (a thin line), the held-out loss at ``val_steps`` (dots), the uniform guess ln V as
    a dashed line and the warm-up steps shaded. Labelled on the plot itself, no legend.

    train_loss: the loss of step t = 1 .. T's batch, (T,);  val_steps, val_loss: where the held-out
    loss was measured (step 0: before training) and its values;  vocab_size: V;  warmup: steps.
    """
    train_loss = np.asarray(train_loss, dtype=float)
    val_steps, val_loss = np.asarray(val_steps), np.asarray(val_loss, dtype=float)
    if train_loss.ndim != 1 or train_loss.size < 2:
        raise ValueError(f"train_loss: expected one loss per step, at least 2; got shape {train_loss.shape}")
    if val_steps.shape != val_loss.shape or val_loss.ndim != 1 or val_loss.size < 2:
        raise ValueError(f"val_steps, val_loss: expected two 1-D arrays of one length >= 2; got "
                         f"shapes {val_steps.shape} and {val_loss.shape}")
    if not (isinstance(vocab_size, (int, np.integer)) and vocab_size >= 2):
        raise ValueError(f"vocab_size: expected an int >= 2; got {vocab_size!r}")
    T = train_loss.size
    steps = np.arange(1, T + 1)
    ln_v = float(np.log(vocab_size))

    fig = Figure(figsize=LOSS_FIGSIZE)
    ax = fig.subplots()
    ax.axvspan(0, warmup, color="0.9", lw=0)
    ax.plot(steps, train_loss, color=TRAIN, lw=1.0)
    ax.plot(val_steps, val_loss, "o-", color=HELD_OUT, ms=4, lw=1.5)
    ax.axhline(ln_v, color="0.35", ls="--", lw=1.2)
    top = max(float(train_loss.max()), float(val_loss.max()), ln_v) * 1.12
    ax.set_ylim(0, top)
    ax.set_xlim(0, T)
    # the words sit in the empty upper right, each next to its own curve or line
    ax.text(T * 0.98, ln_v + 0.06 * top, r"$\ln V$" + f" = {fixed(ln_v)}: a uniform guess",
            ha="right", va="bottom", fontsize=11, color="0.25")
    ax.text(warmup / 2, 0.04 * top, "warm-up", ha="center", va="bottom", fontsize=10, color="0.25",
            rotation=90)
    i = int(np.searchsorted(val_steps, 0.55 * T))          # a held-out point past half way
    # the training batches' loss runs above the held-out loss: its label above, the other's below
    ax.annotate("held-out text", (val_steps[i], val_loss[i]), xytext=(0, -34), textcoords="offset points",
                ha="center", va="top", color=HELD_OUT, fontsize=11,
                arrowprops=dict(arrowstyle="-", color=HELD_OUT, lw=1))
    j = int(0.75 * T)
    ax.annotate("training batches", (steps[j], train_loss[j]), xytext=(0, 28), textcoords="offset points",
                ha="center", va="bottom", color=TRAIN, fontsize=11,
                arrowprops=dict(arrowstyle="-", color=TRAIN, lw=1))
    ax.set_xlabel(r"Adam step $t$")
    ax.set_ylabel("cross-entropy (nats per character)")
    ax.set_title("The tiny language model learns the corpus", fontsize=12)

    tail = max(1, T // 10)
    first, last = train_loss[0], float(train_loss[-tail:].mean())
    below = val_steps[val_loss < ln_v]
    alt = (f"Loss against step: the training loss falls from {fixed(first)} to {fixed(last)} and the held-out "
           f"loss from {fixed(val_loss[0])} to {fixed(val_loss[-1])} in {T} steps, far below ln V = {fixed(ln_v)}.")
    description = (
        f"Cross-entropy in nats per character against the Adam step, 0 to {T}. The thin blue line is the "
        f"loss of each step's training batch: {fixed(first)} at step 1, {fixed(last)} on average over the "
        f"last {tail} steps. The vermillion dots are the loss on held-out text, measured every "
        f"{int(val_steps[1] - val_steps[0])} steps: {fixed(val_loss[0])} before training, "
        f"{fixed(val_loss[-1])} at step {int(val_steps[-1])}"
        + (f", below the uniform guess from step {int(below[0])} on" if below.size else "")
        + f". The dashed line is ln V = {fixed(ln_v)}, the loss of a uniform guess over V = {vocab_size} "
        f"characters. The first {warmup} steps, shaded, are the warm-up, where the learning rate grows "
        f"linearly to its full value. At the end the held-out loss is {fixed(abs(val_loss[-1] - last))} "
        f"{'above' if val_loss[-1] >= last else 'below'} the training loss.")
    return set_alt(fig, alt, description)


EXPLORABLES = {}
