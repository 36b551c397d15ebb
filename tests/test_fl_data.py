"""Dataset loading: shared MNIST/Fashion-MNIST, file layouts, MedMNIST, CIFAR-10, errors."""

from __future__ import annotations

import gzip
import pickle
import struct
import sys

import numpy as np
import pytest

from swarmjax.fl.data import DatasetNotFoundError, load_dataset, read_idx, subsample

MNIST_TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]


@pytest.fixture(scope="session")
def mnist(data_dir):
    return load_dataset("mnist", data_dir)


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    monkeypatch.delenv("SWARMJAX_DATA", raising=False)


def test_mnist_from_shared_data(mnist):
    assert mnist.x_train.shape == (60000, 28, 28, 1) and mnist.x_test.shape == (10000, 28, 28, 1)
    assert mnist.x_train.dtype == np.float32 and mnist.y_train.dtype == np.int32
    assert mnist.num_classes == 10 and mnist.input_shape == (28, 28, 1)
    assert 0.0 == mnist.x_train.min() and mnist.x_train.max() == 1.0
    np.testing.assert_array_equal(np.bincount(mnist.y_train), MNIST_TRAIN_COUNTS)


def test_fashion_mnist_from_shared_data_via_env(data_dir, monkeypatch):
    monkeypatch.setenv("SWARMJAX_DATA", str(data_dir))
    data = load_dataset("fashion_mnist", download=False)
    assert data.x_train.shape == (60000, 28, 28, 1) and data.x_test.shape == (10000, 28, 28, 1)
    np.testing.assert_array_equal(np.bincount(data.y_train), [6000] * 10)
    np.testing.assert_array_equal(np.bincount(data.y_test), [1000] * 10)


def _write_idx(path, array, compress):
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    blob = header + array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(blob) if compress else blob)


def _fake_idx_folder(folder, compress=True, n=12):
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    labels = np.arange(n) % 10
    ext = ".gz" if compress else ""
    for stem, arr in (("train-images-idx3-ubyte", images), ("train-labels-idx1-ubyte", labels)):
        _write_idx(folder / (stem + ext), arr, compress)
    for stem, arr in (
        ("t10k-images-idx3-ubyte", images[:4]),
        ("t10k-labels-idx1-ubyte", labels[:4]),
    ):
        _write_idx(folder / (stem + ext), arr, compress)
    return images, labels


