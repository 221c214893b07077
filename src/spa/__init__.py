"""spa: train LLM agents with an internal world model (self-play world-model SFT, then RL)."""

__version__ = "0.1.0"
