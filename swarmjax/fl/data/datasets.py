"""Datasets as numpy arrays: MNIST, Fashion-MNIST, MedMNIST 2-D, CIFAR-10, digits, breast cancer.

:func:`load_dataset` returns a :class:`Dataset` with float32 inputs in ``[0, 1]`` (images
NHWC, e.g. ``(n, 28, 28, 1)``; optionally standardised) and int32 labels.

Where files are looked for, in order (each ``<base>`` is ``data_dir``, then
``$SWARMJAX_DATA``; when neither is set, the default data folder
:func:`swarmjax.data.default_data_dir`, where ``python -m swarmjax.data fetch NAME`` stages
MNIST, Fashion-MNIST, PathMNIST and CIFAR-10):

* MNIST / Fashion-MNIST: the four IDX files (``train-images-idx3-ubyte[.gz]``, ...; also
  ``train-images.idx3-ubyte``) in ``<base>/<name>/``, ``<base>/<name>/raw/`` or ``<base>/``
  (``name`` is ``mnist`` or ``fashion_mnist``; the torchvision folders ``MNIST/raw`` and
  ``FashionMNIST/raw`` work too).
* MedMNIST 2-D (``pathmnist``, ``bloodmnist``, ...): ``<base>/medmnist/<name>.npz`` or
  ``<base>/<name>.npz``, the medmnist package's file (keys ``train_images``,
  ``val_images``, ``test_images`` and ``*_labels``), read directly with numpy.
* CIFAR-10: ``<base>/cifar10/cifar10.npz`` (or ``cifar10_subset.npz``) with uint8 NHWC
  ``x_train, y_train, x_test, y_test``; or the official python batches
  ``cifar-10-batches-py/{data_batch_1..5,test_batch}`` under ``<base>/cifar10/`` or
  ``<base>/`` (pickles: only load files you trust).
* ``digits`` and ``breast_cancer`` ship with scikit-learn (stratified train/test split).

If no file is found and ``download`` allows it, MNIST / Fashion-MNIST / CIFAR-10 come from
tensorflow-datasets (extra ``swarmjax[tfds]``) and MedMNIST from the medmnist package
(extra ``swarmjax[medmnist]``, which needs torch); both are imported only then.
"""

from __future__ import annotations

import gzip
import pickle
import struct
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from swarmjax._validation import check_choice, check_int, check_range

__all__ = [
    "DATASETS",
    "MEDMNIST_CLASSES",
    "Dataset",
    "DatasetNotFoundError",
    "load_dataset",
    "read_idx",
    "subsample",
]

# MedMNIST 2-D single-label tasks and their class counts (chestmnist is multi-label: left out).
MEDMNIST_CLASSES = {
    "pathmnist": 9,
    "dermamnist": 7,
    "octmnist": 4,
    "pneumoniamnist": 2,
    "retinamnist": 5,
    "breastmnist": 2,
    "bloodmnist": 8,
    "tissuemnist": 8,
    "organamnist": 11,
    "organcmnist": 11,
    "organsmnist": 11,
}
DATASETS = (
    "mnist",
    "fashion_mnist",
    "cifar10",
    "digits",
    "breast_cancer",
    *MEDMNIST_CLASSES,
)
_IDX_FILES = {
    "x_train": ("train-images-idx3-ubyte", "train-images.idx3-ubyte"),
    "y_train": ("train-labels-idx1-ubyte", "train-labels.idx1-ubyte"),
    "x_test": ("t10k-images-idx3-ubyte", "t10k-images.idx3-ubyte"),
    "y_test": ("t10k-labels-idx1-ubyte", "t10k-labels.idx1-ubyte"),
}
_TORCHVISION = {"mnist": "MNIST", "fashion_mnist": "FashionMNIST"}


class DatasetNotFoundError(FileNotFoundError):
    """A dataset was not found anywhere it was looked for (the message lists where)."""


