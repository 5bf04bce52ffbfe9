"""Each synchronisation mode of taiji.torch.sync_modes trains the digits MLP on 4 ranks to
within 0.01 of BSP's accuracy, from the same seed and data split; and the rules mirrored
from src/adapt/sync_mode.h give the C core's numbers."""
import pathlib

import pytest

from taiji.torch import sync_rules

HERE = str(pathlib.Path(__file__).resolve().parent)

# (label, mode, options). BSP comes first: the others are compared with it.
CASES = [
    ("bsp", "bsp", {}),
    ("sma", "sma", {"alpha": 0.1}),
    ("local-constant", "local", {"period": 4}),
    ("local-qsr", "local", {"qsr_alpha": 0.1, "h_base": 2}),
    ("local-vote", "local", {"vote_delta": 0.05}),
    ("pair", "pair", {"seed": 5}),
]


def _train_each_mode():
    import sys
    import time
    sys.path.insert(0, ARGS["tests"])
    import sync_digits as sd
    import taiji.torch as ttorch

    ttorch.init()
    data = sd.load_data()
    epochs = ARGS["epochs"]
    steps = epochs * sd.steps_per_epoch(data[0])
    for label, mode, options in ARGS["cases"]:
        model = sd.make_model()
        opt = ttorch.SyncOptimizer(sd.make_sgd(model), mode, prefix=f"t.{label}", **options)
        start = time.monotonic()
        sd.train_steps(model, opt, data, 0, steps, RANK, SIZE)
        seconds = time.monotonic() - start
        trained = sd.digest(model)
        # The replicas of every mode but BSP differ: the model evaluated is their mean.
        opt.average_models()
        out = {"label": label, "accuracy": sd.accuracy(model, data), "seconds": seconds,
               "trained": trained, "mean": sd.digest(model)}
        if mode == "local":
            out["averagings"] = opt.impl.averagings
            out["period"] = opt.impl.period
        if mode == "pair":
            out["requests"] = opt.impl.requests
        emit(out)
    ttorch.shutdown()


def test_each_mode_reaches_bsp_accuracy(run_peers):
    cases = CASES
    results = run_peers(_train_each_mode, 4, timeout=150,
                        args={"tests": HERE, "epochs": 15, "cases": cases})
    by_label = [{r.results[i]["label"]: r.results[i] for i in range(len(cases))}
                for r in results]
    rank0 = by_label[0]
    steps = 15 * (1347 // 64)
    report = {k: (round(v["accuracy"], 4), round(v["seconds"], 2)) for k, v in rank0.items()}
    print("accuracy, seconds on rank 0:", report)
    bsp = rank0["bsp"]["accuracy"]
    assert bsp >= 0.9, report
    for label, _, _ in cases:
        # Every rank evaluates the same mean model.
        assert len({r[label]["mean"] for r in by_label}) == 1, label
        assert abs(rank0[label]["accuracy"] - bsp) <= 0.01, (label, report)
    # BSP's replicas never differ; the others' do until averaged.
    assert len({r["bsp"]["trained"] for r in by_label}) == 1
    assert len({r["sma"]["trained"] for r in by_label}) == 4
    # A constant period of 4 averages after steps 4, 8, ...; QSR at lr 0.05 and alpha 0.1
    # gives max(2, floor(2^2)) = 4 too; the vote averaged at least once and not every step.
    assert rank0["local-constant"]["averagings"] == steps // 4
    assert rank0["local-qsr"]["period"] == 4
    assert rank0["local-qsr"]["averagings"] == steps // 4
    votes = {r["local-vote"]["averagings"] for r in by_label}
    assert len(votes) == 1 and 0 < votes.pop() < steps
    assert all(r["pair"]["requests"] == steps for r in by_label)


def test_rules_match_the_c_core():
    assert sync_rules.parse_sync_mode("ASP") == "pair"
    with pytest.raises(ValueError):
        sync_rules.parse_sync_mode("ssp")
    assert sync_rules.lr_scale_for_switch("bsp", "pair", 4, "linear") == 0.25
    assert sync_rules.lr_scale_for_switch("local", "bsp", 8, "linear") == 8.0
    assert sync_rules.lr_scale_for_switch("sma", "pair", 4, "linear") == 1.0
    assert sync_rules.lr_scale_for_switch("bsp", "bsp", 4, "linear") == 1.0
    assert sync_rules.lr_scale_for_switch("bsp", "pair", 4) == 1.0
    assert sync_rules.lr_scale_for_switch("pair", "bsp", 4, "average") == 1.0
    assert sync_rules.momentum_scale_for_switch("bsp", "pair", 4) == 0.25
    with pytest.raises(ValueError):
        sync_rules.lr_scale_for_switch("bsp", "pair", 4, "sqrt")
    assert sync_rules.qsr_period(0.05, 0.1, 2) == 4
    assert sync_rules.qsr_period(0.01, 0.1, 2) == 100
    assert sync_rules.qsr_period(0.5, 0.1, 3) == 3
    assert sync_rules.qsr_period(0.0, 0.1, 0) == 1
    assert sync_rules.qsr_period(1e-300, 1.0, 1) == 10 ** 12
    assert sync_rules.momentum_after_switch(0.9, 0.25, 0, 10) == 0.225
    assert sync_rules.momentum_after_switch(0.9, 0.25, 5, 10) == pytest.approx(0.5625)
    assert sync_rules.momentum_after_switch(0.9, 0.25, 10, 10) == 0.9
    assert sync_rules.momentum_after_switch(0.9, 4.0, 0, 10) == 0.9
    assert sync_rules.momentum_after_switch(0.9, 0.25, 0, 0) == 0.9
