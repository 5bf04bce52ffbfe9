"""The digits MLP the synchronisation-mode tests train, imported by the ranks run_peers
starts (their ARGS carry this folder). Every rank builds the same model from one seed and
takes its slice of the same global batch each step, so runs differ only by their mode."""
import hashlib
import pathlib
import sys

import torch

SEED = 1234
GLOBAL_BATCH = 64
LR = 0.05
MOMENTUM = 0.9


def load_data():
    """The example's split (examples/adaptive_digits.py), so tests and example agree."""
    examples = str(pathlib.Path(__file__).resolve().parents[2] / "examples")
    if examples not in sys.path:
        sys.path.insert(0, examples)
    from adaptive_digits import load_data as example_data
    return example_data()


def make_model():
    torch.manual_seed(SEED)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                               torch.nn.Linear(128, 10))


def make_sgd(model, lr=LR, momentum=MOMENTUM):
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)


def steps_per_epoch(x):
    return len(x) // GLOBAL_BATCH


def batch(x, y, step, rank, size):
    """This rank's slice of the global batch of ``step`` (a fixed permutation per epoch)."""
    epoch, i = divmod(step, steps_per_epoch(x))
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(SEED * 1000 + epoch))
    idx = order[i * GLOBAL_BATCH:(i + 1) * GLOBAL_BATCH][rank::size]
    return x[idx], y[idx]


def train_steps(model, opt, data, first, count, rank, size, before_step=None):
    x, y = data[0], data[1]
    loss_fn = torch.nn.CrossEntropyLoss()
    for step in range(first, first + count):
        if before_step is not None:
            before_step(step)
        bx, by = batch(x, y, step, rank, size)
        opt.zero_grad()
        loss_fn(model(bx), by).backward()
        opt.step()


def accuracy(model, data):
    with torch.no_grad():
        return (model(data[2]).argmax(1) == data[3]).float().mean().item()


def digest(model, opt=None):
    """sha256 of the parameters' bytes (and of the optimizer's tensors, with ``opt``)."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    if opt is not None:
        for p in model.parameters():
            for key, v in sorted(opt.state.get(p, {}).items()):
                if torch.is_tensor(v):
                    h.update(key.encode() + v.numpy().tobytes())
    return h.hexdigest()
