"""Bad command-line input, by class, on every experiment and benchmark script.

The classes (issue 39): an output folder that cannot be written; a data folder that exists
but holds no staged dataset, or an unreadable one; derived settings that do not hold; a run
whose estimated memory exceeds the machine's; options that do not apply to the chosen run;
and no message naming an option the user did not give.  Each case is one line on stderr
naming the option, exit status 2, before any work: the functions that do the work are
replaced by ones that fail, so a refusal that came late would show.  Benchmarks write
RESULTS.md only with ``--write``.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from benchmarks import (
    accelerator,
    cross_device_scaling,
    dpsgd_overhead,
    fed_round,
    flower_round,
    lora_memory,
    paaso_strategies,
    pso_throughput,
    scaling,
    secagg,
    vs_pfl,
)
from experiments import (
    _cli,
    apdim,
    combined_learning,
    cross_device,
    dp_fedavg,
    fed_dp_pso,
    fed_dp_pso_study,
    lora,
    paaso,
)
from tests.argv import refused

HUGE = "100000000"
# --seeds is checked after its seed list is built (a list of HUGE seeds took 29 CPU-seconds):
# a million seeds already asks for about 3e4 GiB, far beyond any machine that runs the suite.
MANY_SEEDS = "1000000"
OUT = ("--out", "<a fresh folder>")  # replaced by one under tmp_path


def _no_work(*args, **kwargs):
    raise AssertionError("work started before the arguments were checked")


@pytest.fixture(autouse=True)
def _forbid_work(monkeypatch, tmp_path):
    """Every script's work fails; the data folder defaults to an empty one."""
    for module, name in [
        (cross_device, "partition"),
        (cross_device, "simulate"),
        (dp_fedavg, "make_clients"),
        (dp_fedavg, "simulate"),
        (combined_learning, "run_setting"),
        (combined_learning, "run_central"),
        (apdim, "run_utility"),
        (fed_dp_pso, "run_dataset"),
        (fed_dp_pso_study, "_study_reading"),
        (paaso, "_setup_devices"),
        (pso_throughput, "measure"),
        (paaso_strategies, "measure"),
        (accelerator, "run"),
        (cross_device_scaling, "one"),
        (fed_round, "_setup"),
        (vs_pfl, "load_work"),
        (flower_round, "_simulator_round"),
    ]:
        monkeypatch.setattr(module, name, _no_work)
    monkeypatch.setattr(cross_device_scaling.subprocess, "run", _no_work)
    monkeypatch.setattr(scaling, "measure", _no_work)
    monkeypatch.setattr(scaling.subprocess, "run", _no_work)
    empty = tmp_path / "empty-data"
    empty.mkdir()
    monkeypatch.setenv("SWARMJAX_DATA", str(empty))


_refused = refused


def _out(argv: list[str], tmp_path: Path) -> list[str]:
    """``argv`` with the placeholder of :data:`OUT` replaced by a path under ``tmp_path``."""
    return [str(tmp_path / "out" / "o.json") if a is OUT[1] else a for a in argv]


@pytest.fixture
def blocked(tmp_path) -> str:
    """An --out that no one can create: its parent is a file."""
    (tmp_path / "file").write_text("")
    return str(tmp_path / "file" / "out")


# --- output folder ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "main",
    [cross_device.main, combined_learning.main, fed_dp_pso.main, fed_dp_pso_study.main],
    ids=["cross_device", "combined_learning", "fed_dp_pso", "fed_dp_pso_study"],
)
def test_unwritable_out(main, blocked, capsys):
    err = _refused(main, ["--quick", "--out", blocked], capsys)
    assert "--out" in err and "writable" in err


def test_paaso_refuses_its_out_before_jax_devices_are_set_up(blocked, capsys):
    assert "--out" in _refused(paaso.main, ["--quick", "--out", blocked], capsys)


def test_invalid_out_path(capsys):
    err = _refused(combined_learning.main, ["--quick", "--out", "bad\0name"], capsys)
    assert "--out" in err and "null" in err


def test_benchmark_out_file(blocked, capsys):
    err = _refused(vs_pfl.main, ["--only", "swarmjax", "--out", f"{blocked}/x.json"], capsys)
    assert "--out" in err and "not writable" in err


# --- data present and complete -------------------------------------------------------------


