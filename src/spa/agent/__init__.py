"""The agent side: prompts for each mode and parsing of the model's answers."""
