"""The textbook statements the optimizer proofs compare against, checked against PyTorch's
``torch.optim`` (a third implementation) from a random state, so a slip in transcribing a paper
cannot make a wrong stated update "proven".

PyTorch is an optional extra (``pip install .[torch]``); without it this module is reported as
skipped with the reason, never silently. Adagrad and RMSprop run with eps = 0, because PyTorch
adds eps outside the root (the project, after Ruder 2016, inside it): with eps = 0 both agree,
which checks the accumulators and the rate; the eps placement is the project's contract.
"""
import numpy as np
import pytest

import spec
from spec.optimizer_proofs import TEXTBOOK

torch = pytest.importorskip("torch", reason="PyTorch is optional: pip install '.[torch]'")

# float64 throughout; each side does a handful of roundings on values of order 1 (eps >= 1e-3,
# accumulators >= 0.1): 1e-13 relative is ~500 ulp of room, far below any slip (>= 1e-3).
RTOL = 1e-13


def _draw(seed):
    rng = np.random.default_rng(seed)
    n = 5
    return rng, rng.uniform(-2, 2, n), rng.uniform(-2, 2, n)


def _textbook_step(name, theta, g, t, state, **hyper):
    book = TEXTBOOK[name]
    return book.step(theta, g, t, state, sqrt=np.sqrt, **hyper)


def _torch_step(cls, theta, g, seed_state, **kwargs):
    p = torch.nn.Parameter(torch.tensor(theta, dtype=torch.float64))
    opt = cls([p], **kwargs)
    opt.state[p].update({k: (v if isinstance(v, torch.Tensor) else
                             torch.tensor(v, dtype=torch.float64)) for k, v in seed_state.items()})
    p.grad = torch.tensor(g, dtype=torch.float64)
    opt.step()
    return p.detach().numpy(), opt.state[p]


@pytest.mark.parametrize("seed", range(4))
def test_adam_and_adamw_match_torch(seed):
    rng, theta, g = _draw(seed)
    m, v = rng.uniform(-1, 1, 5), rng.uniform(0.1, 2, 5)
    t0 = int(rng.integers(1, 40))                  # steps already taken; this is step t0 + 1
    lr, b1, b2, eps, lam = 0.05, 0.8, 0.95, 1e-3, 0.1
    state = {"step": torch.tensor(float(t0)), "exp_avg": torch.tensor(m),
             "exp_avg_sq": torch.tensor(v)}
    got, st = _torch_step(torch.optim.Adam, theta, g, state, lr=lr, betas=(b1, b2), eps=eps)
    want, book = _textbook_step("Adam", theta, g, t0 + 1, {"m": m, "v": v}, alpha=lr, beta_1=b1,
                                beta_2=b2, epsilon=eps)
    np.testing.assert_allclose(got, want, rtol=RTOL)
    np.testing.assert_allclose(st["exp_avg_sq"].numpy(), book["v"], rtol=RTOL)
    state = {"step": torch.tensor(float(t0)), "exp_avg": torch.tensor(m),
             "exp_avg_sq": torch.tensor(v)}
    got, _ = _torch_step(torch.optim.AdamW, theta, g, state, lr=lr, betas=(b1, b2), eps=eps,
                         weight_decay=lam)
    want, _ = _textbook_step("AdamW", theta, g, t0 + 1, {"m": m, "v": v}, gamma=lr, beta_1=b1,
                             beta_2=b2, epsilon=eps, lam=lam)
    np.testing.assert_allclose(got, want, rtol=RTOL)


@pytest.mark.parametrize("seed", range(4))
def test_sgd_and_dampened_momentum_match_torch(seed):
    rng, theta, g = _draw(seed)
    b = rng.uniform(-1, 1, 5)
    got, _ = _torch_step(torch.optim.SGD, theta, g, {}, lr=0.1)
    want, _ = _textbook_step("SGD", theta, g, 1, {}, gamma=0.1)
    np.testing.assert_allclose(got, want, rtol=RTOL)
    # a seeded momentum buffer puts PyTorch on its t > 1 branch: b = mu b + (1 - tau) g
    got, st = _torch_step(torch.optim.SGD, theta, g, {"momentum_buffer": torch.tensor(b)},
                          lr=0.1, momentum=0.7, dampening=0.7)
    want, book = _textbook_step("Momentum", theta, g, 2, {"b": b}, gamma=0.1, mu=0.7)
    np.testing.assert_allclose(got, want, rtol=RTOL)
    np.testing.assert_allclose(st["momentum_buffer"].numpy(), book["b"], rtol=RTOL)


@pytest.mark.parametrize("seed", range(4))
def test_adagrad_and_rmsprop_accumulators_match_torch(seed):
    rng, theta, g = _draw(seed)
    acc = rng.uniform(0.1, 2, 5)
    got, _ = _torch_step(torch.optim.Adagrad, theta, g,
                         {"sum": torch.tensor(acc), "step": torch.tensor(3.0)}, lr=0.1, eps=0.0)
    want, _ = _textbook_step("Adagrad", theta, g, 4, {"G": acc}, eta=0.1, epsilon=0.0)
    np.testing.assert_allclose(got, want, rtol=RTOL)
    got, _ = _torch_step(torch.optim.RMSprop, theta, g,
                         {"square_avg": torch.tensor(acc), "step": torch.tensor(3.0)}, lr=0.01,
                         alpha=0.9, eps=0.0)
    want, _ = _textbook_step("RMSprop", theta, g, 4, {"Eg2": acc}, eta=0.01, gamma=0.9,
                             epsilon=0.0)
    np.testing.assert_allclose(got, want, rtol=RTOL)


@pytest.mark.parametrize("seed", range(4))
def test_nag_engine_form_is_torch_nesterov(seed):
    """PyTorch's SGD(nesterov=True) is the engine's shifted form with buffer = v / lr:
    buf = mu buf + g, w -= lr (g + mu buf)."""
    rng, theta, g = _draw(seed)
    v = rng.uniform(-1, 1, 5)
    lr, beta = 0.05, 0.9
    got, st = _torch_step(torch.optim.SGD, theta, g, {"momentum_buffer": torch.tensor(v / lr)},
                          lr=lr, momentum=beta, nesterov=True)
    w_new, s_new = spec.engine_step("NAG", theta, g, {"v": v}, 2, lr=lr, beta=beta)
    np.testing.assert_allclose(got, np.asarray(w_new, dtype=float), rtol=RTOL)
    np.testing.assert_allclose(st["momentum_buffer"].numpy() * lr,
                               np.asarray(s_new["v"], dtype=float), rtol=RTOL)