@pytest.mark.parametrize(("sub", "compress"), [("mnist", True), ("MNIST/raw", False), ("", True)])
def test_idx_layouts(tmp_path, sub, compress):
    images, labels = _fake_idx_folder(tmp_path / sub if sub else tmp_path / "x", compress)
    base = tmp_path if sub else tmp_path / "x"
    data = load_dataset("mnist", base, download=False)
    np.testing.assert_allclose(data.x_train[..., 0], images / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(data.y_train, labels)
    assert data.x_test.shape == (4, 28, 28, 1)


def test_read_idx_rejects_non_idx(tmp_path):
    path = tmp_path / "bad"
    path.write_bytes(b"\x01\x02\x03\x04" + bytes(8))
    with pytest.raises(ValueError, match="not an IDX"):
        read_idx(path)


def _fake_medmnist(path, shape, num_classes):
    rng = np.random.default_rng(0)
    arrays = {}
    for split, n in (("train", 20), ("val", 5), ("test", 8)):
        arrays[f"{split}_images"] = rng.integers(0, 256, size=(n, *shape), dtype=np.uint8)
        arrays[f"{split}_labels"] = (np.arange(n) % num_classes)[:, None].astype(np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **arrays)
    return arrays


def test_medmnist_npz_read_directly(tmp_path, monkeypatch):
    arrays = _fake_medmnist(tmp_path / "medmnist" / "pathmnist.npz", (28, 28, 3), 9)
    monkeypatch.setenv("SWARMJAX_DATA", str(tmp_path))
    data = load_dataset("pathmnist", download=False)
    assert data.x_train.shape == (20, 28, 28, 3) and data.num_classes == 9
    np.testing.assert_allclose(data.x_test, arrays["test_images"] / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(data.y_test, arrays["test_labels"][:, 0])
    assert load_dataset("pathmnist", tmp_path, merge_val=True).x_train.shape[0] == 25
    _fake_medmnist(tmp_path / "pneumoniamnist.npz", (28, 28), 2)
    grey = load_dataset("pneumoniamnist", tmp_path, download=False)
    assert grey.x_train.shape == (20, 28, 28, 1) and grey.num_classes == 2


def test_cifar10_npz_and_python_batches(tmp_path):
    rng = np.random.default_rng(0)
    npz = {
        "x_train": rng.integers(0, 256, (6, 32, 32, 3), dtype=np.uint8),
        "y_train": np.arange(6),
        "x_test": rng.integers(0, 256, (2, 32, 32, 3), dtype=np.uint8),
        "y_test": np.arange(2),
    }
    (tmp_path / "a" / "cifar10").mkdir(parents=True)
    np.savez(tmp_path / "a" / "cifar10" / "cifar10.npz", **npz)
    data = load_dataset("cifar10", tmp_path / "a", download=False)
    assert data.x_train.shape == (6, 32, 32, 3) and data.num_classes == 10

    folder = tmp_path / "b" / "cifar10" / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    chw = rng.integers(0, 256, (2, 3, 32, 32), dtype=np.uint8)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {b"data": chw.reshape(2, -1), b"labels": [3, 7]}
        (folder / name).write_bytes(pickle.dumps(batch))
    data = load_dataset("cifar10", tmp_path / "b", download=False)
    assert data.x_train.shape == (10, 32, 32, 3) and data.x_test.shape == (2, 32, 32, 3)
    np.testing.assert_allclose(data.x_test[1, :, :, 2], chw[1, 2] / 255.0, rtol=1e-6)


def test_sklearn_sets_need_no_files():
    digits = load_dataset("digits")
    assert digits.x_train.shape[1:] == (8, 8, 1) and digits.num_classes == 10
    assert digits.x_train.shape[0] + digits.x_test.shape[0] == 1797
    assert digits.x_train.min() >= 0 and digits.x_train.max() <= 1
    cancer = load_dataset("breast_cancer")
    assert cancer.x_train.shape[1:] == (30,) and cancer.num_classes == 2
    assert cancer.x_test.min() >= 0 and cancer.x_test.max() <= 1
    std = load_dataset("breast_cancer", standardize=True)
    np.testing.assert_allclose(std.x_train.mean(axis=0), 0, atol=1e-5)
    small = subsample(digits, 100, 50, seed=1)
    assert small.x_train.shape[0] == 100 and small.y_test.shape == (50,)


def test_missing_dataset_error_lists_places_and_how(tmp_path):
    with pytest.raises(DatasetNotFoundError) as info:
        load_dataset("mnist", tmp_path, download=False)
    msg = str(info.value)
    assert str(tmp_path / "mnist") in msg and "SWARMJAX_DATA" in msg and "IDX" in msg
    assert "download=False" in msg


def test_download_branch_reports_missing_optional_packages(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)  # import -> ImportError
    monkeypatch.setitem(sys.modules, "medmnist", None)
    with pytest.raises(DatasetNotFoundError, match=r"pip install 'swarmjax\[tfds\]'"):
        load_dataset("fashion_mnist", tmp_path)
    with pytest.raises(DatasetNotFoundError, match=r"pip install 'swarmjax\[medmnist\]'"):
        load_dataset("pathmnist", tmp_path)


def test_unknown_dataset_and_bad_arguments():
    with pytest.raises(ValueError, match="unknown dataset"):
        load_dataset("imagenet")
    with pytest.raises(ValueError, match="test_fraction"):
        load_dataset("digits", test_fraction=1.5)
