"""Adam with bias correction, the warm-up schedule of Xiong et al. (2020), global-norm clipping.

    Adam (Kingma & Ba 2015, arXiv 1412.6980), step t = 1, 2, ...:
        m_t = beta1 m_{t-1} + (1 - beta1) g_t          v_t = beta2 v_{t-1} + (1 - beta2) g_t^2
        m^_t = m_t / (1 - beta1^t)                     v^_t = v_t / (1 - beta2^t)
        theta_t = theta_{t-1} - lr_t m^_t / (sqrt(v^_t) + eps)

    Warm-up (Xiong et al. 2020, section 3.2): lr(t) = min(1, t / T_warmup) lr_max, then constant or
    lr_max sqrt(T_warmup / t) (the inverse square root of Vaswani et al. 2017).

    Clipping: if ||g|| = sqrt(sum over every parameter of sum g^2) > max_norm, every g is scaled by
    max_norm / ||g|| (as torch.nn.utils.clip_grad_norm_).

Betas default to (0.9, 0.98), Xiong et al.'s setting.
"""
import time

import numpy as np

__all__ = ["Adam", "warmup_lr", "clip_grad_norm", "global_norm", "fit"]


def warmup_lr(t, lr_max, warmup_steps=0, decay="constant"):
    """Learning rate at step t >= 1: min(1, t / T) lr_max, then constant or inverse-sqrt.

    warmup_steps = 0 means no warm-up (lr_max from the first step).
    decay: "constant" or "inv_sqrt" (lr_max sqrt(T / t) for t > T; needs T > 0).
    """
    if t < 1:
        raise ValueError(f"t: expected a step number >= 1; got {t}")
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps: expected >= 0; got {warmup_steps}")
    if decay not in ("constant", "inv_sqrt"):
        raise ValueError(f"decay: expected 'constant' or 'inv_sqrt'; got {decay!r}")
    if warmup_steps and t < warmup_steps:
        return lr_max * t / warmup_steps
    if decay == "inv_sqrt" and warmup_steps:
        return lr_max * np.sqrt(warmup_steps / t)
    return float(lr_max)


def global_norm(grads):
    """sqrt of the sum of squares of every gradient array (a dict name -> array)."""
    return float(np.sqrt(sum(float(np.sum(np.square(g, dtype=np.float64))) for g in grads.values())))


def clip_grad_norm(grads, max_norm):
    """Scale every gradient in place so the global norm is at most ``max_norm``; return the norm
    before clipping. ``max_norm=None`` or ``inf`` only measures."""
    norm = global_norm(grads)
    if max_norm is not None and np.isfinite(max_norm) and norm > max_norm:
        scale = max_norm / (norm + 1e-6)
        for g in grads.values():
            g *= scale
    return norm


class Adam:
    """Adam over a dict of parameter arrays, updated in place.

    params: dict name -> array (the model's live arrays, e.g. ``model.params``).
    lr: default learning rate (``step`` can override it per step, for a schedule).
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.0):
        if not 0.0 <= betas[0] < 1.0 or not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"betas: expected two values in [0, 1); got {betas}")
        if lr < 0 or eps <= 0:
            raise ValueError(f"lr, eps: expected lr >= 0 and eps > 0; got lr={lr}, eps={eps}")
        self.params = params
        self.lr, self.betas, self.eps, self.weight_decay = lr, tuple(betas), eps, weight_decay
        self.m = {k: np.zeros_like(v) for k, v in params.items()}
        self.v = {k: np.zeros_like(v) for k, v in params.items()}
        self.t = 0

    def step(self, grads, lr=None):
        """One update with ``grads`` (same keys as params); returns the lr used."""
        missing = [k for k in self.params if k not in grads]
        if missing:
            raise KeyError(f"grads: missing gradients for {missing}")
        lr = self.lr if lr is None else lr
        b1, b2 = self.betas
        self.t += 1
        c1 = 1.0 - b1 ** self.t                        # bias corrections
        c2 = 1.0 - b2 ** self.t
        for k, p in self.params.items():
            g = grads[k]
            if self.weight_decay:
                g = g + self.weight_decay * p
            self.m[k] = b1 * self.m[k] + (1 - b1) * g     # m_t
            self.v[k] = b2 * self.v[k] + (1 - b2) * g * g  # v_t
            p -= lr * (self.m[k] / c1) / (np.sqrt(self.v[k] / c2) + self.eps)
        return lr


def fit(model, batches, opt, steps, lr, warmup=0, decay="constant", clip=None, *,
        evaluate=None, eval_every=0, on_divergence="raise", who="fit"):
    """The book's one training loop: ``steps`` steps of the next batch's gradients
    (``model.loss_and_grads(tokens, targets)``), global-norm clipping at ``clip``, and an ``opt``
    step at ``warmup_lr(t, lr, warmup, decay)``.

    batches:  an iterator of (tokens, targets), e.g. :func:`preln.models.lm.batches`.
    evaluate: a function of no argument -> a held-out loss, called at step 0, every ``eval_every``
              steps and after the last step (None: never).
    on_divergence: a non-finite loss or gradient norm "raise"s FloatingPointError naming ``who``
              and the step, or "stop"s the loop (the log says "diverged"; its per-step lists are
              padded with NaN to ``steps``).
    Returns {"train_loss", "grad_norm" (before clipping), "eval_steps", "eval_loss", "diverged",
    "seconds", "cpu_seconds"}.
    """
    if on_divergence not in ("raise", "stop"):
        raise ValueError(f"on_divergence: expected 'raise' or 'stop'; got {on_divergence!r}")
    log = {"train_loss": [], "grad_norm": [], "eval_steps": [], "eval_loss": [], "diverged": False}

    def measure(t):
        if evaluate is not None and (t == 0 or t == steps or (eval_every and t % eval_every == 0)):
            log["eval_steps"].append(t)
            log["eval_loss"].append(evaluate())

    measure(0)
    start, cpu = time.perf_counter(), time.process_time()
    with np.errstate(all="ignore"):              # divergence is checked below, not warned about
        for t in range(1, steps + 1):
            loss, grads = model.loss_and_grads(*next(batches))
            norm = clip_grad_norm(grads, clip)
            if not (np.isfinite(loss) and np.isfinite(norm)):
                if on_divergence == "raise":
                    raise FloatingPointError(f"{who}: training diverged at step {t} "
                                             f"(loss {loss}, gradient norm {norm})")
                log["diverged"] = True
                break
            opt.step(grads, lr=warmup_lr(t, lr, warmup, decay))
            log["train_loss"].append(float(loss))
            log["grad_norm"].append(norm)
            measure(t)
    log["seconds"] = time.perf_counter() - start
    log["cpu_seconds"] = time.process_time() - cpu
    missing = steps - len(log["train_loss"])
    log["train_loss"] += [float("nan")] * missing
    log["grad_norm"] += [float("nan")] * missing
    return log
