"""What runs on ONE client: local training (:mod:`.local`), record-level DP for it
(:mod:`.record_dp`: Poisson batches, clipped and noised gradients, calibration) and the
one description of a client's training, :class:`~.training.LocalTraining`."""
