"""Evaluation: Pass@k, world-model accuracy, state perplexity."""
