"""World-model learning: self-play data with ground-truth states, and masked SFT."""