@pytest.mark.parametrize(
    ("main", "argv"),
    [
        (cross_device.main, ["--quick", *OUT]),
        (dp_fedavg.main, ["--quick", *OUT]),
        (fed_dp_pso.main, ["--quick", "--datasets", "mnist", *OUT]),
        (fed_dp_pso_study.main, ["--quick", "--datasets", "mnist", *OUT]),
        (cross_device_scaling.main, ["--quick"]),
        (vs_pfl.main, ["--only", "swarmjax", *OUT]),
        (scaling.main, ["--quick"]),
    ],
    ids=[
        "cross_device",
        "dp_fedavg",
        "fed_dp_pso",
        "study",
        "bench-scaling",
        "bench-vs_pfl",
        "bench-scaling-devices",
    ],
)
def test_empty_data_folder_says_where_and_how_to_stage(main, argv, tmp_path, capsys):
    empty = str(tmp_path / "empty-data")
    err = _refused(main, _out(argv, tmp_path), capsys)
    assert "not staged" in err and empty in err and "IDX files" in err
    assert "python -m swarmjax.data fetch mnist" in err  # the command that stages it


def test_apdim_and_combined_learning_name_the_missing_files(tmp_path, capsys):
    empty = str(tmp_path / "empty-data")
    err = _refused(apdim.main, ["--quick", "--out", str(tmp_path / "o")], capsys)
    assert "none of the APDIM tables" in err and empty in err and "stage" in err
    assert "python -m swarmjax.data fetch tabular" in err
    argv = ["--datasets", "mnist", "--out", str(tmp_path / "o")]
    err = _refused(combined_learning.main, argv, capsys)
    assert "--datasets" in err and "not staged" in err and empty in err


def test_an_unreadable_dataset_is_one_line(tmp_path, capsys):
    mnist = tmp_path / "empty-data" / "mnist"
    mnist.mkdir()
    for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"):
        for split in (name, name.replace("train", "t10k")):
            (mnist / f"{split}.gz").write_bytes(gzip.compress(b"\x00\x00"))  # truncated
    err = _refused(cross_device.main, ["--quick", "--out", str(tmp_path / "o")], capsys)
    assert "incomplete or unreadable" in err and "'mnist'" in err
    assert "python -m swarmjax.data fetch mnist --force" in err


def test_a_missing_data_folder_from_the_environment(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("SWARMJAX_DATA", "/nonexistent/swarmjax-data")
    err = _refused(cross_device_scaling.main, ["--quick"], capsys)
    assert "$SWARMJAX_DATA" in err and "--data-dir" not in err  # not an option given


# --- derived parameters --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("main", "argv", "named"),
    [
        (dp_fedavg.main, ["--quick", "--clients", "1"], "--clients 5 or more"),
        (dp_fedavg.main, ["--quick", "--clients", "7000"], "lower --clients"),
        (cross_device.main, ["--quick", "--clients", "5"], "--clients 5"),
        (fed_dp_pso_study.main, ["--quick", "--val-rows", "2000"], "--val-rows 2000"),
    ],
    ids=["dp_fedavg-cohort", "dp_fedavg-rows", "cross_device-cohort", "study-rows"],
)
def test_derived_settings_name_the_option_to_change(main, argv, named, tmp_path, capsys):
    err = _refused(main, [*argv, "--out", str(tmp_path / "o")], capsys)
    assert named in err


def test_clients_times_rows_beyond_the_training_set(tmp_path, capsys):
    argv = ["--quick", "--datasets", "digits", "--clients", "200", "--out", str(tmp_path / "o")]
    err = _refused(cross_device.main, argv, capsys)
    assert "--clients 200" in err and "exceed the 1437 training rows" in err


# --- memory against the machine -------------------------------------------------------------


@pytest.mark.parametrize(
    ("main", "argv", "named"),
    [
        (cross_device.main, ["--quick", "--clients", HUGE, "--cohort", HUGE, *OUT], "--cohort"),
        (dp_fedavg.main, ["--quick", "--seeds", MANY_SEEDS, *OUT], "--seeds"),
        (fed_dp_pso.main, ["--quick", "--particles", HUGE, *OUT], "--particles"),
        (paaso.main, ["--quick", "--agents", HUGE, *OUT], "--agents"),
        (paaso.main, ["--quick", "--memory-gb", "1e9", *OUT], "--memory-gb"),
        (pso_throughput.main, ["--swarms", "10", "1000000000000"], "--swarms"),
        (paaso_strategies.main, ["--runs", HUGE, "--iterations", HUGE], "--runs"),
        (cross_device_scaling.main, ["--rows", HUGE], "--rows"),
    ],
    ids=[
        "cross_device",
        "dp_fedavg",
        "fed_dp_pso",
        "paaso",
        "paaso-memory-gb",
        "bench-pso",
        "bench-strategies",
        "bench-scaling",
    ],
)
def test_runs_larger_than_the_machine_are_refused_with_the_estimate(
    main, argv, named, tmp_path, capsys
):
    err = _refused(main, _out(argv, tmp_path), capsys)
    assert named in err and "GiB" in err


