"""The Flower app's components (the runtime itself lives in :mod:`swarmjax.fl.runtime.flower`)."""
