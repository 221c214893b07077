"""Reinforcement learning: the RL math, the PPO/GRPO trainer and the world-model baselines."""