def test_paaso_counts_the_runs_of_a_padded_block(monkeypatch, tmp_path, capsys):
    """``--quick --agents 1000000`` ran out of a 24 GiB machine's memory in 50 s (23 GB
    resident): the quick profile's 40 runs a configuration are padded to the sweep's block
    of 128 runs on each of 2 CPU devices, which the estimate took to be 40 runs. Counted by
    the block, the run is refused before JAX starts; 100,000 agents (3.4 GB resident,
    measured) still run."""
    monkeypatch.setattr(_cli, "physical_memory", lambda: 24 * 2**30)
    argv = ["--quick", "--agents", "1000000", "--out", str(tmp_path / "o")]
    err = _refused(paaso.main, argv, capsys)
    assert err.startswith("python -m experiments.paaso: error: --agents: the run would")
    assert "a block of runs of 1000000 agents" in err
    args = paaso.parse_args(["--quick", "--agents", "100000", "--out", str(tmp_path / "o")])
    assert 3.4e9 < paaso.memory_estimate(args) < 0.8 * 24 * 2**30
    paaso.check(args)  # no refusal


def test_dp_fedavg_counts_what_a_seed_holds(monkeypatch, tmp_path, capsys):
    """``--quick --seeds 500`` passed the estimate (4 model-sized arrays a buffer slot: 15
    GiB) and reached 20.5 GB resident in 40 s on a 23.5 GiB machine; counted as measured
    (5: 19 GiB), it is refused before any work on a 20 GiB machine, where 4 let it start."""
    monkeypatch.setattr(_cli, "physical_memory", lambda: 20 * 2**30)
    err = _refused(dp_fedavg.main, ["--quick", "--seeds", "500", "--out", str(tmp_path)], capsys)
    assert "--seeds: the run would allocate about" in err and "500 seed(s)" in err


def test_memory_check_uses_the_physical_memory(monkeypatch):
    monkeypatch.setattr(_cli, "physical_memory", lambda: 10 * 2**30)
    _cli.check_memory(7 * 2**30, "--x", "a test")  # under 80 %
    with pytest.raises(_cli.UserError, match=r"--x: the run would allocate about 9 GiB"):
        _cli.check_memory(9 * 2**30, "--x", "a test")
    assert _cli.array_bytes((2, 3), 4, itemsize=1) == 10


# --- options that do not apply --------------------------------------------------------------


@pytest.mark.parametrize(
    ("main", "argv", "named"),
    [
        (cross_device.main, ["--quick", "--algorithms", "fedavg", "--epsilons", "3"],
         "--epsilons does not apply"),
        (cross_device.main, ["--quick", "--partition", "shards", "--rows-per-client", "9"],
         "--rows-per-client does not apply"),
        (cross_device.main, ["--quick", "--datasets", "digits", "--data-dir", "."],
         "--data-dir does not apply"),
        (fed_dp_pso.main, ["--runtime", "flower", "--seeds", "3"], "--seeds does not apply"),
        (fed_dp_pso.main, ["--runtime", "flower", "--epsilons", "5", "8"],
         "--epsilons: --runtime flower runs one target epsilon"),
        (vs_pfl.main, ["--only", "swarmjax", "--pfl-python", "/bin/sh"],
         "--pfl-python does not apply"),
        (vs_pfl.main, ["--no-dp", "--accountants", "rdp"], "--accountants does not apply"),
        (vs_pfl.main, ["--only", "swarmjax", "--write"], "--write records swarmjax beside pfl"),
        (vs_pfl.main, ["--only", "pfl", "--alternate", "3"], "--alternate does not apply"),
        (vs_pfl.main, ["--pfl-python", "", "--alternate", "3"],
         "--alternate times swarmjax beside pfl"),
        (fed_round.main, ["--tables-only", "--rounds", "3"], "--rounds does not apply"),
    ],
    ids=["xd-epsilon", "xd-rows", "xd-data-dir", "flower-seeds", "flower-eps", "vs_pfl-python",
         "vs_pfl-accountants", "vs_pfl-write", "vs_pfl-alternate-only", "vs_pfl-alternate-pfl",
         "fed_round"],
)  # fmt: skip
def test_options_that_do_not_apply_are_refused(main, argv, named, tmp_path, capsys):
    out = ["--out", str(tmp_path / "o")] if main is not fed_round.main else []
    assert named in _refused(main, [*argv, *out], capsys)


