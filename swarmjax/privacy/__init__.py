"""Privacy machinery: mechanisms, DP-SGD, privacy plans, accounting, the experiment ledger,
audits, APDIM and DP-FTRL's matrix-factorization noise (:mod:`~swarmjax.privacy.ftrl`)."""

from swarmjax.privacy import accounting, audit, canaries, dpsgd, ftrl, ledger, plan, sampling
from swarmjax.privacy.accounting import PrivacyAccountant, epsilon, sigma_for_epsilon
from swarmjax.privacy.audit import empirical_epsilon_lower_bound, membership_inference_advantage
from swarmjax.privacy.canaries import CanaryAudit, CanaryReport, GradientCanaries
from swarmjax.privacy.dpsgd import clipped_grad_sum, dp_grad, dp_step, noise_key
from swarmjax.privacy.ftrl import Participation, build_strategy, cohort_schedule
from swarmjax.privacy.ledger import Ledger
from swarmjax.privacy.mechanisms import (
    gaussian_mechanism,
    gaussian_sigma,
    laplace_mechanism,
    random_dictatorship,
    random_dictatorship_epsilon,
    random_dictatorship_from_uniform,
    random_dictatorship_probs,
    randomized_response,
    randomized_response_epsilon,
    randomized_response_from_uniform,
    vote_counts,
)
from swarmjax.privacy.plan import PrivacyPlan, default_delta
from swarmjax.privacy.sampling import poisson_capacity, poisson_sample, shuffled_batches

__all__ = [
    "CanaryAudit",
    "CanaryReport",
    "GradientCanaries",
    "Ledger",
    "Participation",
    "PrivacyAccountant",
    "PrivacyPlan",
    "accounting",
    "audit",
    "build_strategy",
    "canaries",
    "clipped_grad_sum",
    "cohort_schedule",
    "default_delta",
    "dp_grad",
    "dp_step",
    "dpsgd",
    "empirical_epsilon_lower_bound",
    "epsilon",
    "ftrl",
    "gaussian_mechanism",
    "gaussian_sigma",
    "laplace_mechanism",
    "ledger",
    "membership_inference_advantage",
    "noise_key",
    "plan",
    "poisson_capacity",
    "poisson_sample",
    "random_dictatorship",
    "random_dictatorship_epsilon",
    "random_dictatorship_from_uniform",
    "random_dictatorship_probs",
    "randomized_response",
    "randomized_response_epsilon",
    "randomized_response_from_uniform",
    "sampling",
    "shuffled_batches",
    "sigma_for_epsilon",
    "vote_counts",
]
