"""Rough edges a new user met: attribute values past int64, a failed huge
op's numpy(), download-only layouts on upload and load, Fill of a
non-integral value into an integer dtype, and closing a session the daemon
no longer has."""
import time
import warnings

import numpy as np
import pytest

import paradev
from conftest import NDEV


def test_attribute_ranges(sess):
    i = sess.upload(np.arange(3, dtype=np.int32), paradev.mirrored())
    with pytest.raises(ValueError, match=r"OneHot: attribute depth: "
                       r"1180591620717411303424 is out of range; expected "
                       r"an integer from -2\*\*63 to 2\*\*63-1"):
        sess.ops.OneHot(i, depth=2 ** 70)
    with pytest.raises(ValueError, match=r"RandomNormal: attribute seed: "
                       r"18446744073709551616 is out of range"):
        sess.ops.RandomNormal(shape=(2,), seed=2 ** 64)
    with pytest.raises(ValueError, match=r"Fill: attribute shape: .* out of "
                       r"range"):
        sess.ops.Fill(shape=(2 ** 63,), value=1.0)
    with pytest.raises(ValueError, match=r"Fill: attribute value: .* out of "
                       r"range; expected a float64"):
        sess.ops.Fill(shape=(2,), value=10 ** 400)
    with pytest.raises(TypeError, match=r"OneHot: attribute depth: expected "
                       r"an integer, got 2.5"):
        sess.ops.OneHot(i, depth=2.5)
    got = sess.ops.OneHot(i, depth=3).numpy(paradev.mirrored())
    np.testing.assert_array_equal(got, np.eye(3, dtype=np.float32))


def test_fill_value_of_the_dtype(sess):
    with pytest.raises(ValueError, match=r"Fill: value=3.7 is not an integer "
                       r"but dtype is int32 \(it would become 3\)"):
        sess.ops.Fill(shape=(2,), value=3.7, dtype=np.int32)
    with pytest.raises(ValueError, match="dtype is bool"):
        sess.ops.Fill(shape=(2,), value=0.5, dtype=np.bool_)
    got = sess.ops.Fill(shape=(2,), value=3.0, dtype=np.int32)
    assert got.numpy(paradev.mirrored()).tolist() == [3, 3]
    got = sess.ops.Fill(shape=(2,), value=3.7)  # float32: as given
    np.testing.assert_array_equal(got.numpy(paradev.mirrored()),
                                  np.full(2, 3.7, np.float32))


def test_numpy_of_a_failed_huge_op_raises_its_error(sess):
    t = sess.ops.Fill(shape=(1 << 17, 1 << 17), value=1.0)  # 64 GiB
    for read in (lambda: t.numpy(paradev.mirrored()),
                 lambda: t.numpy(paradev.concat(0)),
                 lambda: t.numpy(paradev.per_component())):
        with pytest.raises(paradev.ResourceExhausted, match="out of memory"):
            read()
    assert sess.upload([1.5], paradev.mirrored()).numpy(
        paradev.mirrored()).tolist() == [1.5]


def test_download_layouts_refused_where_values_are_placed(sess, daemon):
    np.save(daemon.storage + "/edge.npy", np.arange(6.0).reshape(NDEV, 2))
    for lay in (paradev.concat(0), paradev.component(0)):
        with pytest.raises(ValueError, match=r"load: layout: paradev\.\w+"
                           r"\(0\) is for downloads"):
            sess.load("edge.npy", layout=lay)
        with pytest.raises(ValueError, match=r"load: layout of 'w': .* is "
                           "for downloads"):
            sess.load("edge.npy", None, {"w": lay})
        with pytest.raises(ValueError, match=r"upload: .* is for downloads"):
            sess.upload(np.ones((NDEV, 2)), lay)
    assert repr(paradev.concat(1)) == "paradev.concat(1)"
    t = sess.load("edge.npy", layout=paradev.sharded(0))[""]
    np.testing.assert_array_equal(t.numpy(paradev.concat(0)),
                                  np.arange(6.0).reshape(NDEV, 2))


def _lose(client):
    """A session whose lease runs out (no keep-alive): the daemon drops it,
    as a restarted daemon would not know it. Each look renews a lease still
    running, so the pauses grow past the lease and the daemon's sweep."""
    s = client.session("lost", lease_s=1, keep_alive=False)
    for pause in (1.5, 3, 6, 12, 24):
        time.sleep(pause)
        try:
            s.keep_alive()
        except paradev.NotFound:
            return s
    pytest.fail("the daemon kept a session past its lease")


def test_close_of_a_session_the_daemon_lost(client):
    s = _lose(client)
    with pytest.warns(RuntimeWarning, match="'lost' was already gone"):
        with s:
            pass
    assert s.closed
    s = _lose(client)
    with pytest.raises(paradev.NotFound):
        s.close()  # an explicit close says so
    s = _lose(client)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(KeyError):  # the block's own error, nothing else
            with s:
                raise KeyError("mine")
