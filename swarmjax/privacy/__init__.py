"""Privacy machinery: mechanisms, DP-SGD, accounting, audits and APDIM."""

from swarmjax.privacy.mechanisms import (
    gaussian_mechanism,
    gaussian_sigma,
    laplace_mechanism,
    random_dictatorship,
    random_dictatorship_epsilon,
    random_dictatorship_probs,
    randomized_response,
    randomized_response_epsilon,
    vote_counts,
)

__all__ = [
    "gaussian_mechanism",
    "gaussian_sigma",
    "laplace_mechanism",
    "random_dictatorship",
    "random_dictatorship_epsilon",
    "random_dictatorship_probs",
    "randomized_response",
    "randomized_response_epsilon",
    "vote_counts",
]
