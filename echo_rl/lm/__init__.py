"""Language-model policies: token trajectories with role masks, rollouts and their batches."""