@dataclass(frozen=True, eq=False)
class Dataset:
    """Train/test arrays of one dataset.

    Attributes:
        name: dataset name as given to :func:`load_dataset`.
        x_train: ``(n, *input_shape)`` float32; y_train: ``(n,)`` int32 in ``[0, C)``.
        x_test, y_test: the same for the test split.
        num_classes: ``C``.
    """

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one example, e.g. ``(28, 28, 1)``."""
        return tuple(self.x_train.shape[1:])

    def __repr__(self) -> str:
        return (
            f"Dataset({self.name!r}, train={self.x_train.shape}, test={self.x_test.shape}, "
            f"num_classes={self.num_classes})"
        )


def read_idx(path: str | Path) -> np.ndarray:
    """Read one IDX file (gzip or raw) of unsigned bytes into a uint8 array of its shape."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        raw = fh.read()
    zero, dtype_code, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype_code != 0x08:
        raise ValueError(f"{path}: not an IDX file of unsigned bytes (magic {raw[:4].hex()})")
    shape = struct.unpack(f">{ndim}I", raw[4 : 4 + 4 * ndim])
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(shape)):
        raise ValueError(f"{path}: header says {shape} but holds {data.size} bytes")
    return data.reshape(shape)


def _bases(data_dir: str | Path | None) -> list[Path]:
    from swarmjax.data import search_folders

    return search_folders(data_dir)


def _find_idx(folder: Path) -> dict[str, Path] | None:
    found = {}
    for key, stems in _IDX_FILES.items():
        hits = [folder / (s + ext) for s in stems for ext in (".gz", "")]
        hit = next((p for p in hits if p.is_file()), None)
        if hit is None:
            return None
        found[key] = hit
    return found


def _load_idx_dataset(name: str, bases: list[Path], looked: list[str]) -> dict | None:
    for base in bases:
        for folder in (base / name, base / name / "raw", base / _TORCHVISION[name] / "raw", base):
            looked.append(f"{folder}/ (train-images-idx3-ubyte[.gz] and the 3 other IDX files)")
            files = _find_idx(folder)
            if files is not None:
                arrays = {k: read_idx(p) for k, p in files.items()}
                arrays["x_train"] = arrays["x_train"][..., None]
                arrays["x_test"] = arrays["x_test"][..., None]
                return arrays
    return None


def _load_medmnist_npz(
    name: str, bases: list[Path], looked: list[str], merge_val: bool
) -> dict | None:
    for base in bases:
        for path in (base / "medmnist" / f"{name}.npz", base / f"{name}.npz"):
            looked.append(str(path))
            if path.is_file():
                return _read_medmnist(path, merge_val)
    return None


def _read_medmnist(path: Path, merge_val: bool) -> dict:
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    missing = {"train_images", "train_labels", "test_images", "test_labels"} - set(arrays)
    if missing:
        raise ValueError(f"{path}: not a MedMNIST npz, missing keys {sorted(missing)}")
    x_train, y_train = arrays["train_images"], arrays["train_labels"]
    if merge_val and "val_images" in arrays:
        x_train = np.concatenate([x_train, arrays["val_images"]])
        y_train = np.concatenate([y_train, arrays["val_labels"]])
    out = {"x_train": x_train, "y_train": y_train, "x_test": arrays["test_images"]}
    out["y_test"] = arrays["test_labels"]
    for split in ("x_train", "x_test"):  # grey-scale sets are (n, H, W): add a channel
        if out[split].ndim == 3:
            out[split] = out[split][..., None]
    return out


def _load_cifar(bases: list[Path], looked: list[str]) -> dict | None:
    for base in bases:
        for path in (base / "cifar10" / "cifar10.npz", base / "cifar10" / "cifar10_subset.npz"):
            looked.append(str(path))
            if path.is_file():
                with np.load(path) as z:
                    return {k: z[k] for k in ("x_train", "y_train", "x_test", "y_test")}
        for folder in (base / "cifar10" / "cifar-10-batches-py", base / "cifar-10-batches-py"):
            looked.append(f"{folder}/ (data_batch_1..5, test_batch)")
            names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
            if all((folder / n).is_file() for n in names):
                batches = [_read_cifar_batch(folder / n) for n in names]
                return {
                    "x_train": np.concatenate([b[0] for b in batches[:5]]),
                    "y_train": np.concatenate([b[1] for b in batches[:5]]),
                    "x_test": batches[5][0],
                    "y_test": batches[5][1],
                }
    return None


def _read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    with open(path, "rb") as fh:
        batch = pickle.load(fh, encoding="bytes")  # the official format; trusted files only
    x = np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return x, np.asarray(batch[b"labels"])


