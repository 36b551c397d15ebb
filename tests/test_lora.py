"""LoRA fine-tuning (swarmjax.lora, models.from_nnx(trainable=nnx.LoRAParam),
experiments.lora): the adapters are the only parameters the engine sees, the frozen base is
never changed or noised, the adapters are clipped and noised as DP-FedAvg's plan says, the
simulator and the Flower runtime agree, the experiment's record and ledger say what is
public and what is private, and bad input is one line before any work. Tiny sizes."""

from __future__ import annotations

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from swarmjax import lora
from swarmjax.fl.algorithms import registry
from swarmjax.fl.client.training import LocalTraining
from swarmjax.fl.data import stack_clients
from swarmjax.fl.protocol import RunSpec, Variants
from swarmjax.fl.runtime import simulate
from swarmjax.models import param_count
from swarmjax.privacy.secret import Secret
from tests.secret_keys import MadeKeys, check_randomness_stated

CONFIG = lora.TransformerConfig(
    vocab_size=12, sequence_length=8, d_model=16, heads=2, layers=1, mlp=32
)
SECRET = Secret.from_bytes(b"swarmjax lora tests: 32 bytes!!!")
CLIENTS, ROWS = 6, 12
LAYERS = ("q", "v", "up", "head")


def base_params(seed: int = 0) -> dict:
    """A random base of CONFIG (what pretraining would give)."""
    module = lora.CausalTransformer(CONFIG, rngs=nnx.Rngs(seed))
    return jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(module, nnx.Param)))


def toy_clients(seed: int = 0):
    """CLIENTS clients of ROWS windows each: a repeating pattern shifted per client, so
    there is something to learn; and a test set of 40 windows."""
    rng = np.random.default_rng(seed)
    start = rng.integers(0, CONFIG.vocab_size, CLIENTS * ROWS + 40)
    pos = np.arange(CONFIG.sequence_length + 1)
    seq = (start[:, None] + pos[None]) % CONFIG.vocab_size
    x, y = seq[:, :-1].astype(np.float32), seq[:, -1].astype(np.int32)
    n = CLIENTS * ROWS
    indices = np.split(np.arange(n), CLIENTS)
    return stack_clients(x[:n], y[:n], indices), (jnp.asarray(x[n:]), jnp.asarray(y[n:]))


@pytest.fixture(scope="module")
def base():
    return base_params()


@functools.cache
def shared_model():
    """Rank-4 adapters on the query, value, MLP-up and output layers of the base of seed 0:
    one object, so every test's DP-FedAvg (equal algorithms: one static jit argument)
    compiles its round once."""
    return lora.lora_transformer(CONFIG, base_params(), rank=4, layers=LAYERS)


@pytest.fixture(scope="module")
def data():
    return toy_clients()


def dp_fedavg(model, clients, *, epsilon=4.0, rounds=1, learning_rate=0.5, clip=0.1):
    """Registry-built user-level DP-FedAvg (fixed clipping), expected cohort 3 of 6."""
    spec = RunSpec(rounds=rounds, delta=1e-3, accountant="rdp")
    run = registry.CrossDeviceRun(
        model,
        CLIENTS,
        3,
        spec,
        LocalTraining(batch_size=4),
        epsilon=epsilon,
        learning_rate=learning_rate,
        server_lr=1.0,
        clip=clip,
    )
    alg, grid = registry.cross_device("dp-fedavg", run)
    return alg, Variants.grid(alg, clients, spec, **grid)


