"""taiji.LinkMatrix, Peer.measure_links / links, optimize_topology and predict_allreduce
(include/taiji/links.h)."""
import math

import numpy as np
import pytest

import taiji

MIB = 1 << 20
FAST = 1e10   # bytes/s
SLOW = FAST / 100
LAT = 1e-5    # seconds


def _four_ranks(slow_links=((0, 1), (2, 3))):
    bw = [[0.0 if s == d else FAST for d in range(4)] for s in range(4)]
    for s, d in slow_links:
        bw[s][d] = SLOW
    lat = [[0.0 if s == d else LAT for d in range(4)] for s in range(4)]
    return bw, lat


def _ring_over(order):
    """The measured ring over `order` as links.h's optimiser builds it (ring_over): pair k
    reduces along order[k+1] -> ... -> order[k] and broadcasts along
    order[k] -> ... -> order[k-1]; with order 0..n-1 it is the built-in ring."""
    n = len(order)
    reduce_parents, broadcast_parents = [], []
    for k in range(n):
        red, bc = [0] * n, [0] * n
        red[order[k]] = bc[order[k]] = -1
        for j in range(1, n):
            red[order[(k + j) % n]] = order[(k + j + 1) % n]
            bc[order[(k + j) % n]] = order[(k + j - 1) % n]
        reduce_parents.append(red)
        broadcast_parents.append(bc)
    return taiji.Topology.from_parents(n, reduce_parents, broadcast_parents)


# --- matrices --------------------------------------------------------------------------

def test_from_lists_round_trip():
    bw = [[0.0, 1.5e9, 2.25e9], [3.125e8, 0.0, 7e10], [1.0, 0.1, 0.0]]
    lat = [[0.0, 1e-6, 2.5e-5], [3e-4, 0.0, 1.75e-3], [0.125, 9.5e-6, 0.0]]
    with taiji.LinkMatrix.from_lists(bw, lat) as m:
        assert m.size == 3 and len(m) == 3
        assert m.bandwidth_rows() == bw
        assert m.latency_rows() == lat
        assert m.bandwidth(1, 2) == 7e10 and m.latency(2, 0) == 0.125
        assert m.bandwidth(0, 0) == 0.0 and m.latency(1, 1) == 0.0
        with pytest.raises(IndexError):
            m.bandwidth(0, 3)
        with pytest.raises(IndexError):
            m.latency(-1, 0)
        assert m == taiji.LinkMatrix.from_lists(bw, lat)
        assert m != taiji.LinkMatrix.from_lists(bw)
    assert m.closed
    with pytest.raises(ValueError):
        m.bandwidth_rows()
    m.close()  # idempotent


def test_from_lists_numpy_no_latency_and_diagonal():
    bw = np.array([[5.0, 2e9], [4e9, 6.0]])
    m = taiji.LinkMatrix.from_lists(bw)
    # The diagonal is always stored as 0; latency None is all 0.
    assert m.bandwidth_rows() == [[0.0, 2e9], [4e9, 0.0]]
    assert m.latency_rows() == [[0.0, 0.0], [0.0, 0.0]]
    one = taiji.LinkMatrix.from_lists(np.zeros((1, 1), np.float32), np.zeros((1, 1)))
    assert one.size == 1 and one.bandwidth_rows() == [[0.0]]


@pytest.mark.parametrize("bw, lat, words", [
    ([[0, 1], [1]], None, "row 1 has 1 entries"),
    ([[0, 1, 2], [1, 0, 2]], None, "row 0 has 3 entries"),
    (np.zeros((2, 3)), None, "shape (2, 3)"),
    ([], None, "at least 1 rank"),
    (np.zeros((0, 0)), None, "at least 1 rank"),
    ([[0, -1], [1, 0]], None, "bandwidth[0][1] is -1.0"),
    ([[0, 1], [float("nan"), 0]], None, "bandwidth[1][0] is nan"),
    ([[0, 1], [float("inf"), 0]], None, "bandwidth[1][0] is inf"),
    ([[0, 1], [1, 0]], [[0, 1e-6], [-1e-6, 0]], "latency[1][0] is -1e-06"),
    ([[0, 1], [1, 0]], [[0, 1e-6], [math.nan, 0]], "latency[1][0] is nan"),
    ([[0, 1], [1, 0]], [[0]], "latency is 1 x 1, bandwidth 2 x 2"),
])
def test_from_lists_bad_input(bw, lat, words):
    with pytest.raises(taiji.InvalidArgument) as info:
        taiji.LinkMatrix.from_lists(bw, lat)
    assert info.value.status == -1
    assert words in info.value.message


