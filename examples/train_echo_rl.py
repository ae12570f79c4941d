"""Train an EchoRL agent: the same flags as `echo-rl train` (EchoRLTrainer does the work).

    # a language-model agent on ALFWorld with the tiny backbone (data: ../shared/data or $ECHO_RL_DATA_DIR)
    python examples/train_echo_rl.py --task alfworld --backbone tiny --timesteps 2000 --num-actors 8 --batch-size 8

    # the vector agent on MiniGrid, logged to TensorBoard, W&B and MLflow (pip install 'echo-rl[tracking]')
    python examples/train_echo_rl.py --task minigrid:MiniGrid-DoorKey-5x5-v0 --timesteps 150000 --num-actors 16 \
        --batch-size 2048 --set ppo_config.learning_rate=5e-4 --set ppo_config.anneal_lr=false --set 'loggers=[tensorboard,wandb,mlflow]'

Leaves a run directory (config, metrics.jsonl, checkpoints, learning curve,
summary); `--resume --run-dir DIR` continues it. Bad input exits 2 with one line.
"""

import sys

from echo_rl.cli import main

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))