def _load_sklearn(name: str, test_fraction: float, split_seed: int) -> dict:
    from sklearn.datasets import load_breast_cancer, load_digits
    from sklearn.model_selection import train_test_split

    if name == "digits":
        bunch = load_digits()
        x = bunch.images[..., None].astype(np.float64) / 16.0  # pixel values are 0..16
    else:
        bunch = load_breast_cancer()
        x = bunch.data.astype(np.float64)
    x_tr, x_te, y_tr, y_te = train_test_split(
        x, bunch.target, test_size=test_fraction, random_state=split_seed, stratify=bunch.target
    )
    if name == "breast_cancer":  # min-max with the train split's range
        lo, hi = x_tr.min(axis=0), x_tr.max(axis=0)
        scale = np.where(hi > lo, hi - lo, 1.0)
        x_tr = (x_tr - lo) / scale
        x_te = np.clip((x_te - lo) / scale, 0.0, 1.0)
    return {"x_train": x_tr, "y_train": y_tr, "x_test": x_te, "y_test": y_te, "scaled": True}


def _download_tfds(name: str, root: Path | None) -> dict:
    import tensorflow_datasets as tfds  # optional extra swarmjax[tfds]

    tfds_name = {"mnist": "mnist", "fashion_mnist": "fashion_mnist", "cifar10": "cifar10"}[name]
    kw = {"data_dir": str(root / "tfds")} if root is not None else {}
    out = {}
    for split, suffix in (("train", "train"), ("test", "test")):
        x, y = tfds.as_numpy(
            tfds.load(tfds_name, split=split, batch_size=-1, as_supervised=True, **kw)
        )
        out[f"x_{suffix}"], out[f"y_{suffix}"] = x, y
    return out


def _download_medmnist(name: str, root: Path, merge_val: bool) -> dict:
    import medmnist  # optional extra swarmjax[medmnist] (needs torch)

    root.mkdir(parents=True, exist_ok=True)
    cls = getattr(medmnist, medmnist.INFO[name]["python_class"])
    cls(split="train", download=True, root=str(root))  # writes <root>/<name>.npz
    return _read_medmnist(root / f"{name}.npz", merge_val)


def _try_download(
    name: str, bases: list[Path], download: bool | None, merge_val: bool, notes: list[str]
) -> dict | None:
    if download is False:
        notes.append("download=False: no download attempted")
        return None
    medmnist = name in MEDMNIST_CLASSES
    module, extra = ("medmnist", "medmnist") if medmnist else ("tensorflow_datasets", "tfds")
    try:
        __import__(module)
    except ImportError:
        notes.append(
            f"download skipped: the package {module!r} is not installed "
            f"(pip install 'swarmjax[{extra}]')"
        )
        return None
    root = bases[0] if bases else Path("~/.cache/swarmjax").expanduser()
    try:
        if medmnist:
            return _download_medmnist(name, root / "medmnist", merge_val)
        return _download_tfds(name, root)
    except Exception as exc:  # offline machines fail in many ways
        notes.append(f"download through {module} failed: {type(exc).__name__}: {exc}")
        return None


def _not_found(name: str, looked: list[str], notes: list[str]) -> DatasetNotFoundError:
    from swarmjax.data import SOURCES, fetch_command

    places = "\n  ".join(looked) if looked else "(no folder: pass data_dir or set SWARMJAX_DATA)"
    how = {
        "mnist": "put the four IDX files (train-images-idx3-ubyte.gz, ...) in <dir>/mnist/",
        "fashion_mnist": "put the four IDX files in <dir>/fashion_mnist/",
        "cifar10": (
            "put cifar-10-batches-py/ (the official python batches) or cifar10.npz "
            "(x_train, y_train, x_test, y_test, uint8 NHWC) in <dir>/cifar10/"
        ),
    }.get(name, f"put {name}.npz (the medmnist package's file) in <dir>/medmnist/")
    return DatasetNotFoundError(
        f"dataset {name!r} not found. Looked in:\n  {places}\n"
        + "".join(f"{n}\n" for n in notes)
        + (
            f"To fetch it: {fetch_command(name)} (--data-dir <dir> to choose the folder). "
            if name in SOURCES
            else ""
        )
        + f"To provide it: {how}, then pass data_dir=<dir> (--data-dir) or set SWARMJAX_DATA=<dir>."
    )