def test_options_that_only_label_records_are_warned_about(tmp_path, capsys):
    argv = ["--quick", "--epsilons", "inf", "--accountant", "rdp", "--out", str(tmp_path)]
    with pytest.raises(AssertionError, match="work started"):  # a warning, then the work
        fed_dp_pso.main(argv)
    err = capsys.readouterr().err
    assert "warning: --accountant does not apply" in err and "--delta" not in err


# --- messages name only the options given ---------------------------------------------------


def test_profile_values_are_not_named_as_given_options(tmp_path, capsys):
    err = _refused(cross_device.main, ["--quick", "--clients", "5", "--out", str(tmp_path)], capsys)
    assert "--cohort 10" not in err and "the cohort of 10 (the profile's" in err
    err = _refused(combined_learning.main, ["--quick", "--datasets", "mnist"], capsys)
    assert "--models" not in err and "--datasets mnist" in err
    argv = ["--datasets", "digits", "--out", str(tmp_path)]  # the default 10,000 client rows
    err = _refused(fed_dp_pso_study.main, argv, capsys)
    assert "--n-train 10000" not in err and "(the profile's; --n-train changes it)" in err


def test_given_tracks_the_command_line_not_the_defaults():
    args = cross_device._parser().parse_args(["--quick", "--cohort", "5", "--delta=0.01"])
    assert _cli.given(args) == {"quick", "cohort", "delta"}
    assert args.out == _cli.RESULTS / "cross_device"  # defaults still filled in


# --- counts and numbers of the benchmarks ---------------------------------------------------