def test_adapters_are_the_parameters_and_the_base_is_fixed_state(base):
    model = lora.lora_transformer(CONFIG, base, rank=2, layers=("q", "v", "head"))
    adapters = model.init(jax.random.key(0))
    names = {
        "/".join(str(k.key) for k in path)
        for path, _ in jax.tree_util.tree_flatten_with_path(adapters)[0]
    }
    assert names == {
        "blocks/0/q/lora/lora_a",
        "blocks/0/q/lora/lora_b",
        "blocks/0/v/lora/lora_a",
        "blocks/0/v/lora/lora_b",
        "head/lora/lora_a",
        "head/lora/lora_b",
    }
    d, v = CONFIG.d_model, CONFIG.vocab_size
    assert param_count(adapters) == 2 * (2 * (d + d)) + 2 * (d + v)
    assert param_count(adapters) == lora.describe(CONFIG, 2, ("q", "v", "head"))["adapter_params"]
    # different keys: different A, B starts at zero, so the adapted model starts as the base
    other = model.init(jax.random.key(1))
    assert not np.allclose(adapters["head"]["lora"]["lora_a"], other["head"]["lora"]["lora_a"])
    assert not np.any(adapters["head"]["lora"]["lora_b"])
    plain = lora.full_transformer(CONFIG, base)
    x = toy_clients()[1][0][:5]
    np.testing.assert_allclose(
        model.apply(adapters, x), plain.apply(plain.init(jax.random.key(0)), x), atol=1e-6
    )
    # the base lives in apply's fixed state, equal to what was given
    fixed = model.apply.fixed
    np.testing.assert_array_equal(
        fixed["blocks"][0]["q"]["kernel"], base["blocks"][0]["q"]["kernel"]
    )
    np.testing.assert_array_equal(fixed["head"]["kernel"], base["head"]["kernel"])


def test_base_never_changes_and_only_the_adapters_are_noised(base, data):
    clients, test = data
    before = jax.tree.map(np.array, base)
    model = shared_model()
    alg, variants = dp_fedavg(model, clients)
    res = simulate(alg, clients, test, variants, secret=SECRET)
    # the server state holds the adapters only: nothing base-sized was ever trained or noised
    server = jax.tree.map(lambda a: a[0], res.server.params)
    assert jax.tree.structure(server) == jax.tree.structure(model.init(jax.random.key(0)))
    assert param_count(server) == lora.describe(CONFIG, 4, LAYERS)["adapter_params"]
    assert np.all(np.isfinite(res.privacy.final_epsilon)) and res.privacy.unit == "client"
    # the base given, and the base the model runs on, are bit for bit what they were
    jax.tree.map(np.testing.assert_array_equal, base, before)
    fixed = {k: v for k, v in model.apply.fixed.items()}
    for path, leaf in jax.tree_util.tree_flatten_with_path(before)[0]:
        node = fixed
        for k in path:
            node = node[k.key]
        np.testing.assert_array_equal(np.asarray(node), leaf)
    # the adapters moved (trained and noised); with B zeroed again the model is the base
    assert np.any(server["blocks"][0]["q"]["lora"]["lora_b"])
    zeroed = jax.tree_util.tree_map_with_path(
        lambda p, a: jnp.zeros_like(a) if p[-1].key == "lora_b" else a, server
    )
    plain = lora.full_transformer(CONFIG, base)
    np.testing.assert_allclose(
        model.apply(zeroed, test[0]), plain.apply(plain.init(jax.random.key(0)), test[0]), atol=1e-6
    )


def test_adapter_updates_are_clipped_and_the_sum_noised_as_the_plan_says(base, data):
    clients, test = data
    model = shared_model()
    clip = 0.05
    # clipping: one client's reply after a large local step has norm exactly the clip
    alg, variants = dp_fedavg(model, clients, learning_rate=5.0, clip=clip)
    ex = alg.exchanges[0]
    hyper = jax.tree.map(lambda a: a[0], variants.hyper)
    server = alg.server_init(jax.random.key(0), hyper)
    one = jax.tree.map(lambda a: a[0], clients)
    state = alg.client_init(jax.random.key(1), one, hyper, 0)
    _, reply = jax.jit(ex.client)(state, one, ex.request(server), jax.random.key(2), hyper)
    norm = float(jnp.sqrt(sum(jnp.sum(a**2) for a in jax.tree.leaves(reply.update))))
    assert norm == pytest.approx(clip, rel=1e-4)
    # noise: with a zero client learning rate every update is zero, so one round moves the
    # adapters by the noise alone: std z C / (q N) per coordinate (server lr 1)
    alg, variants = dp_fedavg(model, clients, learning_rate=1e-12, clip=clip)
    res = simulate(alg, clients, test, variants, secret=SECRET)
    # every B starts at zero, so after the round it holds the noise alone
    moved = np.concatenate(
        [np.ravel(res.server.params["blocks"][0][n]["lora"]["lora_b"][0]) for n in ("q", "v", "up")]
        + [np.ravel(res.server.params["head"]["lora"]["lora_b"][0])]
    )
    z = float(np.max(res.privacy.noise_multiplier))
    want = z * clip / 3.0  # q N = 3: the expected cohort
    assert z > 0 and moved.size == 4 * (16 + 16 + 32 + 12)
    assert np.std(moved) == pytest.approx(want, rel=0.15)
    assert abs(np.mean(moved)) < 4 * want / np.sqrt(moved.size)


