"""One supplied secret for the tests that compare runs draw for draw (reproducible mode).

Every private run draws its keys from a fresh secret unless it is given one
(:class:`swarmjax.privacy.secret.Secret`); a test that checks that two calls, a resume or a
deployment give the same numbers passes this one to each of them (a Flower run config
names it by ``"secret-file": secret_file()``, so that every process of the deployment and
``simulate_task`` read it).
"""

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

from swarmjax.privacy.secret import Secret

SECRET = Secret.from_bytes(b"swarmjax tests: one fixed secret")
"""A supplied 256-bit secret (public: it is in this file), so only for tests."""

OTHER = Secret.from_bytes(b"swarmjax tests: a second secret!")
"""Another supplied secret, for tests that need two independent ones."""


@functools.cache
def secret_file() -> str:
    """:data:`SECRET` saved (:meth:`Secret.save`, mode 0600) in a folder of this process,
    removed at exit: the ``secret-file`` of a Flower run config."""
    folder = Path(tempfile.mkdtemp(prefix="swarmjax-test-secret-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return str(SECRET.save(folder / "secret.key"))