def load_dataset(
    name: str,
    data_dir: str | Path | None = None,
    *,
    download: bool | None = None,
    standardize: bool = False,
    merge_val: bool = False,
    test_fraction: float = 0.2,
    split_seed: int = 0,
) -> Dataset:
    """Load ``name`` (one of :data:`DATASETS`) as float32 in ``[0, 1]``, int32 labels.

    Args:
        name: dataset name.
        data_dir: first folder to look in; then ``$SWARMJAX_DATA`` (neither given: the
            default data folder of :mod:`swarmjax.data`).
        download: ``None`` tries tensorflow-datasets / medmnist when installed (and reports
            a failure, e.g. offline, in the error); ``False`` never downloads.
        standardize: subtract the train mean and divide by the train std per channel /
            feature (after scaling to ``[0, 1]``).
        merge_val: MedMNIST only: append the validation split to train.
        test_fraction, split_seed: the stratified split of the scikit-learn sets.

    ``"shakespeare"`` (not in :data:`DATASETS`: a federated dataset) returns the pooled
    next-character windows of :func:`~swarmjax.fl.data.shakespeare.load_shakespeare`
    (float32 character ids ``(n, 80)``, 80 classes; the other options do not apply); use
    ``load_shakespeare`` itself for the clients (one per speaking role).

    Raises:
        ValueError: unknown name or bad argument.
        DatasetNotFoundError: no files found (the message lists every place looked and how
            to provide the files).
    """
    if name == "shakespeare":  # a federated dataset; load_shakespeare keeps its clients
        from swarmjax.fl.data.shakespeare import load_shakespeare

        return load_shakespeare(data_dir).as_dataset()
    check_choice("dataset", name, DATASETS)
    check_range("test_fraction", test_fraction, 0.0, 1.0, low_open=True, high_open=True)
    split_seed = check_int("split_seed", split_seed, 0)
    bases = _bases(data_dir)
    looked: list[str] = []
    notes: list[str] = []
    loaders: dict[str, Callable[[], dict | None]] = {
        "mnist": lambda: _load_idx_dataset("mnist", bases, looked),
        "fashion_mnist": lambda: _load_idx_dataset("fashion_mnist", bases, looked),
        "cifar10": lambda: _load_cifar(bases, looked),
        "digits": lambda: _load_sklearn("digits", test_fraction, split_seed),
        "breast_cancer": lambda: _load_sklearn("breast_cancer", test_fraction, split_seed),
    }
    loader = loaders.get(name, lambda: _load_medmnist_npz(name, bases, looked, merge_val))
    arrays = loader()
    if arrays is None:
        arrays = _try_download(name, bases, download, merge_val, notes)
    if arrays is None:
        raise _not_found(name, looked, notes)
    return _finish(name, arrays, standardize)


def _finish(name: str, arrays: dict, standardize: bool) -> Dataset:
    scale = 1.0 if arrays.get("scaled") else 255.0
    x_train = np.asarray(arrays["x_train"], dtype=np.float32) / np.float32(scale)
    x_test = np.asarray(arrays["x_test"], dtype=np.float32) / np.float32(scale)
    y_train = np.asarray(arrays["y_train"]).reshape(-1).astype(np.int32)
    y_test = np.asarray(arrays["y_test"]).reshape(-1).astype(np.int32)
    if standardize:
        axes = tuple(range(x_train.ndim - 1))
        mean = x_train.mean(axis=axes, keepdims=True)
        std = x_train.std(axis=axes, keepdims=True)
        std = np.where(std > 0, std, 1.0).astype(np.float32)
        x_train, x_test = (x_train - mean) / std, (x_test - mean) / std
    default = MEDMNIST_CLASSES.get(name, 2 if name == "breast_cancer" else 10)
    num_classes = max(default, int(y_train.max()) + 1)
    return Dataset(name, x_train, y_train, x_test, y_test, num_classes)


def subsample(
    data: Dataset, n_train: int | None = None, n_test: int | None = None, *, seed: int = 0
) -> Dataset:
    """A random subset (without replacement) of the train and/or test split, for quick runs."""
    rng = np.random.default_rng(seed)

    def take(x: np.ndarray, y: np.ndarray, n: int | None, label: str) -> tuple:
        if n is None:
            return x, y
        n = check_int(label, n, 1)
        if n > y.size:
            raise ValueError(f"{label} must be <= {y.size}; got {n}")
        rows = np.sort(rng.choice(y.size, size=n, replace=False))
        return x[rows], y[rows]

    x_train, y_train = take(data.x_train, data.y_train, n_train, "n_train")
    x_test, y_test = take(data.x_test, data.y_test, n_test, "n_test")
    return replace(data, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