def test_from_lists_bad_types():
    with pytest.raises(TypeError):
        taiji.LinkMatrix.from_lists([[0, "1"], [1, 0]])
    with pytest.raises(TypeError):
        taiji.LinkMatrix.from_lists(3.0)
    with pytest.raises(TypeError):
        taiji.LinkMatrix.from_lists([[0, True], [1, 0]])


# --- the optimiser -----------------------------------------------------------------------

def test_optimize_avoids_slow_links():
    bw, lat = _four_ranks()
    m = taiji.LinkMatrix.from_lists(bw, lat)
    ring = taiji.Topology.from_text("ring", size=4)
    best, explanation = taiji.optimize_topology(m, bytes=16 * MIB)
    assert best.size == 4
    ring_s = taiji.predict_allreduce(ring, m, 16 * MIB)
    best_s = taiji.predict_allreduce(best, m, 16 * MIB)
    assert 0 < best_s * 1.5 <= ring_s, (best_s, ring_s, explanation)
    # The only rings that avoid 0->1 and 2->3 are 0,2,1,3 / 0,3,1,2 / 0,3,2,1 (as cycles
    # from 0); with equal latencies the header's tie-break (smallest order) picks 0,2,1,3.
    assert best.text == _ring_over([0, 2, 1, 3]).text, explanation
    assert _ring_over([0, 1, 2, 3]).text == ring.text  # the helper builds what taiji does
    # On those links it is exactly as fast as the built-in ring on uniform links.
    uniform = taiji.LinkMatrix.from_lists(*_four_ranks(slow_links=()))
    assert best_s == pytest.approx(taiji.predict_allreduce(ring, uniform, 16 * MIB), rel=1e-12)
    # One line naming the winner first, then the others.
    assert explanation and "\n" not in explanation
    assert explanation.startswith(f"measured_ring {best_s:.3g} s ("), (explanation, best_s)
    assert f"for {16 * MIB} B; next: " in explanation, explanation


def test_optimize_defaults_and_explanation_is_deterministic():
    bw, lat = _four_ranks()
    m = taiji.LinkMatrix.from_lists(bw, lat)
    a, ea = taiji.optimize_topology(m)              # 16 MiB by default
    b, eb = taiji.optimize_topology(m, bytes=16 * MIB, chunk_bytes=MIB)
    assert a.text == b.text and ea == eb and ea


def test_predict_and_optimize_bad_arguments():
    m3 = taiji.LinkMatrix.from_lists([[0, 1e9, 1e9], [1e9, 0, 1e9], [1e9, 1e9, 0]])
    ring4 = taiji.Topology.from_text("ring", size=4)
    with pytest.raises(taiji.InvalidArgument) as info:
        taiji.predict_allreduce(ring4, m3, MIB)
    assert "4 ranks" in info.value.message and "matrix 3" in info.value.message
    with pytest.raises(taiji.InvalidArgument):
        taiji.optimize_topology(m3, bytes=-1)
    with pytest.raises(TypeError):
        taiji.optimize_topology([[0, 1], [1, 0]])
    with pytest.raises(TypeError):
        taiji.predict_allreduce("ring", m3, MIB)
    ring3 = taiji.Topology.from_text("ring", size=3)
    assert taiji.predict_allreduce(ring3, m3, 0) >= 0
    m3.close()
    with pytest.raises(ValueError):
        taiji.predict_allreduce(ring3, m3, MIB)


# --- real peers --------------------------------------------------------------------------