def lora_task(config: dict):
    """Flower task factory (``tests.test_lora:lora_task``): DP-FedAvg on LoRA adapters over
    the toy clients, reproducible secret, so the deployment draws the simulator's noise."""
    from swarmjax.fl.runtime.flower.task import stacked_task

    clients, test = toy_clients()
    alg, variants = dp_fedavg(shared_model(), clients, rounds=int(config["rounds"]))
    return stacked_task(alg, variants, clients, test, secret=SECRET)


def test_simulator_and_flower_runtime_give_the_same_numbers():
    pytest.importorskip("flwr", reason="the flower extra is not installed")
    from swarmjax.fl.runtime.flower.client import make_client_app
    from swarmjax.fl.runtime.flower.loopback import LoopbackGrid
    from swarmjax.fl.runtime.flower.server import ServerSettings, drive
    from swarmjax.fl.runtime.flower.task import load_task, simulate_task

    config = {"task": f"{__name__}:lora_task", "rounds": 1}
    grid = LoopbackGrid.with_partitions(make_client_app(), config, range(CLIENTS))
    task = load_task(config)
    flower = drive(grid, task, ServerSettings(join_timeout=2.0, reply_timeout=5.0))
    sim = simulate_task(task)
    got, want = flower.server.params, sim.server.params  # both: one run
    assert param_count(got) == lora.describe(CONFIG, 4, LAYERS)["adapter_params"]
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=0, atol=1e-6), got, want)
    for col in ("test_loss", "test_accuracy", "epsilon_max", "bytes_up"):
        np.testing.assert_allclose(flower.history[col], sim.history[col], rtol=1e-6, atol=1e-6)
    # what a client uploads is the adapters: bytes per client = 4 x adapter parameters
    assert flower.operator.messages["bytes_up"].max() == pytest.approx(
        4 * param_count(got), rel=0.05
    )


def test_bad_lora_settings_are_one_line_value_errors(base):
    with pytest.raises(ValueError, match=r"^lora rank 17 exceeds the layer blocks.0.q \(16 x 16\)"):
        lora.lora_transformer(CONFIG, base, rank=17, layers=("q",))
    with pytest.raises(ValueError, match=r"^lora layers: no layer named 'query'"):
        lora.lora_transformer(CONFIG, base, rank=2, layers=("query",))
    with pytest.raises(ValueError, match=r"^lora layers: no layer named 'blocks.3.q'"):
        lora.check_lora(CONFIG, 2, ("blocks.3.q",))
    wider = lora.TransformerConfig(12, 8, 32, 2, 1, 32)
    with pytest.raises(ValueError, match=r"^pretrained params do not match the model: .* shape"):
        lora.lora_transformer(wider, base, rank=2)
    with pytest.raises(
        ValueError, match=r"^pretrained params do not match the model \(2 missing.*lacks head/bias"
    ):
        lora.check_base_params(CONFIG, {k: v for k, v in base.items() if k != "head"})


def test_checkpoint_round_trip(base, tmp_path):
    path = lora.save_params(tmp_path / "b.npz", base, plays=["tempest"])
    params, meta = lora.load_params(path)
    lora.check_base_params(CONFIG, params)
    jax.tree.map(np.testing.assert_array_equal, params, base)
    assert meta == {"plays": ["tempest"]}


# ----------------------------------------------------------------- the experiment