@pytest.mark.parametrize(
    ("main", "argv", "named"),
    [
        (dpsgd_overhead.main, ["--repeats", "0"], "--repeats"),
        (dpsgd_overhead.main, ["--no-write"], "unrecognized"),  # --write is the switch now
        (flower_round.main, ["--rounds", "1"], "--rounds"),
        (flower_round.main, ["--task-poll-interval", "-1"], "--task-poll-interval"),
        (accelerator.main, ["--cpu-devices", "0"], "--cpu-devices"),
        (fed_round.main, ["--rounds", "0"], "--rounds"),
        (pso_throughput.main, ["--swarms", "0"], "--swarms"),
        (paaso_strategies.main, ["--repeats", "0"], "--repeats"),
        (cross_device_scaling.main, ["--block", "0"], "--block"),
        (vs_pfl.main, ["--timing-rounds", "1"], "--timing-rounds"),
        (vs_pfl.main, ["--no-dp", "--dp-only"], "--dp-only"),
        (vs_pfl.main, ["--alternate", "-2"], "--alternate"),
        (secagg.main, ["--bits", "40"], "--bits 40: at most 32"),
        (secagg.main, ["--bits", "4"], "--bits: must be >= 8"),
        (secagg.main, ["--cohort", "30", "--users", "20"], "--cohort 30 must be <= --users 20"),
        (secagg.main, ["--record"], "unrecognized"),  # --write, as every benchmark
        (secagg.main, ["--work", "cifar"], "--work: invalid choice"),
        (secagg.main, ["--users", "1300"], "--users 1300 x 50 rows exceed MNIST's 60,000"),
        (secagg.main, ["--central", "none"], "--central: invalid choice"),
        (secagg.main, ["--seed", "-1"], "--seed: must be >= 0"),
        (secagg.main, ["--seed", "0", "-2"], "--seed: must be >= 0"),
        (secagg.main, ["--hidden", "64"], "--hidden sets the LSTM of --work shakespeare"),
        (secagg.main, ["--work", "shakespeare", "--hidden", "0"], "--hidden: must be >= 1"),
        (secagg.main, ["--min-survivors", "11", "--cohort", "10"], "--min-survivors 11 must be"),
        (scaling.main, ["--devices", "2", "4"], "--devices 2 4: must start at 1"),
        (scaling.main, ["--devices", "1", "0"], "--devices"),
        (scaling.main, ["--per-device", "700"], "exceeds the vs_pfl work's 1200 users"),
        (scaling.main, ["--workloads", "lora"], "--workloads: invalid choice"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_benchmark_numbers(main, argv, named, capsys):
    assert named in _refused(main, argv, capsys)


def test_benchmarks_write_results_only_when_asked(monkeypatch, capsys):
    monkeypatch.setattr(dpsgd_overhead, "benchmark_models", dict)  # nothing to time
    monkeypatch.setattr(dpsgd_overhead, "write_section", _no_work)
    dpsgd_overhead.main(["--quick"])
    out = capsys.readouterr().out
    assert out.startswith(dpsgd_overhead.HEADER.splitlines()[0])  # the table has its header
    assert "--write records it" in out
    written = {}
    monkeypatch.setattr(dpsgd_overhead, "write_section", lambda n, t: written.update({n: t}))
    dpsgd_overhead.main(["--quick", "--write"])
    assert list(written) == ["dpsgd_overhead"]


def test_no_benchmark_has_a_no_write_flag():
    for path in Path(dpsgd_overhead.__file__).parent.glob("*.py"):
        assert "--no-write" not in path.read_text(), path


# --- new mistakes of a first day (issue 50) -------------------------------------------------


@pytest.mark.parametrize(
    ("main", "argv", "named"),
    [
        (cross_device.main, ["--quick", "--out", ""], "--out: is empty"),
        (cross_device.main, ["--quick", "--data-dir", ""], "--data-dir must name a folder"),
        (vs_pfl.main, ["--only", "swarmjax", "--out", ""], "--out is empty"),
    ],
    ids=["out", "data-dir", "bench-out-file"],
)
def test_an_empty_path_is_not_the_current_folder(main, argv, named, tmp_path, capsys, monkeypatch):
    """``--out "$UNSET"`` once wrote results (and a lock) into the current folder."""
    monkeypatch.chdir(tmp_path)
    argv = argv if "--out" in argv else [*argv, "--out", str(tmp_path / "o")]
    assert named in _refused(main, argv, capsys)
    assert not (tmp_path / ".lock").exists()


def test_an_out_or_data_dir_that_is_a_file_is_one_line(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    argv = ["--quick", "--out", str(tmp_path / "file")]
    assert "--out" in (err := _refused(cross_device.main, argv, capsys))
    assert "exists and is not a folder" in err
    argv = ["--quick", "--out", str(tmp_path / "o"), "--data-dir", str(tmp_path / "file")]
    assert "--data-dir" in (err := _refused(cross_device.main, argv, capsys))
    assert "is not a folder" in err


@pytest.mark.parametrize(
    ("main", "argv", "named"),
    [
        (cross_device.main, ["--datasets", "mnsit"], "(did you mean 'mnist'?)"),
        (cross_device.main, ["--algorithms", "DP-FedAvg"], "(did you mean 'dp-fedavg'?)"),
        (fed_dp_pso.main, ["--datasets", "fashion-mnist"], "(did you mean 'fashion_mnist'?)"),
    ],
    ids=["dataset", "algorithm", "fed_dp_pso-dataset"],
)
def test_a_near_miss_choice_names_the_nearest(main, argv, named, tmp_path, capsys):
    err = _refused(main, ["--quick", "--out", str(tmp_path), *argv], capsys)
    assert "invalid choice" in err and named in err


@pytest.mark.parametrize(
    ("main", "argv", "named"),
    [
        (lora.main, ["--quick", "--epsilons", "1e9"], "--epsilons: must be at most 700"),
        (paaso.main, ["--quick", "--coordinator", "10.0.0.1", "--num-processes", "2",
                      "--process-id", "1"], "--coordinator must be HOST:PORT"),
        (paaso.main, ["--quick", "--coordinator", "h:99999", "--num-processes", "2",
                      "--process-id", "1"], "a port in 1..65535"),
        (lora_memory.main, ["--layers-adapted", "zz"], "--layers-adapted: lora layers: no layer"),
        (lora_memory.main, ["--d-model", "8"], "raise --d-model"),
        (cross_device.main, ["--quick", "--batch-size", "64", "--rows-per-client", "50"],
         "--batch-size 64 exceeds --rows-per-client 50: lower --batch-size"),
    ],
    ids=["lora-epsilons", "paaso-coordinator", "paaso-port", "lora_memory-layers",
         "lora_memory-rank", "cross_device-batch"],
)  # fmt: skip
def test_values_refused_in_one_line_naming_the_option(main, argv, named, tmp_path, capsys):
    out = [] if main is lora_memory.main else ["--out", str(tmp_path / "o")]
    assert named in _refused(main, [*argv, *out], capsys)