def _measure_and_use():
    with peer(timeout_ms=30000) as p:
        before = p.links()
        m = p.measure_links(probe_bytes=1 << 20)
        kept = p.links()
        t, explanation = taiji.optimize_topology(m, peer=p)
        try:
            taiji.optimize_topology(taiji.LinkMatrix.from_lists([[0, 1], [1, 0]]), peer=p)
            wrong_size = None
        except taiji.InvalidArgument as e:
            wrong_size = e.message
        p.set_topology(t)
        x = np.arange(1000, dtype=np.int64) * (RANK + 1)
        total = p.allreduce(x, "links.sum")
        emit({"bw": m.bandwidth_rows(), "lat": m.latency_rows(), "size": m.size,
              "before": before is None,
              "kept": [kept.bandwidth_rows(), kept.latency_rows()] if kept else None,
              "text": t.text, "topology_size": t.size, "explanation": explanation,
              "wrong_size": wrong_size,
              "sum_ok": bool((total == np.arange(1000, dtype=np.int64) * 6).all())})


def test_measure_links_on_real_peers(run_peers):
    results = run_peers(_measure_and_use, 3, timeout=90)
    got = [r.results[0] for r in results]
    first = got[0]
    assert first["size"] == 3
    for g in got:
        assert g["bw"] == first["bw"] and g["lat"] == first["lat"]  # the identical matrix
        assert g["before"] is True
        assert g["kept"] == [g["bw"], g["lat"]]
        assert g["text"] == first["text"] and g["explanation"] == first["explanation"]
        assert g["topology_size"] == 3
        assert g["wrong_size"] and "2 ranks" in g["wrong_size"], g["wrong_size"]
        assert g["sum_ok"] is True
    for s in range(3):
        for d in range(3):
            if s == d:
                assert first["bw"][s][d] == 0.0 and first["lat"][s][d] == 0.0
            else:
                assert first["bw"][s][d] > 0, first["bw"]
                assert first["lat"][s][d] > 0, first["lat"]
                assert math.isfinite(first["bw"][s][d]) and math.isfinite(first["lat"][s][d])
    assert first["explanation"]
    # The topology computed is one taiji can read back as text for 3 ranks.
    assert taiji.Topology.from_text(first["text"], size=3).text == first["text"]


def _bad_options():
    out = {}
    with peer(timeout_ms=20000) as p:
        for key, kwargs in [("big", {"probe_bytes": 2 ** 31}),
                            ("rounds", {"latency_rounds": 101}),
                            ("bw_rounds", {"bandwidth_rounds": -1}),
                            ("timeout", {"timeout_ms": -5}),
                            ("negative", {"probe_bytes": -1}),
                            ("wide", {"latency_rounds": 2 ** 32 + 5})]:
            try:
                p.measure_links(**kwargs)
                out[key] = None
            except taiji.TaijiError as e:
                out[key] = [type(e).__name__, e.message]
        # Nothing was posted: the peer still runs ops, and has no matrix.
        out["links"] = p.links() is None
        out["sum"] = p.allreduce(np.array([RANK + 1], np.int64), "after").tolist()
    emit(out)


def test_measure_links_bad_options(run_peers):
    results = run_peers(_bad_options, 2, timeout=60)
    for r in results:
        out = r.results[0]
        assert out["big"][0] == "InvalidArgument", out
        assert "probe_bytes" in out["big"][1] and str(2 ** 31) in out["big"][1], out
        assert out["rounds"][0] == "InvalidArgument" and "rounds" in out["rounds"][1], out
        assert out["bw_rounds"][0] == "InvalidArgument", out
        assert out["timeout"][0] == "InvalidArgument" and "timeout" in out["timeout"][1], out
        assert out["negative"][0] == "InvalidArgument" and "probe_bytes" in out["negative"][1]
        assert out["wide"][0] == "InvalidArgument" and "latency_rounds" in out["wide"][1]
        assert out["links"] is True
        assert out["sum"] == [3]


def test_measure_links_with_background_probes_from_the_start(run_peers):
    # A background probe is due at once (a rate of 1 byte per second allows one probe,
    # then none for days); it must wait for the links, and then not disturb the probes
    # and ops that follow.
    results = run_peers(_measure_and_use, 3, timeout=90, env={"TAIJI_LINK_PROBE_RATE": "1"})
    got = [r.results[0] for r in results]
    for g in got:
        assert g["bw"] == got[0]["bw"] and g["sum_ok"] is True