def _run(argv, capsys):
    from experiments import lora as experiment

    with pytest.raises(SystemExit) as exit_info:
        experiment.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    return exit_info.value.code, err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rank", "40"], "--rank: lora rank 40 exceeds the layer blocks.0.q (32 x 32)"),
        (["--lora-layers", "q", "attn"], "--lora-layers: lora layers: no layer named 'attn'"),
        (
            ["--public-plays", "tempest", "lear", "--private-plays", "lear"],
            "--public-plays and --private-plays overlap (lear)",
        ),
    ],
)
def test_experiment_refuses_bad_input_in_one_line(argv, message, capsys, tmp_path):
    code, err = _run(["--quick", "--out", str(tmp_path), *argv], capsys)
    assert code == 2 and len(err) == 1 and message in err[0], err
    assert not any(tmp_path.iterdir())  # before any work


def test_experiment_refuses_a_checkpoint_of_another_shape(capsys, tmp_path, base):
    path = lora.save_params(tmp_path / "mine.npz", base)  # CONFIG, not the quick model
    code, err = _run(["--quick", "--out", str(tmp_path / "o"), "--pretrained", str(path)], capsys)
    assert code == 2 and len(err) == 1
    assert "--pretrained" in err[0] and "do not match the model" in err[0]


@pytest.fixture
def plays(monkeypatch):
    from tests.conftest import shared_data_dir

    data_dir = shared_data_dir()
    if data_dir is None or not (data_dir / "shakespeare").is_dir():
        pytest.skip("the Shakespeare plays are not staged (../shared/data or $SWARMJAX_DATA)")
    monkeypatch.setenv("SWARMJAX_DATA", str(data_dir))
    return data_dir


def test_experiment_record_and_ledger_name_public_and_private(plays, tmp_path, capsys, monkeypatch):
    from experiments import lora as experiment

    argv = [
        "--quick",
        "--out",
        str(tmp_path),
        "--data-dir",
        str(plays),
        "--trainable",
        "lora",
        "--algorithms",
        "dp-fedavg",
        "--epsilons",
        "8",
        "--rounds",
        "1",
        "--pretrain-steps",
        "5",
        "--cohort",
        "4",
        "--windows-per-client",
        "4",
        "--test-size",
        "50",
        "--accountant",
        "rdp",
    ]
    made = MadeKeys(monkeypatch)
    experiment.main(argv)
    made.assert_not_compiled()  # no secret key a constant of a compiled program
    public, private = (
        experiment.PROFILES["quick"].public_plays,
        experiment.PROFILES["quick"].private_plays,
    )
    record = json.loads((tmp_path / "privacy.json").read_text())
    assert record["public"]["public_plays"] == list(public)
    assert record["private"]["plays"] == list(private)
    run = record["runs"]["dp-fedavg_lora_eps8"]
    assert all(p in run["public"] for p in public) and all(p in run["private"] for p in private)
    assert run["released"].startswith("the adapters") and run["epsilon"] <= 8 + 1e-6
    ledger = json.loads((tmp_path / "privacy_ledger.json").read_text())
    pre, *dp = ledger["releases"]
    assert pre["unit"] is None and pre["data"] == "shakespeare public plays"
    assert all(p in pre["variant"]["base"] for p in public)
    assert dp and all(r["unit"] == "client" and all(p in r["data"] for p in private) for r in dp)
    check_randomness_stated(ledger)
    assert all(
        "public plays" in r["variant"]["base"] and r["variant"]["trainable"] == "lora" for r in dp
    )
    summary = json.loads((tmp_path / "summary.json").read_text())
    row = summary["results"][0]
    assert row["bytes_up_per_client"] == 4 * summary["model"]["adapter_params"]
    assert (tmp_path / "accuracy_per_round.png").exists() and (
        tmp_path / "accuracy_vs_epsilon.png"
    ).exists()
    # a rerun reuses the cached pretrained base and the finished call
    capsys.readouterr()
    experiment.main(argv)
    out = capsys.readouterr().out
    assert "pretrained base reused" in out and "reused the finished call" in out
