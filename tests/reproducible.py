"""One supplied secret for the tests that compare runs draw for draw (reproducible mode).

Every private run draws its keys from a fresh secret unless it is given one
(:class:`swarmjax.privacy.secret.Secret`); a test that checks that two calls, a resume or a
deployment give the same numbers passes this one to each of them.
"""

from swarmjax.privacy.secret import Secret

SECRET = Secret.from_bytes(b"swarmjax tests: one fixed secret")
"""A supplied 256-bit secret (public: it is in this file), so only for tests."""

OTHER = Secret.from_bytes(b"swarmjax tests: a second secret!")
"""Another supplied secret, for tests that need two independent ones."""
