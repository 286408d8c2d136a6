"""Adam with bias correction, the warm-up schedule, global-norm clipping."""
import numpy as np
import pytest

from preln.models.optim import Adam, clip_grad_norm, global_norm, warmup_lr


def test_adam_two_steps_by_hand():
    p = {"w": np.array([1.0, -2.0])}
    opt = Adam(p, lr=0.1, betas=(0.9, 0.98), eps=1e-8)
    g1, g2 = np.array([0.5, -1.0]), np.array([0.1, 0.3])
    opt.step({"w": g1})
    # t = 1: m = 0.1 g1, v = 0.02 g1^2; m^ = g1, v^ = g1^2 -> step = lr * sign(g1) (up to eps)
    p1 = np.array([1.0, -2.0]) - 0.1 * g1 / (np.abs(g1) + 1e-8)
    np.testing.assert_allclose(p["w"], p1, rtol=1e-15)
    np.testing.assert_allclose(p1, [0.9, -1.9], atol=1e-8)
    opt.step({"w": g2})
    m = 0.9 * 0.1 * g1 + 0.1 * g2
    v = 0.98 * 0.02 * g1 ** 2 + 0.02 * g2 ** 2
    mhat, vhat = m / (1 - 0.9 ** 2), v / (1 - 0.98 ** 2)
    expected = p1 - 0.1 * mhat / (np.sqrt(vhat) + 1e-8)
    np.testing.assert_allclose(p["w"], expected, rtol=1e-14)


def test_adam_matches_torch():
    torch = pytest.importorskip("torch", reason="PyTorch is optional; it is only a reference")
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal((3, 4))
    p = {"w": w0.copy()}
    opt = Adam(p, lr=1e-2, betas=(0.9, 0.98))
    wt = torch.tensor(w0, requires_grad=True)
    topt = torch.optim.Adam([wt], lr=1e-2, betas=(0.9, 0.98), eps=1e-8)
    for _ in range(5):
        g = rng.standard_normal((3, 4))
        opt.step({"w": g})
        wt.grad = torch.from_numpy(g.copy())
        topt.step()
    np.testing.assert_allclose(p["w"], wt.detach().numpy(), rtol=1e-12, atol=1e-14)


def test_warmup_schedule():
    assert [warmup_lr(t, 1e-3, 4) for t in (1, 2, 3, 4, 10)] == [2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3]
    assert warmup_lr(1, 1e-3, 0) == 1e-3                       # no warm-up
    assert np.isclose(warmup_lr(16, 1e-3, 4, "inv_sqrt"), 1e-3 * 0.5)
    with pytest.raises(ValueError, match="t"):
        warmup_lr(0, 1e-3, 4)


def test_clip_grad_norm():
    g = {"a": np.array([3.0, 0.0]), "b": np.array([[4.0]])}
    assert global_norm(g) == 5.0
    assert clip_grad_norm(g, 1.0) == 5.0
    assert np.isclose(global_norm(g), 1.0, rtol=1e-6)
    np.testing.assert_allclose(g["a"], [0.6, 0.0], rtol=1e-6)
    h = {"a": np.array([0.3, 0.4])}
    assert clip_grad_norm(h, 1.0) == 0.5 and np.array_equal(h["a"], [0.3, 0.4])   # under the limit
    assert clip_grad_norm(h, None) == 0.5
