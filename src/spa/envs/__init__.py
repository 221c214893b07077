"""Text environments behind one protocol; ``make(name, **config)`` builds one by name."""

from spa.envs.base import (TextEnv, config_defaults, env_class, env_names, has_solver, lists_actions, make,
                           make_config)
from spa.envs import frozen_lake, sokoban, sudoku  # noqa: F401  (registers the envs)

__all__ = ["TextEnv", "config_defaults", "env_class", "env_names", "has_solver", "lists_actions", "make",
           "make_config"]
